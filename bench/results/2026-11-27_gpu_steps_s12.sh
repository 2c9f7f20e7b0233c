#!/usr/bin/env bash
# Twelfth session's device steps (issues 12 and 15), named on the command line, run in order on
# one warm host; each step's output goes to $OUT/<step>.{log,json} or $OUT/<step>/:
#   plateau6  four 10^6 runs at once (recipes/sbi/npe_1e6.yaml with train.schedule=plateau,
#             plateau_patience 5): two_moons, gaussian_mixture, slcp, bernoulli_glm, one GPU each
#             through the lasting cluster's warm workers, each cut at 500 s; logs and posteriors
#   mix       four runs at once, one GPU each: bernoulli_glm at 10^5 (npe_1e5.yaml as committed),
#             gaussian_linear at 10^6 with plateau, two_moons and gaussian_mixture at 10^6 with a
#             cosine schedule over 60 epochs (no early stopping, best weights restored)
#   start1sbi bench/startup.py, the SBI race recipe on 1 GPU: cold, warm
#   slcp6     (for the next session) four slcp runs at 10^6 with the plateau recipe, larger flows
#             than npe_1e6.yaml's (hidden 256; 8 transforms; 16 bins and hidden 256; batch 4,096
#             at lr 2e-3), towards C2ST <= 0.55 (0.569 with the recipe as committed)
#   coldsbi   (for the next session) bench/startup.py, the SBI race recipe on 1 GPU, cold with a
#             new simulation cache per command (--fresh-data): the prestarted workers (4fdc492)
#   simscale  (for the next session, on a host that lends >= 16 cores) bench/sim_scaling.py
#   evaltest  the GPU tests of the evaluation on the training device (9ec4805: SBC sampled there)
#   warmtest  tests/gpu/test_warm_gpu.py (its third command: one worker, no NCCL communicator)
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
[ -f "$OUT/host.txt" ] || { nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo
  python3 -c "import torch; print(torch.__version__)"; } > "$OUT/host.txt" 2>&1
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    plateau6|mix|slcp6)
           if [ "$step" = slcp6 ]; then
             runs=("slcp|npe_1e6|workload.estimator.hidden_features=256 run.name=slcp_h256|h256"
                   "slcp|npe_1e6|workload.estimator.num_transforms=8 run.name=slcp_t8|t8"
                   "slcp|npe_1e6|workload.estimator.num_bins=16 workload.estimator.hidden_features=256 run.name=slcp_b16|b16"
                   "slcp|npe_1e6|train.batch_size=4096 train.lr=2e-3 run.name=slcp_b4096|b4096")
           elif [ "$step" = plateau6 ]; then
             P="train.schedule=plateau train.plateau_patience=5"
             runs=("two_moons|npe_1e6|$P" "gaussian_mixture|npe_1e6|$P" "slcp|npe_1e6|$P"
                   "bernoulli_glm|npe_1e6|$P")
           else
             C="train.schedule=cosine train.epochs=60 train.early_stopping_patience=0"
             runs=("bernoulli_glm|npe_1e5|" "gaussian_linear|npe_1e6|train.schedule=plateau train.plateau_patience=5"
                   "two_moons|npe_1e6|$C" "gaussian_mixture|npe_1e6|$C")
           fi
           W=/tmp/$step && rm -rf "$W" && mkdir -p "$OUT/$step" && python3 -m trainforge cluster start
           for spec in "${runs[@]}"; do
             IFS='|' read -r task recipe overrides label <<< "$spec"
             # shellcheck disable=SC2086  # the overrides are words
             timeout 500 python3 -m trainforge train "recipes/sbi/$recipe.yaml" workload.task="$task" \
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
    start1sbi) timeout 300 python3 bench/startup.py --recipe sbi/two_moons_parity --repeats "${REPEATS:-2}" \
           --modes cold,warm --out "$OUT/$step.json" train.max_steps=40 \
           workload.simulation.num_simulations=20000 workload.evaluation.observations=[] \
           workload.evaluation.observations_from=own scaling.use_gpu=true \
           > "$OUT/$step.log" 2>&1 ;;
    coldsbi) timeout 560 python3 bench/startup.py --recipe sbi/two_moons_parity --repeats 3 \
           --modes cold --fresh-data --out "$OUT/$step.json" train.max_steps=40 \
           workload.simulation.num_simulations=20000 workload.evaluation.observations=[] \
           workload.evaluation.observations_from=own scaling.use_gpu=true \
           > "$OUT/$step.log" 2>&1 ;;
    simscale) timeout 580 python3 bench/sim_scaling.py --out "$OUT/$step.json" --budget-s 540 \
           --seconds 5 > "$OUT/$step.log" 2>&1 ;;
    evaltest) timeout 200 python3 -m pytest -m gpu tests/gpu/test_sbi_gpu.py -v -s -p no:cacheprovider \
           -k "evaluation_samples_the_posterior or one_gpu_with_cuda_graphs" > "$OUT/$step.log" 2>&1 ;;
    warmtest) timeout 240 python3 -m pytest -m gpu tests/gpu/test_warm_gpu.py -x -v -s \
           -p no:cacheprovider > "$OUT/$step.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "== $step rc=$? $(( $(date +%s) - t0 )) s"
  if [ -d "$OUT/$step" ]; then tail -n 3 "$OUT/$step"/*.log; else tail -4 "$OUT/$step.log"; fi | cut -c1-600
done
