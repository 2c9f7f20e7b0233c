#!/usr/bin/env bash
# Twenty-second session's device steps (run from the repo root on the lent machine):
#   bash bench/results/2026-11-28_gpu_steps_s22.sh STEP...
#   own4     bench/ddp_scaling_options.py (graphed SGD, batch 256): one GPU; 4 GPUs with DDP's
#            10 MB buckets, the own all-reduce (own10, own25: no DDP, each bucket's gradients
#            averaged in place by one coalesced NCCL call from the post-accumulate-grad hooks)
#            and DDP without communication (nocomm, the ceiling of DDP); then the same under
#            CUDA_DEVICE_MAX_CONNECTIONS=1
#   mc1      does CUDA_DEVICE_MAX_CONNECTIONS=1 cost a graphed step on one GPU, or eager DDP
#            steps (25 MB buckets) on 4? One launch each, with and without it
#   failed   the two tests/gpu tests that failed in gpustep (whose -q log lost their reasons)
#   ship4    weak scaling as shipped: whole `trainforge train` commands of the synthetic ResNet-18
#            bench recipe (graphed SGD, batch 256 per GPU, 600 steps in one epoch), on 1 GPU and
#            on 4, three repeats interleaved; the workers set their own CUDA environment
#            (settings.GPU_WORKER_ENV). samples/s of the last 300 steps, from the closing table.
#            Then the GPU test of that environment
#   mixed    the mixed-precision GPU test again, with its bound as changed after `failed`
#   gpustep  tests/gpu/ (the graphed step equals the eager one, DDP on two GPUs, its bucket size)
#   start1   bench/startup.py on one GPU, synthetic ResNet-18, 40 graphed steps: cold, warm (on
#            the workers the background started and rehearsed), the torchrun script, 3 repeats
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    own4) opts "$step" one_gpu 1 bucket10
          opts "$step" four 4 bucket10 own10 own25 nocomm
          CUDA_DEVICE_MAX_CONNECTIONS=1 opts "$step" mc1 4 bucket10 own10 own25 ;;
    mc1) opts "$step" one 1 bucket10
         CUDA_DEVICE_MAX_CONNECTIONS=1 opts "$step" one_mc1 1 bucket10
         OPTS_ARGS=--eager opts "$step" eager4 4 bucket25
         CUDA_DEVICE_MAX_CONNECTIONS=1 OPTS_ARGS=--eager opts "$step" eager4_mc1 4 bucket25 ;;
    failed) timeout 300 python3 -m pytest -p no:cacheprovider -q -rA --tb=short -W always \
              "tests/gpu/test_gpu_training.py::test_mixed_precision_on_two_gpus_over_nccl" \
              "tests/gpu/test_sbi_gpu.py::test_sbi_recipe_on_one_gpu_with_cuda_graphs" \
              > "$OUT/$step.log" 2>&1 ;;
    ship4) recipe="$PWD/recipes/cnn/synthetic_resnet18_bench.yaml"
           mkdir -p "$OUT/$step" /tmp/ship4 && export TRAINFORGE_HOME=/tmp/ship4/home
           for repeat in 1 2 3; do
             for n in 1 4; do
               (cd /tmp/ship4 && timeout 150 python3 -m trainforge train "$recipe" \
                  "run.name=gpus$n-r$repeat" scaling.use_all_gpus=false "scaling.num_workers=$n" \
                  train.max_steps=600 train.log_every_steps=300 \
                  "workload.synthetic_train_size=$((256 * n * 600))") \
                 > "$OUT/$step/gpus$n-r$repeat.log" 2>&1
               echo "gpus$n r$repeat rc=$? $(grep -h "perf/samples_per_s" \
                 "$OUT/$step/gpus$n-r$repeat.log")" >> "$OUT/$step/$step.log"
             done
           done
           python3 -m trainforge cluster stop >> "$OUT/$step/$step.log" 2>&1
           timeout 120 python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
             tests/gpu/test_warm_gpu.py::test_a_gpu_worker_makes_its_cuda_context_with_one_work_queue \
             > "$OUT/$step/work_queue_test.log" 2>&1
           echo "work queue test rc=$?" >> "$OUT/$step/$step.log" ;;
    mixed) timeout "${LIMIT:-300}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
             "tests/gpu/test_gpu_training.py::test_mixed_precision_on_two_gpus_over_nccl" \
             > "$OUT/$step.log" 2>&1 ;;
    gpustep) timeout 300 python3 -m pytest -p no:cacheprovider -q -rA -W always tests/gpu \
               > "$OUT/$step.log" 2>&1 ;;
    start1) start_one_gpu "$step" 400 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
