#!/usr/bin/env bash
# Twentieth session's device steps (run from the repo root on the lent machine):
#   bash bench/results/2026-11-28_gpu_steps_s20.sh STEP...
#   own1     bench/startup.py, synthetic ResNet-18 on one GPU (CUDA_VISIBLE_DEVICES=0), 40 steps:
#            cold (no cluster: the command's own worker processes, the cluster and its warm
#            workers started in the background after it), warm (the next command, on what the
#            background started), cold_ray (TRAINFORGE_COLD_WORKERS=ray: the cluster started
#            first, as before), interleaved, three repeats
#   warmgpu  tests/gpu/test_warm_gpu.py on the host's GPUs (two at most): the first command on
#            its own processes over NCCL, the next two on the warm workers started after it
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    own1) CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-560}" python3 bench/startup.py \
           --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" \
           --modes cold,warm,cold_ray --out "$OUT/$step.json" train.max_steps=40 \
           scaling.use_all_gpus=false scaling.num_workers=1 > "$OUT/$step.log" 2>&1 ;;
    warmgpu) timeout "${LIMIT:-500}" python3 -m pytest -p no:cacheprovider -x -q \
           tests/gpu/test_warm_gpu.py > "$OUT/$step.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
