#!/usr/bin/env bash
# Sixteenth session's device steps (issue 15), named on the command line, run in order on one
# warm host; each step's output goes to $OUT/<step>/:
#   slcppat  the fifteenth session's slcp ensemble probe (one simulation entry, run.seed 0; four
#            `trainforge train` runs of npe_1e6.yaml on it at once, run.seed 0-3, one GPU each,
#            65,000 steps) with the learning rate halved later: train.plateau_patience=$PATIENCE
#            (default 12, the recipe's 5) and train.early_stopping_patience=$STOP_PATIENCE
#            (default 40, so that early stopping never comes before a halving could); the
#            posteriors go to /tmp/s16/posteriors/slcp_1e6.<seed>.pt and $OUT/slcppat/;
#            SEEDS (default "0 1 2 3") names the four runs' seeds
#   score    scores them on this host's cores at sbibm's observations 1-10 (bench/sbi_accuracy.py
#            --score --ensembles: the four-member mixture, then each member); sbibm's slcp files
#            are carried in .sbibm-slcp (the wheel's sbibm/tasks/slcp/files only)
#   onecore  on nvidia-h100-x1, where the stage trailed sbi's batched call at one core (0.79,
#            0.69): bench/sim_one_core.py (the simulator alone in this process, a fresh one, a
#            Ray worker at niceness 15 and 0) and bench/sim_scaling.py at one core, in one call
#   sbitest  the SBI GPU tests (tests/gpu/test_sbi_gpu.py) after this session's runtime changes
#            (workers at niceness 0, the simulations made while Ray starts)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    slcppat) W=/tmp/s16 && rm -rf "$W" && mkdir -p "$OUT/$step" "$W/posteriors"
           common=(recipes/sbi/npe_1e6.yaml workload.task=slcp run.storage_path="$W/runs"
                   tracking.enabled=false workload.evaluation.c2st=false
                   workload.evaluation.observations=[] workload.evaluation.observations_from=own)
           python3 -m trainforge cluster start
           timeout 120 python3 -m trainforge simulate "${common[@]}" run.seed=0 \
             > "$OUT/$step/simulate.log" 2>&1
           folder=$(grep -o "simulations ready: .*" "$OUT/$step/simulate.log" | tail -1 | cut -d' ' -f3)
           echo "simulations: $folder"
           for seed in ${SEEDS:-0 1 2 3}; do  # shellcheck disable=SC2086
             timeout 440 python3 -m trainforge train "${common[@]}" run.seed="$seed" \
               workload.simulation.path="$folder" train.max_steps=65000 run.name="slcp_p$seed" \
               train.plateau_patience="${PATIENCE:-12}" \
               train.early_stopping_patience="${STOP_PATIENCE:-40}" \
               > "$OUT/$step/slcp_p$seed.log" 2>&1 &
             sleep 2
           done
           wait
           for seed in ${SEEDS:-0 1 2 3}; do  # shellcheck disable=SC2086
             f="$W/runs/slcp_p$seed/posterior.pt"
             [ -f "$f" ] && cp "$f" "$W/posteriors/slcp_1e6.$seed.pt"
           done
           (cd "$W/posteriors" && tar -cf "$OUT/$step/posteriors.tar" ./*.pt) ;;
    score) mkdir -p "$OUT/$step"
           python3 bench/sbi_accuracy.py --score /tmp/s16/posteriors --ensembles --tasks slcp \
             --sbibm-path .sbibm-slcp --c2st-workers 50 \
             --out "$OUT/$step/slcp_patience_scored.json" > "$OUT/$step/score.log" 2>&1 ;;
    onecore) mkdir -p "$OUT/$step"
           timeout 300 python3 bench/sim_one_core.py --simulations 1500 --repeats 5 \
             --out "$OUT/$step/sim_one_core.json" > "$OUT/$step/sim_one_core.log" 2>&1
           timeout 250 python3 bench/sim_scaling.py --cores 1 --seconds 3 --repeats 5 \
             --budget-s 240 --out "$OUT/$step/sim_scaling.json" > "$OUT/$step/sim_scaling.log" 2>&1 ;;
    sbitest) timeout 400 python3 -m pytest -m gpu tests/gpu/test_sbi_gpu.py -v -p no:cacheprovider \
           > "$OUT/$step.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
