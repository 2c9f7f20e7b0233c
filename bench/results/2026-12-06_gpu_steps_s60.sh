#!/usr/bin/env bash
# Sixtieth session's device steps (run from the repo root on the lent machine, one GPU):
#   bash bench/results/2026-12-06_gpu_steps_s60.sh STEP...
#   tests  every GPU test (tests/gpu), on this checkout (the worker-group seam)
#   start  bench/startup.py on GPU 0, synthetic ResNet-18, 40 graphed steps: cold and warm
#          commands and Ray Train's worker group on a cluster joined by address (`address`),
#          this checkout against the session's start (f1a4527, in .base: carried), and the
#          hand-written torchrun script; REPEATS (default 3) interleaved rounds
#   hook   the same on Ray Train's path alone (`address`), this checkout against one whose workers
#          do not begin the loop's imports at their process's start (.nohook: carried), REPEATS
#          (default 3) interleaved rounds
#   loop   bench/loop_throughput.py: the worker loop's steady-state samples/s on GPU 0 (CNN
#          graphed and eager, SBI at batch 4,096), this checkout against .base, alternating
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    tests)
      timeout -s INT "${LIMIT:-420}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
        tests/gpu > "$OUT/tests.log" 2>&1 ;;
    start)
      CUDA_VISIBLE_DEVICES=0 timeout -s INT "${LIMIT:-540}" python3 bench/startup.py \
        --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" --warmup \
        --baseline "$PWD/.base" \
        --modes cold,warm,address,baseline_cold,baseline_warm,baseline_address \
        --torchrun bench/startup_torchrun_resnet.py --torchrun-procs 1 --timeout-s 150 \
        --out "$OUT/start.json" train.max_steps=40 > "$OUT/start.log" 2>&1 ;;
    hook)
      CUDA_VISIBLE_DEVICES=0 timeout -s INT "${LIMIT:-400}" python3 bench/startup.py \
        --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" --warmup \
        --baseline "$PWD/.nohook" --modes address,baseline_address --timeout-s 150 \
        --out "$OUT/hook.json" train.max_steps=40 > "$OUT/hook.log" 2>&1 ;;
    loop)
      CUDA_VISIBLE_DEVICES=0 timeout -s INT "${LIMIT:-540}" python3 bench/loop_throughput.py \
        --baseline "$PWD/.base" --rounds "${ROUNDS:-3}" --out "$OUT/loop.json" \
        > "$OUT/loop.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
