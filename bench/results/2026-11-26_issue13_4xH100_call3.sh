#!/usr/bin/env bash
# Issue 13, third device call on a 4-GPU host: the CNN throughput bench (hand-written torchrun
# script, trainforge eager and graphed; 1 and 4 GPUs; SGD and AdamW; batch 256 and 1024), two
# interleaved repeats (the fourth call adds the third), then four independent one-GPU graphed
# runs at once, one per GPU: the per-GPU rate of a fully loaded host without any all-reduce.
set -u
export RAY_DEDUP_LOGS=0 MLFLOW_DISABLE_TELEMETRY=true OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 430 python3 bench/cnn_throughput.py --repeats 2 --steps 400 --min-steps 120 --tutorial-steps 100 \
  --out "$OUT/cnn_throughput_r01.json" > "$OUT/bench_r01.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep '^\[bench\]' "$OUT/bench_r01.log"
t0=$(date +%s)
for gpu in 0 1 2 3; do
  CUDA_VISIBLE_DEVICES=$gpu timeout 100 python3 -m torch.distributed.run --standalone \
    --nproc_per_node=1 bench/ddp_scaling_options.py --out "$OUT/alone_gpu$gpu.json" \
    --options bucket25 --repeats 2 > "$OUT/alone_gpu$gpu.log" 2>&1 &
done
wait
echo "four one-GPU runs at once: $(( $(date +%s) - t0 )) s"; grep -h '^\[ddp\]' "$OUT"/alone_gpu*.log
