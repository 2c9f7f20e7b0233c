#!/usr/bin/env bash
# Twenty-fifth session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-11-29_gpu_steps_s25.sh STEP...
#   startw  bench/startup.py on one GPU, synthetic ResNet-18, 40 graphed steps: the session's
#           starting package (.base25: d765463's runtime as `trainforge`, its recipes and deploy)
#           cold, then warm three times; this checkout the same; REPEATS rounds (default 2)
#   startw2 startw again once bench/startup.py gave each repeated mode its own run name (the
#           first call's second and third warm commands resumed the finished run of the first),
#           and a resume (the warm command just before it again: a user re-running a finished
#           run) after each package's warm commands
#   imp     where a warm command's driver spends its time before Ray: Python's own start, the
#           imports of a warm command (-X importtime) after a cold one started the cluster
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
# bench/startup.py on GPU 0, the synthetic ResNet-18 recipe, 40 graphed steps, both packages
startw_run() {  # startw_run STEP DEFAULT_LIMIT_S MODES (LIMIT and REPEATS override)
  CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-$2}" python3 bench/startup.py \
    --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-2}" --baseline .base25 \
    --modes "$3" --timeout-s 150 --out "$OUT/$1.json" train.max_steps=40 > "$OUT/$1.log" 2>&1
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    startw) startw_run "$step" 500 \
              baseline_cold,baseline_warm,baseline_warm,baseline_warm,cold,warm,warm,warm ;;
    startw2) startw_run "$step" 540 \
               baseline_cold,baseline_warm,baseline_warm,baseline_warm,baseline_resume,cold,warm,warm,warm,resume ;;
    imp) mkdir -p "$OUT/imp" /tmp/imp && (
           cd /tmp/imp || exit 1
           export TRAINFORGE_HOME=/tmp/imp/home CUDA_VISIBLE_DEVICES=0
           recipe="$OLDPWD/recipes/cnn/synthetic_resnet18_bench.yaml"
           python3 -c 'import subprocess, sys, time
for args in (["-c", "pass"], ["-S", "-c", "pass"], ["-c", "import trainforge.cli"]) * 3:
    t = time.perf_counter(); subprocess.run([sys.executable, *args])
    print(*args, f"{time.perf_counter() - t:.3f} s")'
           timeout 200 python3 -m trainforge train "$recipe" run.name=cold train.max_steps=40
           python3 -c "from trainforge.driver import own_workers; own_workers.wait_for_background(240)"
           for i in 1 2; do
             timeout 100 python3 -X importtime -m trainforge train "$recipe" run.name="warm$i" \
               train.max_steps=40 2> "$OUT/imp/importtime$i.txt"
           done
           python3 -m trainforge cluster stop
         ) > "$OUT/imp/imp.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
