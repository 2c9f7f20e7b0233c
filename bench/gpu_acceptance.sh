#!/usr/bin/env bash
# The GPU measurements issues 12 and 13 accept on, for a host of 2, 4 or more GPUs, one step per
# device call (each fits a call's 600 s; LIMIT overrides a step's limit). Run from the repo root
# on the lent machine, after `source .device/setup.sh`:
#   bash bench/gpu_acceptance.sh STEP...
#   tests  the GPU tests of the CNN loop, tracking and warm workers; `tests_sbi` those of SBI:
#          all of tests/gpu in two steps (together they ran past one call's 560 s on 2×H200).
#          Each failure is written to $OUT/failures.log as it fails, and the limit's SIGINT
#          comes after every thread's stack has been written to $OUT/stacks.log
#          (bench/pytest_report_now.py): a test that the limit cuts into fails too (its
#          `trainforge` subprocess gets the signal), and pytest then prints no report
#   tests_ddp  the GPU tests of a graphed step on 2 GPUs (its own gradient all-reduce,
#          runtime/gradient_averaging.py): step by step against eager DDP, the NSF fallback, the
#          SBI recipe over NCCL; ~2-3 min. After `ship`: no 2-GPU command's log may say the model
#          "cannot be handed over" (the fortieth session's measured version did)
#   start  issue 12: from the shell to the first optimizer step on all GPUs, synthetic ResNet-18
#          (40 graphed steps): cold and warm commands against the hand-written torchrun script
#          on the same GPUs, REPEATS (default 3) interleaved rounds; target ≤ torchrun + 3 s
#   cnn    issue 13: bench/cnn_throughput.py — torchrun script, trainforge eager and graphed, SGD
#          and AdamW, batch 256 and 1024, 1 GPU and all, REPEATS (default 3) interleaved, and the
#          classic tutorial loop; targets: graphed ≥ 1.3× torchrun, eager ≥ 1.0× in each repeat
#   ship   issue 13: weak scaling as shipped — whole `trainforge train` commands of the synthetic
#          ResNet-18 recipe (graphed SGD, batch 256 per GPU, 600 steps), 1 GPU and all, REPEATS
#          (default 3) interleaved; samples/s of the last 300 steps; target ≥ 0.95.
#          BASELINE=/abs/dir (a folder holding another checkout's `trainforge` package, as
#          bench/startup.py's --baseline) runs that package's commands too, interleaved, each
#          package with a home (lasting cluster) of its own; the commands' logs come back as
#          $OUT/ship/logs.tgz (a call brings back at most 8 files)
#   streams  issue 13: what the graphed DDP step's capture stream does to weak scaling:
#          bench/ddp_scaling_options.py on all GPUs, `bucket10` (DDP as graphed steps had it
#          until the thirty-ninth session: the capture on a stream of its own) against
#          `onestream` (the capture on DDP's stream), two
#          launches of 2 repeats each;
#          $OUT/streams/{launch1,launch2}.json
#   parts  issue 13: where weak scaling goes, in bench/ddp_scaling_options.py's runs of the
#          shipped graphed step (3 repeats each): GPU 0 alone (`solo1`, and `solo2` at the end);
#          every GPU at once, each its own independent run of one GPU (`alone<i>`: what the host
#          loses when all its GPUs work, with no DDP); on all GPUs `own10` (as shipped: the
#          step's own all-reduce, gradient_averaging.py), DDP `bucket10` and `nocomm` (DDP's
#          bookkeeping without communication): $OUT/parts/*.json
#   kernels  issue 13: bench/ddp_step_kernels.py, rank 0's GPU activity per graphed step, GPU 0
#          alone (`one.json`) against DDP on all GPUs (`all.json`: `nocomm`, `bucket10`), and
#          their comparisons: $OUT/kernels/kernels.log
# Results land in $OUT (JSON and logs); commit them under bench/results/ with the host's facts
# ($OUT/host.txt, written by bench/device_env.sh).
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
gpus=$(nvidia-smi -L | wc -l)
gpu_tests() {  # gpu_tests TEST...: stacks at LIMIT (default 540 s), SIGINT 10 s later
  STACKS_AFTER_S="${LIMIT:-540}" timeout -s INT "$((${LIMIT:-540} + 10))" python3 -m pytest \
    -p no:cacheprovider -p bench.pytest_report_now -q -rA --tb=short -W always "$@"
}
recipe="$PWD/recipes/cnn/synthetic_resnet18_bench.yaml"
package_path() {  # package_path current|baseline COMMAND...: COMMAND with that package first
  if [ "$1" = baseline ]; then PYTHONPATH="$BASELINE:$PYTHONPATH" "${@:2}"; else "${@:2}"; fi
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    tests) gpu_tests tests/gpu/test_gpu_step.py tests/gpu/test_gpu_tracking.py \
             tests/gpu/test_gpu_training.py tests/gpu/test_warm_gpu.py > "$OUT/tests.log" 2>&1 ;;
    tests_sbi) gpu_tests tests/gpu/test_sbi_gpu.py > "$OUT/tests_sbi.log" 2>&1 ;;
    tests_ddp) gpu_tests tests/gpu/test_gpu_step.py::test_graphed_cnn_ddp_step_is_the_eager_ddp_step \
                 tests/gpu/test_sbi_gpu.py::test_graphed_ddp_step_matches_the_eager_ddp_step \
                 "tests/gpu/test_sbi_gpu.py::test_a_step_that_cannot_be_captured_falls_back_to_eager[2]" \
                 "tests/gpu/test_sbi_gpu.py::test_sbi_recipe_on_two_gpus_over_nccl[True]" \
                 > "$OUT/tests_ddp.log" 2>&1 ;;
    start) timeout -s INT "${LIMIT:-560}" python3 bench/startup.py \
             --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" --modes cold,warm \
             --torchrun bench/startup_torchrun_resnet.py --torchrun-procs "$gpus" \
             --timeout-s 150 --out "$OUT/start.json" train.max_steps=40 > "$OUT/start.log" 2>&1 ;;
    cnn) timeout -s INT "${LIMIT:-570}" python3 bench/cnn_throughput.py \
           --repeats "${REPEATS:-3}" --gpus 1 "$gpus" --out "$OUT/cnn.json" > "$OUT/cnn.log" 2>&1 ;;
    ship) rm -rf /tmp/ship  # a warm host keeps the last call's runs: same names would resume
          mkdir -p "$OUT/ship" /tmp/ship/logs
          packages="current${BASELINE:+ baseline}"
          for package in $packages; do  # where each package's commands import trainforge from
            echo "$package: $(package_path "$package" python3 -c \
              'import trainforge; print(trainforge.__file__)')" >> "$OUT/ship/ship.log"
          done
          for repeat in $(seq "${REPEATS:-3}"); do
            for package in $packages; do
              for n in 1 "$gpus"; do
                name="$package-gpus$n-r$repeat" log="/tmp/ship/logs/$package-gpus$n-r$repeat.log"
                (cd /tmp/ship && TRAINFORGE_HOME="/tmp/ship/home-$package" package_path \
                   "$package" timeout -s INT 150 python3 -m trainforge train "$recipe" \
                   "run.name=$name" scaling.use_all_gpus=false "scaling.num_workers=$n" \
                   train.max_steps=600 train.log_every_steps=300 \
                   "workload.synthetic_train_size=$((256 * n * 600))") > "$log" 2>&1
                echo "$name rc=$? $(grep -h "perf/samples_per_s" "$log")" >> "$OUT/ship/ship.log"
              done
            done
          done
          for package in $packages; do
            TRAINFORGE_HOME="/tmp/ship/home-$package" package_path "$package" \
              python3 -m trainforge cluster stop >> "$OUT/ship/ship.log" 2>&1
          done
          tar -czf "$OUT/ship/logs.tgz" -C /tmp/ship logs ;;
    streams) for launch in launch1 launch2; do
               opts streams "$launch" "$gpus" bucket10 onestream
             done ;;
    parts) one_gpu() {  # one_gpu GPU NAME: the shipped graphed step on that GPU alone
             CUDA_VISIBLE_DEVICES=$1 timeout 200 python3 -m torch.distributed.run --standalone \
               --nproc_per_node=1 bench/ddp_scaling_options.py --options bucket10 --repeats 3 \
               --out "$OUT/parts/$2.json" >> "$OUT/parts/$2.log" 2>&1
             echo "$2 rc=$?" >> "$OUT/parts/parts.log"
           }
           mkdir -p "$OUT/parts"
           one_gpu 0 solo1
           for gpu in $(seq 0 $((gpus - 1))); do one_gpu "$gpu" "alone$gpu" & done
           wait
           OPTS_TIMEOUT=250 opts parts ddp "$gpus" own10 bucket10 nocomm
           one_gpu 0 solo2
           python3 -c 'import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    print(path.stem, json.loads(path.read_text())["medians"])' "$OUT/parts" >> "$OUT/parts/parts.log" ;;
    kernels) mkdir -p "$OUT/kernels"
             kernels() {  # kernels GPUS NAME OPTION...
               timeout 250 python3 -m torch.distributed.run --standalone --nproc_per_node="$1" \
                 bench/ddp_step_kernels.py --options "${@:3}" --out "$OUT/kernels/$2.json" \
                 >> "$OUT/kernels/kernels.log" 2>&1
             }
             CUDA_VISIBLE_DEVICES=0 kernels 1 one bucket10
             kernels "$gpus" all nocomm bucket10
             (cd "$OUT/kernels" && python3 "$OLDPWD/bench/ddp_step_kernels.py" \
                --compare one.json:bucket10 all.json:nocomm && python3 \
                "$OLDPWD/bench/ddp_step_kernels.py" --compare all.json:nocomm all.json:bucket10) \
               > "$OUT/kernels/compare.txt" 2>&1 ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
