#!/usr/bin/env bash
# Nineteenth session's device steps (run from the repo root on the lent machine):
#   bash bench/results/2026-11-28_gpu_steps_s19.sh STEP...
#   sim1pin   bench/sim_scaling.py at one core, ~4 s of work a point, seven repeats, with each
#             method's simulating process pinned to the same CPU (--pin), everything else on
#             the other CPUs
#   sim1free  the same without --pin, right after, on the same host
#   sim1pin2, sim1free2  the same two on another host, after pinning moved every thread (not
#             only each process's first), with the stage also run with Ray's workers at
#             niceness 0 (--nice0), six repeats
#   start1ray bench/startup.py, synthetic ResNet-18 on 1 GPU, cold and warm, against the
#             package before the lasting cluster's ray start went through ray_cli (.base19:
#             commit 899803d's runtime/ as `trainforge`, with its recipes), interleaved
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
sim() {  # sim STEP OPTION...
  local step=$1; shift
  mkdir -p "$OUT/$step"
  timeout 290 python3 bench/sim_scaling.py --cores 1 --seconds 4 --repeats "${REPEATS:-7}" --budget-s 280 \
    "$@" --out "$OUT/$step/sim_scaling.json" > "$OUT/$step/sim_scaling.log" 2>&1
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    sim1pin) sim "$step" --pin ;;
    sim1free) sim "$step" ;;
    sim1pin2) REPEATS=6 sim "$step" --pin --nice0 ;;
    sim1free2) REPEATS=6 sim "$step" --nice0 ;;
    start1ray) timeout "${LIMIT:-540}" python3 bench/startup.py \
           --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" \
           --modes baseline_cold,baseline_warm,cold,warm --baseline "$PWD/.base19" \
           --out "$OUT/$step.json" train.max_steps=40 scaling.use_all_gpus=false \
           scaling.num_workers=1 > "$OUT/$step.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
