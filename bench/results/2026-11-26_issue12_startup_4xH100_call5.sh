#!/usr/bin/env bash
# Issue 12 on a 4-GPU host: the whole command of the synthetic ResNet-18 recipe (40 steps) with
# the lasting cluster started by the command (cold) and already up (warm), against a
# hand-written torchrun script's time to its first step (bench/startup_torchrun_resnet.py).
set -u
export RAY_DEDUP_LOGS=0 MLFLOW_DISABLE_TELEMETRY=true OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
{ nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; } > "$OUT/host.txt" 2>&1
t0=$(date +%s)
timeout 420 python3 bench/startup.py --recipe cnn/synthetic_resnet18_bench --repeats 2 \
  --modes cold,warm --torchrun bench/startup_torchrun_resnet.py --torchrun-procs 4 \
  --out "$OUT/startup.json" train.max_steps=40 > "$OUT/startup.log" 2>&1
echo "startup rc=$? $(( $(date +%s) - t0 )) s"; tail -4 "$OUT/startup.log" | cut -c1-1500
