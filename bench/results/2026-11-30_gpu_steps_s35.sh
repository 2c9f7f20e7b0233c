#!/usr/bin/env bash
# Thirty-fifth session's device steps (run from the repo root on the lent machine):
#   bash bench/results/2026-11-30_gpu_steps_s35.sh STEP...
#   Five calls on nvidia-h200-x2 hosts (files in 2026-11-30_s35_2xH200/callN):
#   call 1: s34's script, `BASELINE=$PWD/.base34 LIMIT=230 … warmgpu` — the warm GPU test alone
#           passed with this checkout and with c0fc201's package
#   call 2: `LIMIT=550 bash bench/gpu_acceptance.sh tests` (then all of tests/gpu in one step):
#           17 tests passed, the warm test failed as the limit's SIGINT came, and the SIGINT'd
#           pytest hung at its session's end (no report; the call's own limit ended it)
#   call 3: `poison`, call 4: `LIMIT=330 … poison2`, call 5 (after the stream change):
#           `LIMIT=250 … stream`
#   poison   the warm GPU test after one other GPU test file in the same pytest session:
#            test_gpu_tracking.py (the session's Ray cluster), then test_gpu_step.py (CUDA in
#            the pytest process); failures written as they happen, every thread's stack dumped
#            at the limit (bench/pytest_report_now.py)
#   poison2  the same after the two SBI recipe tests on the session's Ray cluster that ran
#            before it in the thirty-fourth session's failing step
#   stream   the graphed DDP steps' tests (CNN, SBI, the SBI recipe on two GPUs) once the eager
#            steps and the capture run on the stream DDP was built on; no "AccumulateGrad
#            node's stream does not match" warning may come (counted in the log: 0)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
one() {  # one NAME TEST...: pytest, stacks written at LIMIT, SIGINT 8 s later
  # (as run this session, a `pkill -USR1 -f "^python3 -m pytest"` at LIMIT asked for the
  # stacks; that matches nothing where python3 is a shim that runs another path, as pyenv's;
  # no step reached its limit)
  echo "== $1: ${*:2}"
  local rc
  STACKS_AFTER_S="${LIMIT:-200}" timeout -s INT -k 20 "$((${LIMIT:-200} + 8))" python3 -m pytest \
    -p no:cacheprovider -p bench.pytest_report_now -q -rA --tb=short "${@:2}"
  rc=$?
  echo "== $1 rc=$rc"
  return "$rc"
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    poison) { one tracking tests/gpu/test_gpu_tracking.py tests/gpu/test_warm_gpu.py \
                && one step tests/gpu/test_gpu_step.py tests/gpu/test_warm_gpu.py; } \
              > "$OUT/poison.log" 2>&1 ;;
    poison2) one sbi tests/gpu/test_sbi_gpu.py::test_sbi_recipe_on_one_gpu_with_cuda_graphs \
               tests/gpu/test_sbi_gpu.py::test_a_step_that_cannot_be_captured_falls_back_to_eager \
               tests/gpu/test_warm_gpu.py > "$OUT/poison2.log" 2>&1 ;;
    stream) one stream tests/gpu/test_gpu_step.py \
              tests/gpu/test_sbi_gpu.py::test_graphed_ddp_step_matches_the_eager_ddp_step \
              tests/gpu/test_sbi_gpu.py::test_sbi_recipe_on_two_gpus_over_nccl \
              > "$OUT/stream.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
