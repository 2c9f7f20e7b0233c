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
#   jitcache  the CUDA JIT cache's size and file count around two own-process and two address commands,
#             and each worker's environment (bench/env_probe.py): why Ray Train's first backward
#             does not find the kernels a cold command's left in the cache
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
    jitcache)  # the CUDA JIT cache's size around cold and address commands; each worker's env
      mkdir -p "$OUT/jitcache"
      for mode in private address private address; do
        du -s ~/.nv/ComputeCache >> "$OUT/jitcache/cache.log" 2>&1
        find ~/.nv/ComputeCache -type f 2>/dev/null | wc -l >> "$OUT/jitcache/cache.log"
        TRAINFORGE_WORKER_PLUGINS=bench.env_probe CUDA_VISIBLE_DEVICES=0 timeout 120 python3 \
          bench/startup.py --recipe cnn/synthetic_resnet18_bench --repeats 1 --modes "$mode" \
          --timeout-s 100 --out "$OUT/jitcache/$mode.json" train.max_steps=20 \
          >> "$OUT/jitcache/start.log" 2>&1
        echo "after $mode" >> "$OUT/jitcache/cache.log"
      done
      du -s ~/.nv/ComputeCache >> "$OUT/jitcache/cache.log" 2>&1
      cp /tmp/env-probe-*.json "$OUT/jitcache/" 2>/dev/null ;;
    tests)
      timeout -s INT "${LIMIT:-420}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
        tests/gpu > "$OUT/tests.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
