#!/usr/bin/env bash
# Sixty-second session's device steps (run from the repo root on the lent machine, one GPU):
#   bash bench/results/2026-12-06_gpu_steps_s62.sh STEP...
#   start     bench/startup.py on GPU 0, synthetic ResNet-18, 40 graphed steps: Ray Train's
#             worker group on a cluster joined by address (`address`), this checkout (its workers
#             import the run's modules from their start) against .base (the tree before that),
#             the cold command, and the hand-written torchrun script; REPEATS (default 3)
#             interleaved rounds
#   timeline  bench/start_timeline.py: where the cold and address commands' processes spend
#             their seconds before the first step (py-spy from the bundle's wheel)
#   tests     every GPU test (tests/gpu), on this checkout
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    start)
      CUDA_VISIBLE_DEVICES=0 timeout -s INT "${LIMIT:-540}" python3 bench/startup.py \
        --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" --warmup \
        --baseline "$PWD/.base" --modes address,baseline_address,cold \
        --torchrun bench/startup_torchrun_resnet.py --torchrun-procs 1 --timeout-s 150 \
        --out "$OUT/start.json" train.max_steps=40 > "$OUT/start.log" 2>&1 ;;
    timeline)
      python3 -m pip install -q --target /tmp/pyspy .device/py_spy-*.whl > /dev/null 2>&1
      PATH=/tmp/pyspy/bin:$PATH CUDA_VISIBLE_DEVICES=0 timeout -s INT "${LIMIT:-300}" python3 \
        bench/start_timeline.py --recipe cnn/synthetic_resnet18_bench --modes cold,address \
        --out "$OUT/timeline.json" train.max_steps=40 > "$OUT/timeline.log" 2>&1 ;;
    tests)
      timeout -s INT "${LIMIT:-420}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
        tests/gpu > "$OUT/tests.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
