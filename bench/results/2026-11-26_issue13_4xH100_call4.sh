#!/usr/bin/env bash
# Issue 13, fourth device call on a 4-GPU host: the CNN throughput bench, three interleaved
# repeats in one invocation (the third call's results did not come back: too many files).
set -u
export RAY_DEDUP_LOGS=0 MLFLOW_DISABLE_TELEMETRY=true OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 500 python3 bench/cnn_throughput.py --repeats 3 --steps 400 --min-steps 120 \
  --tutorial-steps 100 --out "$OUT/cnn_throughput.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep '^\[bench\]' "$OUT/bench.log"
