#!/usr/bin/env bash
# Eleventh session's device steps (issues 12 and 15), named on the command line, run in order on
# one warm host; each step's output goes to $OUT/<step>.{log,json}:
#   race      bench/sbi_race_command.py --device cuda: the whole command against sbi's train(),
#             on the host's first GPU alone
#   acc       bench/sbi_accuracy.py: the 10^6 row (recipes/sbi/npe_1e6.yaml, zuko NSF, CUDA
#             graphs) on all five tasks, and gaussian_linear and bernoulli_glm at 10^5, on the
#             host's GPUs; posteriors kept under $OUT/posteriors for scoring
#   probe6    four 10^6 runs at once (npe_1e6.yaml; two_moons, gaussian_mixture, slcp,
#             gaussian_linear), one GPU each through the lasting cluster's warm workers, each
#             cut at 360 s: their logs (capture, step time, epochs) and posteriors or last
#             checkpoints under $OUT/probe6 (the host lends this command 4 CPUs: `acc`'s seven
#             runs did not end within 540 s there)
#   plateau6  as probe6, with train.schedule=plateau (plateau_patience 5), on two_moons,
#             gaussian_mixture, slcp and bernoulli_glm (not yet run: for the next session)
#   start1sbi bench/startup.py, the SBI race recipe on 1 GPU: cold, warm
#   start1cnn bench/startup.py, synthetic ResNet-18 on 1 GPU: cold, warm
#   warmtest  tests/gpu/test_warm_gpu.py
# Carried: .device on the first call (the bundle, unpacked into /tmp/site, kept while the host
# stays warm); .sbibm on the `acc` call (sbibm 1.1.0's files for the five tasks, unpacked from
# its wheel: the bundle and the wheel together pass the 64 MiB a call may carry).
set -u
if [ -f .device/setup.sh ]; then
  # shellcheck source=/dev/null
  source .device/setup.sh
else
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
mkdir -p /tmp/tf && ln -sfn "$PWD/runtime" /tmp/tf/trainforge
export PYTHONPATH="$PYTHONPATH:/tmp/tf:$PWD"
export RAY_DEDUP_LOGS=0 MLFLOW_DISABLE_TELEMETRY=true OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
[ -f "$OUT/host.txt" ] || { nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo
  python3 -c "import torch; print(torch.__version__)"; } > "$OUT/host.txt" 2>&1
SBIBM=(--sbibm-path "$PWD/.sbibm")
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    race) CUDA_VISIBLE_DEVICES=0 timeout 580 python3 bench/sbi_race_command.py --device cuda \
           --simulations 20000 --variants b512_lr1e-3 --out "$OUT/$step.json" \
           > "$OUT/$step.log" 2>&1 ;;
    acc) timeout 585 python3 bench/sbi_accuracy.py "${SBIBM[@]}" --deadline-s 540 \
           --runs two_moons/1e6 gaussian_linear/1e6 gaussian_mixture/1e6 slcp/1e6 \
           bernoulli_glm/1e6 gaussian_linear/1e5 bernoulli_glm/1e5 --concurrent-runs 7 \
           --gpu-share 0.5 --c2st-workers 40 --keep-posteriors "$OUT/posteriors" \
           --out "$OUT/$step.json" > "$OUT/$step.log" 2>&1 ;;
    probe6|plateau6)
           tasks=(two_moons gaussian_mixture slcp gaussian_linear) extra=()
           if [ "$step" = plateau6 ]; then
             tasks=(two_moons gaussian_mixture slcp bernoulli_glm)
             extra=(train.schedule=plateau train.plateau_patience=5)
           fi
           W=/tmp/$step && rm -rf "$W" && mkdir -p "$OUT/$step" && python3 -m trainforge cluster start
           for task in "${tasks[@]}"; do
             timeout 360 python3 -m trainforge train recipes/sbi/npe_1e6.yaml workload.task="$task" \
               run.storage_path="$W/runs" tracking.enabled=false workload.evaluation.c2st=false \
               workload.evaluation.observations=[] workload.evaluation.observations_from=own \
               "${extra[@]}" > "$OUT/$step/$task.log" 2>&1 &
             sleep 2
           done
           wait
           # the posteriors and logs in one file: the device returns a limited number of files
           for run in "$W"/runs/*_npe_1e6; do
             task=$(basename "$run" _npe_1e6)
             [ -f "$run/posterior.pt" ] && cp "$run/posterior.pt" "$W/${task}_1e6.pt"
           done
           (cd "$W" && tar -cf "$OUT/$step/posteriors.tar" ./*_1e6.pt) ;;
    start1sbi) timeout 300 python3 bench/startup.py --recipe sbi/two_moons_parity --repeats 2 \
           --modes cold,warm --out "$OUT/$step.json" train.max_steps=40 \
           workload.simulation.num_simulations=20000 workload.evaluation.observations=[] \
           workload.evaluation.observations_from=own scaling.use_gpu=true \
           > "$OUT/$step.log" 2>&1 ;;
    start1cnn) timeout 300 python3 bench/startup.py --recipe cnn/synthetic_resnet18_bench \
           --repeats 2 --modes cold,warm --out "$OUT/$step.json" train.max_steps=40 \
           scaling.use_all_gpus=false scaling.num_workers=1 > "$OUT/$step.log" 2>&1 ;;
    warmtest) timeout 240 python3 -m pytest -m gpu tests/gpu/test_warm_gpu.py -x -v -s \
           -p no:cacheprovider > "$OUT/$step.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "== $step rc=$? $(( $(date +%s) - t0 )) s"
  tail -4 "$OUT/$step.log" | cut -c1-1200
done
