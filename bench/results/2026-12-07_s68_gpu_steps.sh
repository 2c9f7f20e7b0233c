#!/usr/bin/env bash
# The sixty-eighth session's device call (one H100), from the repo root:
#   BYTECODE=1 bash bench/results/2026-12-07_s68_gpu_steps.sh
# sweep: the npe_1e5 sweep against the shipped recipe on two_moons (bench/sweep_sbi_gpu.py,
#   --part together: the shipped run beside four trials sharing the GPU), with the flow that
#   CUDA graphs capture (zuko_nsf) on both sides; $OUT/sweep/
# start: Ray Train's path by address against the hand-written torchrun script, with bytecode
#   (bench/startup.py, synthetic ResNet-18, 40 graphed steps, interleaved rounds); $OUT/start.*
set -u
source bench/device_env.sh
export GPU_NAME
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader)"
for step in ${STEPS:-sweep start}; do
  t0=$(date +%s)
  case "$step" in
    sweep)
      mkdir -p "$OUT/sweep" .sweepwork2
      TRAINFORGE_HOME=$PWD/.sweepwork2/home timeout "${SWEEP_LIMIT:-330}" python3 \
        bench/sweep_sbi_gpu.py --task two_moons --part together --at-once 4 \
        --hidden "50, 100" --lr "5e-4, 2e-3" --work .sweepwork2 --out "$OUT/sweep/sweep_sbi.json" \
        --set workload.estimator.model=zuko_nsf precision.cuda_graphs=true \
        > "$OUT/sweep/bench.log" 2>&1
      rc=$?
      cp .sweepwork2/*.log .sweepwork2/*.json "$OUT/sweep/" 2>/dev/null
      TRAINFORGE_HOME=$PWD/.sweepwork2/home python3 -m trainforge cluster stop > /dev/null 2>&1
      ;;
    start)
      CUDA_VISIBLE_DEVICES=0 timeout -s INT "${START_LIMIT:-220}" python3 bench/startup.py \
        --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" --modes address \
        --torchrun bench/startup_torchrun_resnet.py --torchrun-procs 1 --timeout-s 100 \
        --out "$OUT/start.json" train.max_steps=40 > "$OUT/start.log" 2>&1
      rc=$?
      ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" "$rc" "$t0"
done
