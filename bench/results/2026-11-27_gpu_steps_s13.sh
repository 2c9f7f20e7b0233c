#!/usr/bin/env bash
# Thirteenth session's device steps (issues 15 and 12), named on the command line, run in order
# on one warm host; each step's output goes to $OUT/<step>.{log,json} or $OUT/<step>/:
#   slcp7     four slcp runs at 10^6 at once, one GPU each, larger flows than npe_1e6.yaml's
#             (hidden 256), towards C2ST <= 0.55 (0.569 as committed); step caps keep each
#             under the device's 10 minutes: plateau at batch 2,048; plateau at batch 4,096 and
#             lr 2e-3; the same with 8 transforms; a cosine schedule over a fixed 75,000 steps
#   coldsbi   bench/startup.py, the SBI race recipe on 1 GPU, cold with a new simulation cache
#             per command (--fresh-data): the prestarted workers (4fdc492)
#   simscale  bench/sim_scaling.py with three repeats (REPEATS), 4 s points
#             (SECONDS_PER_POINT) and the plain processes, on nvidia-h100-x1 (16 usable CPUs);
#             CORES=4,8 for the points a 10-minute call cannot also fit
# Posteriors are scored on the CPU: bench/sbi_accuracy.py --score <dir> --sbibm-path <wheel>.
# Carried: .device on the first call (the bundle, unpacked into /tmp/site, kept while the host
# stays warm).
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
# the CPUs this command may run on (not `nproc`: it honours OMP_NUM_THREADS)
[ -f "$OUT/host.txt" ] || { nvidia-smi -L
  python3 -c "import os; print(len(os.sched_getaffinity(0)), 'usable CPUs')"
  grep -m1 "model name" /proc/cpuinfo
  python3 -c "import torch; print(torch.__version__)"; } > "$OUT/host.txt" 2>&1
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    slcp7) H="workload.estimator.hidden_features=256"
           B="train.batch_size=4096 train.lr=2e-3"
           runs=("slcp|npe_1e6|$H train.max_steps=95000 run.name=slcp_h256|h256"
                 "slcp|npe_1e6|$H $B train.max_steps=80000 run.name=slcp_h256_b4096|h256_b4096"
                 "slcp|npe_1e6|$H $B workload.estimator.num_transforms=8 train.max_steps=55000 run.name=slcp_h256_b4096_t8|h256_b4096_t8"
                 "slcp|npe_1e6|$H $B train.schedule=cosine train.max_steps=75000 train.early_stopping_patience=0 run.name=slcp_h256_b4096_cos|h256_b4096_cos")
           W=/tmp/$step && rm -rf "$W" && mkdir -p "$OUT/$step" && python3 -m trainforge cluster start
           for spec in "${runs[@]}"; do
             IFS='|' read -r task recipe overrides label <<< "$spec"
             # shellcheck disable=SC2086  # the overrides are words
             timeout 530 python3 -m trainforge train "recipes/sbi/$recipe.yaml" workload.task="$task" \
               run.storage_path="$W/runs" tracking.enabled=false workload.evaluation.c2st=false \
               workload.evaluation.observations=[] workload.evaluation.observations_from=own \
               $overrides > "$OUT/$step/${task}_$recipe${label:+_$label}.log" 2>&1 &
             sleep 2
           done
           wait
           # the posteriors in one file: the device returns a limited number of files
           for run in "$W"/runs/*; do
             [ -f "$run/posterior.pt" ] && cp "$run/posterior.pt" "$W/$(basename "$run").pt"
           done
           (cd "$W" && tar -cf "$OUT/$step/posteriors.tar" ./*.pt) ;;
    coldsbi) timeout 560 python3 bench/startup.py --recipe sbi/two_moons_parity --repeats 3 \
           --modes cold --fresh-data --out "$OUT/$step.json" train.max_steps=40 \
           workload.simulation.num_simulations=20000 workload.evaluation.observations=[] \
           workload.evaluation.observations_from=own scaling.use_gpu=true \
           > "$OUT/$step.log" 2>&1 ;;
    simscale) # shellcheck disable=SC2086  # CORES: an optional --cores list
           timeout 580 python3 bench/sim_scaling.py --out "$OUT/$step.json" --budget-s 540 \
           --seconds "${SECONDS_PER_POINT:-4}" --repeats "${REPEATS:-3}" ${CORES:+--cores $CORES} \
           > "$OUT/$step.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "== $step rc=$? $(( $(date +%s) - t0 )) s"
  if [ -d "$OUT/$step" ]; then tail -n 3 "$OUT/$step"/*.log; else tail -4 "$OUT/$step.log"; fi | cut -c1-600
done
