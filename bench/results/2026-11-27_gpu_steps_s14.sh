#!/usr/bin/env bash
# Fourteenth session's device steps (issues 12 and 15), named on the command line, run in order
# on one warm host; each step's output goes to $OUT/<step>.{log,json}:
#   coldsbi   bench/startup.py, the SBI race recipe on 1 GPU with a new simulation cache per
#             command (--fresh-data), cold and with the cluster up, against the commit before
#             the simulations made by the command's own process (carried as .device/base:
#             a `trainforge` package of 4a75a80), interleaved, three repeats
#   sbitest   the SBI GPU tests (simulations on the GPUs through the cluster's stage)
#   simscale  bench/sim_scaling.py: REPEATS repeats of SECONDS_PER_POINT s points, optionally
#             only CORES, on nvidia-h100-x1 (16 usable CPUs)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    coldsbi) timeout 580 python3 bench/startup.py --recipe sbi/two_moons_parity --repeats 3 \
           --modes baseline_cold,baseline_warm,cold,warm --baseline "$PWD/.device/base" \
           --fresh-data --out "$OUT/$step.json" train.max_steps=40 \
           workload.simulation.num_simulations=20000 workload.evaluation.observations=[] \
           workload.evaluation.observations_from=own scaling.use_gpu=true \
           > "$OUT/$step.log" 2>&1 ;;
    sbitest) timeout 300 python3 -m pytest -m gpu tests/gpu/test_sbi_gpu.py -v -p no:cacheprovider \
           > "$OUT/$step.log" 2>&1 ;;
    simscale) # shellcheck disable=SC2086  # CORES: an optional --cores list
           timeout 580 python3 bench/sim_scaling.py --out "$OUT/$step.json" --budget-s 540 \
           --seconds "${SECONDS_PER_POINT:-4}" --repeats "${REPEATS:-3}" ${CORES:+--cores $CORES} \
           > "$OUT/$step.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
