#!/usr/bin/env bash
# Eighteenth session's device steps (run from the repo root on the lent machine):
#   bash bench/results/2026-11-28_gpu_steps_s18.sh STEP...
#   warmtest  tests/gpu/test_warm_gpu.py: warm workers serving one GPU run after another
#   start1gc  bench/startup.py, synthetic ResNet-18 on 1 GPU, cold and warm, against the
#             package before the warm workers froze their survivors (.base18: commit 3ee2e46's
#             runtime/ as `trainforge`, with its recipes), interleaved
#   ddpopts   bench/ddp_scaling_options.py (graphed SGD, batch 256, the shipped configuration):
#             one GPU, then 4 GPUs with one 100 MB bucket and static_graph beside the default,
#             then the default under NCCL_ALGO=Tree, NCCL_PROTO=Simple and
#             CUDA_DEVICE_MAX_CONNECTIONS=1 (one launch each)
#   ddpmc1    the next call on the same host: one GPU and 4 GPUs, each with and without
#             CUDA_DEVICE_MAX_CONNECTIONS=1, and buckets of 10 and 50 MB and static_graph under it
#   cnnmc1    bench/cnn_throughput.py (torchrun script, trainforge eager and graphed; SGD, batch
#             256, 1 and 4 GPUs), once as shipped and once with CUDA_DEVICE_MAX_CONNECTIONS=1
#   sim1core  bench/sim_scaling.py at one core with ~10 s of work a point (the sixteenth
#             session's 3 s, so the stage's fixed cost weighs a third as much), five repeats
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    warmtest) timeout 200 python3 -m pytest -m gpu tests/gpu/test_warm_gpu.py -x -v -s \
           -p no:cacheprovider > "$OUT/$step.log" 2>&1 ;;
    start1gc) timeout "${LIMIT:-330}" python3 bench/startup.py --recipe cnn/synthetic_resnet18_bench \
           --repeats "${REPEATS:-2}" --modes baseline_cold,baseline_warm,cold,warm \
           --baseline "$PWD/.base18" --out "$OUT/$step.json" train.max_steps=40 \
           scaling.use_all_gpus=false scaling.num_workers=1 > "$OUT/$step.log" 2>&1 ;;
    ddpopts) opts "$step" one_gpu 1 bucket25
           opts "$step" four 4 bucket25 bucket100 static
           NCCL_ALGO=Tree opts "$step" tree 4 bucket25
           NCCL_PROTO=Simple opts "$step" simple 4 bucket25
           CUDA_DEVICE_MAX_CONNECTIONS=1 opts "$step" maxconn1 4 bucket25 ;;
    ddpmc1) CUDA_DEVICE_MAX_CONNECTIONS=1 opts "$step" one_mc1 1 bucket25
           opts "$step" one_default 1 bucket25
           CUDA_DEVICE_MAX_CONNECTIONS=1 opts "$step" four_mc1 4 bucket25 bucket10 bucket50 static
           opts "$step" four_default 4 bucket25 ;;
    cnnmc1) mkdir -p "$OUT/$step"
           for setting in default mc1; do
             connections=""; [ $setting = mc1 ] && connections=1
             env ${connections:+CUDA_DEVICE_MAX_CONNECTIONS=$connections} \
               timeout 280 python3 bench/cnn_throughput.py --optimizers sgd --batches 256 \
               --gpus 1 4 --repeats 2 --tutorial-steps 0 --out "$OUT/$step/$setting.json" \
               >> "$OUT/$step/$step.log" 2>&1
             echo "$setting rc=$?" >> "$OUT/$step/$step.log"
           done ;;
    sim1core) mkdir -p "$OUT/$step"
           timeout 500 python3 bench/sim_scaling.py --cores 1 --seconds 10 --repeats 5 \
             --budget-s 480 --out "$OUT/$step/sim_scaling.json" > "$OUT/$step/sim_scaling.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
