#!/usr/bin/env bash
# Twenty-first session's device steps (run from the repo root on the lent machine):
#   bash bench/results/2026-11-28_gpu_steps_s21.sh STEP...
#   start4   bench/startup.py, synthetic ResNet-18 on all the host's GPUs (4), 40 graphed
#            steps: cold (no cluster: the command's own worker processes, one per GPU; the
#            cluster and its warm workers started in the background after it), warm (the next
#            command, on what the background started), and the hand-written torchrun script's
#            time to its first step, interleaved, three repeats
#   cold4    one cold command of that recipe on the 4 GPUs with -v (every worker line), ended
#            by SIGINT after 240 s; the processes left then, the background start's log, and
#            one warm command after it: why the first start4 call printed nothing in 570 s
#   ddp4     bench/ddp_scaling_options.py (graphed SGD, batch 256): one GPU; 4 GPUs with 25 and
#            10 MB buckets and with no communication at all (the ceiling); then 25 and 10 MB
#            under NCCL_GRAPH_MIXING_SUPPORT=0, under CUDA_DEVICE_MAX_CONNECTIONS=1, and 25 MB
#            under NCCL_MIN_NCHANNELS=32 (one launch each)
#   ddp4b    the next call: the first ddp4's default launch again (it failed on nocomm's hook
#            annotations), and 10 and 5 MB buckets under CUDA_DEVICE_MAX_CONNECTIONS=1
#   stream4  DDP built on the stream its step is warmed up and captured on (bucket25, bucket10)
#            against a stream of its own (split25, split10, as before), 4 GPUs; then
#            tests/gpu/test_gpu_step.py (the graphed step equals the eager one, DDP on two GPUs).
#            It ran with a trial change of the runtime and bench that was not kept (no gain;
#            bench/results/README.md, twenty-first session): on main, split<N> is bucket<N>
#   alone4   one one-GPU graphed run alone, then four at once, one per GPU, no DDP: does a
#            fully loaded host slow a GPU (the 5% that DDP without communication still loses)?
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    start4) timeout "${LIMIT:-560}" python3 bench/startup.py \
           --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" \
           --modes cold,warm --torchrun bench/startup_torchrun_resnet.py --torchrun-procs 4 \
           --timeout-s 150 --out "$OUT/$step.json" train.max_steps=40 > "$OUT/$step.log" 2>&1 ;;
    cold4) recipe="$PWD/recipes/cnn/synthetic_resnet18_bench.yaml"
           export TRAINFORGE_HOME=/tmp/h4 && rm -rf /tmp/c4 && mkdir -p /tmp/c4
           (cd /tmp/c4 && timeout -s INT 240 python3 -m trainforge train -v "$recipe" \
              run.name=c4 train.max_steps=40 train.log_every_steps=10) > "$OUT/cold4.log" 2>&1
           echo "cold4 rc=$?" >> "$OUT/cold4.log"
           # shellcheck disable=SC2009  # ps: each process's elapsed time, which pgrep lacks
           ps -eo pid,etimes,args | grep -E "trainforge|ray" | grep -v grep | cut -c1-250 \
             >> "$OUT/cold4.log"
           python3 -c "from trainforge.driver import own_workers as o
print('background done:', o.wait_for_background(150))" >> "$OUT/cold4.log" 2>&1
           cp /tmp/h4/local-cluster/background.log "$OUT/cold4_background.log"
           (cd /tmp/c4 && timeout -s INT 120 python3 -m trainforge train "$recipe" \
              run.name=w4 train.max_steps=40 train.log_every_steps=10) > "$OUT/warm4.log" 2>&1
           echo "warm4 rc=$?" >> "$OUT/warm4.log"
           python3 -m trainforge cluster stop >> "$OUT/warm4.log" 2>&1 ;;
    ddp4) opts "$step" one_gpu 1 bucket25
          opts "$step" four 4 bucket25 bucket10 nocomm
          NCCL_GRAPH_MIXING_SUPPORT=0 opts "$step" mix0 4 bucket25 bucket10
          CUDA_DEVICE_MAX_CONNECTIONS=1 opts "$step" mc1 4 bucket25 bucket10
          NCCL_MIN_NCHANNELS=32 opts "$step" ch32 4 bucket25 ;;
    ddp4b) opts "$step" four 4 bucket25 bucket10 nocomm
           CUDA_DEVICE_MAX_CONNECTIONS=1 opts "$step" mc1 4 bucket10 bucket5 ;;
    stream4) opts "$step" four 4 split25 bucket25 split10 bucket10
           timeout 200 python3 -m pytest -p no:cacheprovider -q -rA -W always \
             tests/gpu/test_gpu_step.py > "$OUT/$step/gpu_step.log" 2>&1
           echo "gpu_step rc=$?" >> "$OUT/$step/$step.log" ;;
    alone4) opts "$step" alone 1 bucket25
           for gpu in 0 1 2 3; do
             CUDA_VISIBLE_DEVICES=$gpu opts "$step" "at_once_gpu$gpu" 1 bucket25 &
           done
           wait ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" $? "$t0"
done
