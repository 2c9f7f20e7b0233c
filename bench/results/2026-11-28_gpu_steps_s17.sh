#!/usr/bin/env bash
# Seventeenth session's device steps (run from the repo root on the lent machine):
#   bash bench/results/2026-11-28_gpu_steps_s17.sh STEP...
#   slcpens  the shipped recipe recipes/sbi/slcp_ensemble_1e6.yaml as a user runs it, on seeds
#            run.seed=$SEED.. (default 8: seeds 8-11, not used before), one command; the
#            in-run C2ST off (EVAL=false by default: the call's 10 minutes), then the
#            ensemble's posterior scored at sbibm's observations 1-10 on this host's cores
#            (bench/sbi_accuracy.py --score; sbibm's slcp files carried in .sbibm-slcp)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    slcpens) W=/tmp/s17 && rm -rf "$W" && mkdir -p "$OUT/$step" "$W/posteriors"
           python3 -m trainforge cluster start
           timeout 440 python3 -m trainforge train slcp_ensemble_1e6 run.seed="${SEED:-8}" \
             run.storage_path="$W/runs" tracking.enabled=false \
             workload.evaluation.c2st="${EVAL:-false}" workload.evaluation.sbc_runs=0 \
             workload.evaluation.pair_plot=false \
             workload.evaluation.sbibm_path="$PWD/.sbibm-slcp" \
             > "$OUT/$step/ensemble.log" 2>&1
           echo "ensemble rc=$?"
           cp "$W/runs/slcp_ensemble_1e6/posterior.pt" "$W/posteriors/slcp_1e6.pt"
           cp "$W/runs/slcp_ensemble_1e6/ensemble.json" "$OUT/$step/"
           timeout 120 python3 bench/sbi_accuracy.py --score "$W/posteriors" --tasks slcp \
             --sbibm-path .sbibm-slcp --c2st-workers 50 \
             --out "$OUT/$step/slcp_ensemble_scored.json" > "$OUT/$step/score.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
