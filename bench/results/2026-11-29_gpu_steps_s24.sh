#!/usr/bin/env bash
# Twenty-fourth session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-11-29_gpu_steps_s24.sh STEP...
#   gpustep  tests/gpu/ on one GPU (the tests that need two GPUs skip themselves)
#   warm     the one tests/gpu test that gpustep's time limit cut off (warm workers serve one run
#            after another), alone
#   cnn1     bench/cnn_throughput.py on one GPU, batch 256, SGD and AdamW, 3 interleaved repeats,
#            with the workers' CUDA environment (torchrun script, trainforge eager and graphed,
#            and the classic tutorial loop)
#   start1   bench/startup.py on one GPU, synthetic ResNet-18, 40 graphed steps: cold, warm (on
#            the workers the background started and rehearsed), the torchrun script, 3 repeats
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    gpustep) timeout "${LIMIT:-380}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
               -W always tests/gpu > "$OUT/$step.log" 2>&1 ;;
    warm) timeout "${LIMIT:-200}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short -W always \
            tests/gpu/test_warm_gpu.py::test_warm_workers_serve_one_gpu_run_after_another_over_nccl \
            > "$OUT/$step.log" 2>&1 ;;
    cnn1) timeout "${LIMIT:-240}" python3 bench/cnn_throughput.py --gpus 1 --repeats 3 \
            --steps 300 --min-steps 90 --batches 256 --graph-batches 256 --tutorial-steps 100 \
            --out "$OUT/$step.json" > "$OUT/$step.log" 2>&1 ;;
    start1) start_one_gpu "$step" 480 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
