#!/usr/bin/env bash
# Thirty-fourth session's device steps (run from the repo root on the lent machine):
#   bash bench/results/2026-11-30_gpu_steps_s34.sh STEP...
#   race     (s33's script, `race`, was run as is for calls 1 and 2; call 2 with BYTECODE=1)
#   call 3 (nvidia-h200-x2): LIMIT=230 gpustep, then LIMIT=320 ab2; both ran into their limits
#   gpustep  the GPU tests of the optimizer step, now that the graphed step's eager steps
#            before capture are real steps: tests/gpu/test_gpu_step.py (graphed = eager, step
#            by step, SGD and AdamW with a schedule; DDP on two GPUs), the SBI graphed step
#            against eager (one GPU, DDP), nflows' NSF falling back to eager, the SBI recipe
#            graphed, and warm GPU workers serving two runs
#   ab2      bench/startup.py on GPUs 0 and 1: cold commands of the synthetic ResNet-18 recipe
#            (use_all_gpus: 2 workers, DDP, 40 graphed steps), BASELINE (an absolute path:
#            c0fc201's package, whose first 11 steps were thrown away) against this checkout,
#            and the hand-written torchrun script on 2 GPUs; REPEATS rounds (default 2), after
#            one untimed command
#   warmgpu  (not run this session: no device time left) tests/gpu/test_warm_gpu.py's two-GPU
#            test alone, with this checkout, then with BASELINE's package first on the Python
#            path (where given): which of the two fails, and why (its report kept: SIGINT)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
warm_test() {  # warm_test PACKAGE_FOLDER ("": this checkout)
  echo "== package: ${1:-this checkout}"
  PYTHONPATH="${1:+$1:}$PYTHONPATH" timeout -s INT "${LIMIT:-200}" python3 -m pytest \
    -p no:cacheprovider -q -rA --tb=short \
    tests/gpu/test_warm_gpu.py::test_warm_workers_serve_one_gpu_run_after_another_over_nccl
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    # SIGINT at the limit: pytest then prints its report of what ran (call 3's SIGTERM lost it)
    gpustep) timeout -s INT "${LIMIT:-300}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
               -W always tests/gpu/test_gpu_step.py \
               tests/gpu/test_sbi_gpu.py::test_graphed_step_matches_the_eager_step \
               tests/gpu/test_sbi_gpu.py::test_graphed_ddp_step_matches_the_eager_ddp_step \
               tests/gpu/test_sbi_gpu.py::test_a_step_that_cannot_be_captured_falls_back_to_eager \
               tests/gpu/test_sbi_gpu.py::test_sbi_recipe_on_one_gpu_with_cuda_graphs \
               tests/gpu/test_warm_gpu.py::test_warm_workers_serve_one_gpu_run_after_another_over_nccl \
               > "$OUT/$step${CALL:-}.log" 2>&1 ;;
    ab2) CUDA_VISIBLE_DEVICES=0,1 timeout "${LIMIT:-400}" python3 bench/startup.py \
           --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-2}" \
           --baseline "$BASELINE" --modes baseline_cold,cold --warmup \
           --torchrun bench/startup_torchrun_resnet.py --torchrun-procs 2 --timeout-s 150 \
           --out "$OUT/ab2.json" train.max_steps=40 \
           > "$OUT/ab2.log" 2>&1 ;;
    warmgpu) { warm_test ""; [ -z "${BASELINE:-}" ] || warm_test "$BASELINE"; } \
               > "$OUT/warmgpu.log" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step${CALL:-}" $? "$t0"
done
