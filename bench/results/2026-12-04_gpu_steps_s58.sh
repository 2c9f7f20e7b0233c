#!/usr/bin/env bash
# Fifty-eighth session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-12-04_gpu_steps_s58.sh STEP...
#   tests  the GPU tests whose runs take Ray Train's worker group (the test session's
#          TRAINFORGE_COLD_WORKERS=ray), now started without Ray Data's autoscaling coordinator
#   start  bench/startup.py on GPU 0, synthetic ResNet-18, 40 graphed steps: Ray Train's worker
#          group on a private Ray (`private_ray`), this checkout against the session's start
#          (f580f20, in .base58: carried; BASE=.base58b: 4c585d4, the commit before the private
#          Ray without dashboard modules), REPEATS (default 3) interleaved rounds
# Run in the fifty-eighth session (one H200, results 2026-12-04_s58_*_1xH200*):
#   LIMIT=150 bash … tests; LIMIT=380 REPEATS=6 bash … start   (one call: 4 rounds before the
#   call's limit; the last round's interrupted command is at the end of its log), then
#   BYTECODE=1 LIMIT=400 REPEATS=4 bash … start on a fresh host   (…_bytecode_1xH200*), then
#   LIMIT=150 bash … tests; BYTECODE=1 BASE=.base58b LIMIT=300 REPEATS=4 bash … start
#   (…_no_dashboard_modules_*_1xH200*)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
raytrain_steps "${BASE:-.base58}" "$@"
