#!/usr/bin/env bash
# Issue 13, first device call on a 4-GPU host (after `source .device/setup.sh` and the
# trainforge link, see bench/results/README.md): the eager step profiled against the
# hand-written one on one GPU, then DDP's bucket size against the graphed step's weak scaling.
set -u
export RAY_DEDUP_LOGS=0 MLFLOW_DISABLE_TELEMETRY=true OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
{ nvidia-smi -L; nvidia-smi topo -m; python3 -c "import torch; print(torch.__version__)"; nproc
  grep -m1 "model name" /proc/cpuinfo; } > "$OUT/host.txt" 2>&1
t0=$(date +%s)
timeout 170 python3 bench/cnn_step_profile.py --out "$OUT/profile.json" > "$OUT/profile.log" 2>&1
echo "profile rc=$? $(( $(date +%s) - t0 )) s"
grep -A25 '^\[profile\]' "$OUT/profile.log" | cut -c1-130
t0=$(date +%s)
timeout 90 python3 -m torch.distributed.run --standalone --nproc_per_node=1 bench/ddp_buckets.py \
  --out "$OUT/buckets_1gpu.json" --bucket-mb 25 --repeats 2 > "$OUT/buckets_1gpu.log" 2>&1
echo "1 GPU rc=$? $(( $(date +%s) - t0 )) s"; grep '^\[buckets\]' "$OUT/buckets_1gpu.log"
t0=$(date +%s)
timeout 230 python3 -m torch.distributed.run --standalone --nproc_per_node=4 bench/ddp_buckets.py \
  --out "$OUT/buckets_4gpu.json" --bucket-mb 25 10 5 2 --repeats 2 > "$OUT/buckets_4gpu.log" 2>&1
echo "4 GPUs rc=$? $(( $(date +%s) - t0 )) s"; grep '^\[buckets\]' "$OUT/buckets_4gpu.log"
tail -5 "$OUT/buckets_4gpu.log" | cut -c1-300
