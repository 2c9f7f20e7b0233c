#!/usr/bin/env bash
# Twenty-seventh session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-11-29_gpu_steps_s27.sh STEP...
#   startc    bench/startup.py on GPU 0, synthetic ResNet-18, 40 graphed steps: the session's
#             starting package (.base27: 98f540c's runtime as `trainforge`, its recipes and
#             deploy) cold, then this checkout cold (rank 0's MLflow connection after the first
#             step); REPEATS rounds (default 3)
#             (as run, `.base27` was relative and both sides ran this checkout: see the
#             results README's correction; startup.py now refuses such a path)
#   startlong the same with 2,000 steps (about 10 s of loop): does the whole command gain what
#             the first step gains, once the loop is long enough to hide the connection?
#   gputest   the GPU tests of MLflow tracking, warm workers, the synthetic ResNet-18 recipe and
#             one-GPU SBI
#   gputrack  the GPU tests of MLflow tracking and warm workers only (call 4: the budget's end)
#   ab1       startc's commands, one round (call 4)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
start_ab() {  # start_ab STEP LIMIT_S MAX_STEPS
  CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-$2}" python3 bench/startup.py \
    --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" --baseline .base27 \
    --modes baseline_cold,cold --timeout-s 150 --out "$OUT/$1.json" \
    train.max_steps="$3" > "$OUT/$1.log" 2>&1
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    startc) start_ab startc 330 40 ;;
    startlong) start_ab startlong 260 2000 ;;
    gputest) timeout "${LIMIT:-400}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
               -W always tests/gpu/test_gpu_tracking.py tests/gpu/test_warm_gpu.py \
               tests/gpu/test_sbi_gpu.py::test_sbi_recipe_on_one_gpu_with_cuda_graphs \
               tests/gpu/test_gpu_training.py::test_cifar10_resnet18_recipe_on_synthetic_data_all_gpus \
               > "$OUT/$step.log" 2>&1 ;;
    gputrack) timeout "${LIMIT:-240}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
                -W always tests/gpu/test_gpu_tracking.py tests/gpu/test_warm_gpu.py \
                > "$OUT/$step.log" 2>&1 ;;
    ab1) REPEATS=1 start_ab ab1 200 40 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
