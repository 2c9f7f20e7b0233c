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
#   sbiprof  one cold command of the race (200 epochs) under `py-spy record --subprocesses
#            --idle`, each console line with its arrival time: where a cold command's first
#            epoch (2.6-3.9 s, against 0.1 s warm) goes
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
stamp() { python3 -c "
import sys, time
t = time.time()
for line in sys.stdin:
    print(f'{time.time() - t:7.2f} {line}', end='', flush=True)"; }
sbiprof() {
  local work home repo=$PWD recipe=$PWD/recipes/sbi/two_moons_parity.yaml
  work=$(mktemp -d) home=$(mktemp -d)
  local sims=(workload.simulation.num_simulations=20000 workload.evaluation.observations_from=own)
  local race
  read -r -a race <<< "$(python3 -c "import sys; sys.path.insert(0, 'bench')
import sbi_race_command as r; print(' '.join(r.QUIET + r.VARIANTS['b512_lr1e-3']))")"
  cd "$work" || return 1
  TRAINFORGE_HOME=$home python3 -m trainforge simulate "$recipe" run.name=sims "${sims[@]}" | tail -1
  (cd "$repo" && stop_background_cluster "$home")  # the simulation command started it: cold again
  CUDA_VISIBLE_DEVICES=0 TRAINFORGE_HOME=$home timeout 200 py-spy record --subprocesses --idle \
    --rate 200 --format speedscope -o "$OUT/sbiprof.speedscope.json" -- \
    python3 -m trainforge train "$recipe" run.name=prof "${sims[@]}" "${race[@]}" \
    precision.cuda_graphs=true train.epochs=200 2>&1 | stamp
  cd "$repo" && stop_background_cluster "$home"
  gzip -f "$OUT/sbiprof.speedscope.json"
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    race) CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-570}" python3 bench/sbi_race_command.py \
            --device cuda --simulations 20000 --variants b512_lr1e-3 \
            --repeats "${REPEATS:-1}" ${EPOCHS:+--epochs "$EPOCHS"} \
            --out "$OUT/race.json" > "$OUT/race.log" 2>&1 ;;
    sbiprof) sbiprof > "$OUT/sbiprof.log" 2>&1 ;;
    ab) REPEATS=${REPEATS:-3} startup_cold "ab${CALL:-}" 560 "${MODES:-baseline_cold,cold}" --warmup ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step${CALL:-}" $? "$t0"
done
