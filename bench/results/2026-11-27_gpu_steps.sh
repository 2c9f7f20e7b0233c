#!/usr/bin/env bash
# Tenth session's device steps (issues 12 and 13), named on the command line, run in order on one
# warm host; each step's output goes to $OUT/<step>.{log,json}:
#   warmtest  tests/gpu/test_warm_gpu.py: warm workers on GPUs, started then warm, over NCCL
#   steptest  tests/gpu/test_gpu_step.py: the graphed CNN step equals the eager one (SGD, AdamW)
#   start1    bench/startup.py, synthetic ResNet-18 recipe on 1 GPU: cold, warm, torchrun anchor
#   start4    the same on 4 GPUs
#   cnn       bench/cnn_throughput.py: SGD at batch 256 on 1 and 4 GPUs, 2 interleaved repeats
#   race      bench/sbi_race_command.py --device cuda: the whole command against sbi's train()
set -u
# shellcheck source=/dev/null
source .device/setup.sh
mkdir -p /tmp/tf && ln -sfn "$PWD/runtime" /tmp/tf/trainforge
export PYTHONPATH="$PYTHONPATH:/tmp/tf:$PWD"
export RAY_DEDUP_LOGS=0 MLFLOW_DISABLE_TELEMETRY=true OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
[ -f "$OUT/host.txt" ] || { nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo
  python3 -c "import torch; print(torch.__version__)"; } > "$OUT/host.txt" 2>&1
# shellcheck disable=SC2054  # "cold,warm" is one argument
RESNET=(--recipe cnn/synthetic_resnet18_bench --repeats 2 --modes cold,warm
        --torchrun bench/startup_torchrun_resnet.py)
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    warmtest) timeout 240 python3 -m pytest -m gpu tests/gpu/test_warm_gpu.py -x -v -s \
           -p no:cacheprovider > "$OUT/$step.log" 2>&1 ;;
    steptest) timeout 200 python3 -m pytest -m gpu tests/gpu/test_gpu_step.py -v \
           -p no:cacheprovider > "$OUT/$step.log" 2>&1 ;;
    start1) timeout 300 python3 bench/startup.py "${RESNET[@]}" --torchrun-procs 1 \
           --out "$OUT/$step.json" train.max_steps=40 scaling.use_all_gpus=false \
           scaling.num_workers=1 > "$OUT/$step.log" 2>&1 ;;
    start4) timeout 300 python3 bench/startup.py "${RESNET[@]}" --torchrun-procs 4 \
           --out "$OUT/$step.json" train.max_steps=40 > "$OUT/$step.log" 2>&1 ;;
    cnn) timeout 190 python3 bench/cnn_throughput.py --optimizers sgd --batches 256 --gpus 1 4 \
           --repeats 2 --tutorial-steps 0 --out "$OUT/$step.json" > "$OUT/$step.log" 2>&1 ;;
    race) timeout 400 python3 bench/sbi_race_command.py --device cuda --simulations 20000 \
           --variants b512_lr1e-3 --out "$OUT/$step.json" > "$OUT/$step.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "== $step rc=$? $(( $(date +%s) - t0 )) s"
  tail -4 "$OUT/$step.log" | cut -c1-1200
done
# probe (run alone, after `race` ran out of time: sbi's train() took over 380 s on this host):
#   python3 bench/sbi_race_command.py --device cuda --simulations 20000 --variants b512_lr1e-3 \
#     --target -3.1377 --out "$OUT/probe.json"   (-3.1377: sbi's best on the H200 run 3 split)
