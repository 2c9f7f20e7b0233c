#!/usr/bin/env bash
# Issue 13's device call, run on one warm 2-GPU host after `source .device/setup.sh` and the
# trainforge link (see bench/results/README.md): the CNN throughput bench first (it writes its
# JSON after every repeat), then the GPU tests of the CUDA-graph step and the shipped recipe.
set -u
export RAY_DEDUP_LOGS=0 MLFLOW_DISABLE_TELEMETRY=true OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
{ nvidia-smi -L; nvidia-smi topo -m; python3 -c "import torch; print(torch.__version__)"; } > "$OUT/gpus.txt" 2>&1
t0=$(date +%s)
timeout 300 python3 bench/cnn_throughput.py --out "$OUT/cnn_throughput.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"
grep '^\[bench\]' "$OUT/bench.log"
t0=$(date +%s)
timeout 230 python3 -m pytest -m gpu -v -s -p no:cacheprovider tests/gpu/test_gpu_step.py \
  "tests/gpu/test_sbi_gpu.py::test_graphed_step_matches_the_eager_step" \
  "tests/gpu/test_sbi_gpu.py::test_graphed_ddp_step_matches_the_eager_ddp_step" \
  "tests/gpu/test_sbi_gpu.py::test_a_step_that_cannot_be_captured_falls_back_to_eager" \
  "tests/gpu/test_gpu_training.py::test_cifar10_resnet18_recipe_on_synthetic_data_all_gpus" \
  "tests/gpu/test_gpu_training.py::test_mixed_precision_on_two_gpus_over_nccl[bf16]" \
  > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"
grep -E "PASSED|FAILED|ERROR|passed|failed|eager steps|samples/s" "$OUT/gpu_tests.log" | tail -30
