#!/usr/bin/env bash
# Sixtieth session's device steps (run from the repo root on the lent machine, one GPU):
#   bash bench/results/2026-12-06_gpu_steps_s60.sh STEP...
#   tests  every GPU test (tests/gpu), on this checkout (the worker-group seam)
#   start  bench/startup.py on GPU 0, synthetic ResNet-18, 40 graphed steps: cold and warm
#          commands and Ray Train's worker group on a cluster joined by address (`address`),
#          this checkout against the session's start (f1a4527, in .base: carried), and the
#          hand-written torchrun script; REPEATS (default 3) interleaved rounds
#   diag   where Ray Train's path spends the seconds between the loop's set-up line and its first
#          step (5 s against the cold command's 1.3 s at the start step): `cold` and `address`
#          once with CUDA's JIT cache off (CUDA_CACHE_DISABLE=1), `address` once without CUDA
#          graphs; the JIT cache's size before and after
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
    diag)
      du -sh ~/.nv/ComputeCache > "$OUT/diag.log" 2>&1
      CUDA_CACHE_DISABLE=1 CUDA_VISIBLE_DEVICES=0 timeout -s INT "${LIMIT:-200}" python3 \
        bench/startup.py --recipe cnn/synthetic_resnet18_bench --repeats 1 --modes cold,address \
        --timeout-s 120 --out "$OUT/diag_nocache.json" train.max_steps=40 >> "$OUT/diag.log" 2>&1
      CUDA_VISIBLE_DEVICES=0 timeout -s INT "${LIMIT:-200}" python3 bench/startup.py \
        --recipe cnn/synthetic_resnet18_bench --repeats 1 --modes address --timeout-s 120 \
        --out "$OUT/diag_eager.json" train.max_steps=40 precision.cuda_graphs=false \
        >> "$OUT/diag.log" 2>&1
      du -sh ~/.nv/ComputeCache >> "$OUT/diag.log" 2>&1 ;;
    loop)
      CUDA_VISIBLE_DEVICES=0 timeout -s INT "${LIMIT:-540}" python3 bench/loop_throughput.py \
        --baseline "$PWD/.base" --rounds "${ROUNDS:-3}" --out "$OUT/loop.json" \
        > "$OUT/loop.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
