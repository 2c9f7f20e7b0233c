#!/usr/bin/env bash
# Thirty-third session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-11-30_gpu_steps_s33.sh STEP...
#   race  issue 12's GPU race in one invocation: two_moons, 20,000 simulations, sbi 0.27's
#         `NPE().train()` on the GPU against whole `trainforge train` commands (batch 512,
#         lr 1e-3, CUDA graphs), cold (the first command, no cluster) and warm; REPEATS
#         (default 1) of each, each command ended after EPOCHS epochs (default: early stopping)
#   ab    bench/startup.py cold commands of the synthetic ResNet-18 recipe (40 graphed steps):
#         BASELINE (an absolute path; the package before the SVG figures) against this
#         checkout, REPEATS rounds (default 3), after one untimed cold command (--warmup)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    race) CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-570}" python3 bench/sbi_race_command.py \
            --device cuda --simulations 20000 --variants b512_lr1e-3 \
            --repeats "${REPEATS:-1}" ${EPOCHS:+--epochs "$EPOCHS"} \
            --out "$OUT/race.json" > "$OUT/race.log" 2>&1 ;;
    ab) REPEATS=${REPEATS:-3} startup_cold "ab${CALL:-}" 560 "${MODES:-baseline_cold,cold}" --warmup ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step${CALL:-}" $? "$t0"
done
