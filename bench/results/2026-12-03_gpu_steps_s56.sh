#!/usr/bin/env bash
# Fifty-sixth session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-12-03_gpu_steps_s56.sh STEP...
#   tests  the GPU tests whose runs take Ray Train's worker group (the test session's
#          TRAINFORGE_COLD_WORKERS=ray): rank 0 on the command's node relays its records, the
#          command samples the GPU's system metrics and logs the model rank 0 kept for it
#   start  bench/startup.py on GPU 0, synthetic ResNet-18, 40 graphed steps: Ray Train's worker
#          group on a private Ray (`private_ray`), this checkout against the session's start
#          (6781029, in .base56: carried), REPEATS (default 3) interleaved rounds
# Run in the fifty-seventh session (one H200, results 2026-12-03_s56_*_1xH200*):
#   LIMIT=160 bash … tests; LIMIT=370 REPEATS=6 bash … start   (4 rounds fit the limit)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
raytrain_steps ".base56" "$@"
