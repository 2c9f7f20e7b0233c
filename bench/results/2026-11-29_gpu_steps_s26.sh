#!/usr/bin/env bash
# Twenty-sixth session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-11-29_gpu_steps_s26.sh STEP...
#   cudnn     bench/cudnn_first_step.py: cuDNN's autotuning on and off, fresh processes in
#             turning order; first step, steps 2-5, eager steady state
#   coldprof  one cold command of the synthetic ResNet-18 recipe on GPU 0 (40 graphed steps, -v,
#             each line timestamped from the shell), under `py-spy record --subprocesses`
#             (raw stacks in $OUT/coldprof/cold.raw); then the same without the profiler
#   coldnew   after the connection thread: one cold command in a new folder (a new MLflow store),
#             then another cold one in the same folder (its store exists), -v, timestamped
#   gputest   the GPU tests of MLflow tracking, warm workers and one-GPU SBI
#   startc    bench/startup.py on GPU 0, synthetic ResNet-18, 40 graphed steps: the session's
#             starting package (.base26: 02dfa0f's runtime as `trainforge`, its recipes and
#             deploy) cold, then this checkout cold; REPEATS rounds (default 3)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
# a cold command in a new folder, each output line with its seconds since the start
cold_command() {  # cold_command FOLDER LOG [PREFIX...]
  local folder=$1 log=$2 name; shift 2
  name=$(basename "$log" .log)  # the run's name: a second command in the folder trains anew
  mkdir -p "$folder" && (
    cd "$folder" || exit 1
    export TRAINFORGE_HOME=$folder/home CUDA_VISIBLE_DEVICES=0
    python3 -m trainforge cluster stop > /dev/null 2>&1
    "$@" python3 -m trainforge train -v "$OLDPWD/recipes/cnn/synthetic_resnet18_bench.yaml" \
      train.max_steps=40 run.name="$name" 2>&1 | python3 -u -c 'import sys, time
t = time.perf_counter()
for line in sys.stdin: print(f"{time.perf_counter() - t:7.2f} {line.rstrip()}")'
    python3 -c "from trainforge.driver import own_workers; own_workers.wait_for_background(240)"
    python3 -m trainforge cluster stop
  ) > "$log" 2>&1
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    cudnn) CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-200}" python3 bench/cudnn_first_step.py --repeats 3 \
             --out "$OUT/cudnn.json" > "$OUT/cudnn.log" 2>&1 ;;
    coldprof) mkdir -p "$OUT/coldprof"
              timeout 150 bash -c "$(declare -f cold_command); cold_command /tmp/cp1 \
                $OUT/coldprof/profiled.log py-spy record --subprocesses -r 100 -f raw \
                -o $OUT/coldprof/cold.raw --"
              timeout 120 bash -c "$(declare -f cold_command); cold_command /tmp/cp2 \
                $OUT/coldprof/plain.log" ;;
    coldnew) mkdir -p "$OUT/coldnew"
             timeout 120 bash -c "$(declare -f cold_command); cold_command /tmp/cn \
               $OUT/coldnew/new_store.log"
             timeout 120 bash -c "$(declare -f cold_command); cold_command /tmp/cn \
               $OUT/coldnew/existing_store.log" ;;
    gputest) timeout "${LIMIT:-300}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
               -W always tests/gpu/test_gpu_tracking.py tests/gpu/test_warm_gpu.py \
               tests/gpu/test_sbi_gpu.py::test_sbi_recipe_on_one_gpu_with_cuda_graphs \
               > "$OUT/$step.log" 2>&1 ;;
    startc) CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-400}" python3 bench/startup.py \
              --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" --baseline .base26 \
              --modes baseline_cold,cold --timeout-s 150 --out "$OUT/$step.json" \
              train.max_steps=40 > "$OUT/$step.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
