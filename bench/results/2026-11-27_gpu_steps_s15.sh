#!/usr/bin/env bash
# Fifteenth session's device steps (issue 15), named on the command line, run in order on one
# warm host; each step's output goes to $OUT/<step>/:
#   slcpens   an ensemble probe for slcp at 10^6: one simulation entry (`trainforge simulate`
#             of npe_1e6.yaml, run.seed 0), then four `trainforge train` runs of the same
#             recipe on it at once (workload.simulation.path), run.seed 0-3 (each its own
#             split and initialisation), one GPU each, capped at 65,000 steps (the committed
#             run's lr was below 1e-6 by then: bench/results/…_npe_1e6_plateau_s12); the four
#             posteriors come back as slcp_1e6.<seed>.pt, scored alone and as one equal-weight
#             mixture on the CPU: bench/sbi_accuracy.py --score <dir> --ensembles
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    slcpens) W=/tmp/$step && rm -rf "$W" && mkdir -p "$OUT/$step" "$W/posteriors"
           common=(recipes/sbi/npe_1e6.yaml workload.task=slcp run.storage_path="$W/runs"
                   tracking.enabled=false workload.evaluation.c2st=false
                   workload.evaluation.observations=[] workload.evaluation.observations_from=own)
           python3 -m trainforge cluster start
           timeout 120 python3 -m trainforge simulate "${common[@]}" run.seed=0 \
             > "$OUT/$step/simulate.log" 2>&1
           folder=$(grep -o "simulations ready: .*" "$OUT/$step/simulate.log" | tail -1 | cut -d' ' -f3)
           echo "simulations: $folder"
           for seed in 0 1 2 3; do
             timeout 440 python3 -m trainforge train "${common[@]}" run.seed=$seed \
               workload.simulation.path="$folder" train.max_steps=65000 run.name=slcp_e$seed \
               > "$OUT/$step/slcp_e$seed.log" 2>&1 &
             sleep 2
           done
           wait
           for seed in 0 1 2 3; do
             f="$W/runs/slcp_e$seed/posterior.pt"
             [ -f "$f" ] && cp "$f" "$W/posteriors/slcp_1e6.$seed.pt"
           done
           (cd "$W/posteriors" && tar -cf "$OUT/$step/posteriors.tar" ./*.pt) ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
