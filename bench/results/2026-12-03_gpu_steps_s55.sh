#!/usr/bin/env bash
# Fifty-fifth session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-12-03_gpu_steps_s55.sh STEP...
#   tests  the GPU tests whose runs take Ray Train's worker group (the test session's
#          TRAINFORGE_COLD_WORKERS=ray): NCCL process groups from trainforge/process_group.py,
#          GPU system metrics from rank 0, the MLflow run handed over while the group starts
#   start  bench/startup.py on GPU 0, synthetic ResNet-18, 40 graphed steps: Ray Train's worker
#          group on a private Ray (`private_ray`), this checkout against the session's start
#          (d2873ee, in .base55: carried), REPEATS (default 3) interleaved rounds
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
raytrain_steps ".base55" "$@"
