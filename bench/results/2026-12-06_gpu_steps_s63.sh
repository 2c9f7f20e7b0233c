#!/usr/bin/env bash
# Sixty-third session's device steps (run from the repo root on the lent machine, one GPU):
#   bash bench/results/2026-12-06_gpu_steps_s63.sh STEP...
#   start   bench/startup.py on GPU 0, synthetic ResNet-18, 40 graphed steps, REPEATS (default 2)
#           interleaved rounds after a warm-up command: Ray Train's worker group on a cluster
#           joined by address, this checkout against .base (the tree before the change), the
#           cold command, and the two hand-written anchors: the torchrun script and the same
#           steps as a Ray Train script (TorchTrainer) on a cluster joined by address
#   cudnn   four commands on the command's own processes, cuDNN's autotuning on, off, on, off:
#           the CUDA JIT cache's size around each, and each one's seconds from set-up to the
#           first step (whether the cache spares a later command the kernels' compile)
#   jitexit bench/jit_cache_probe.py: for each way a process may end (normal, os._exit, SIGTERM,
#           SIGKILL), a fresh JIT cache, one process that ends that way, then two that end
#           normally: whether they find the first one's kernels
#   jitcwd  bench/jit_cache_probe.py three times on a fresh JIT cache: in folder A, in A again,
#           in a new folder B: whether the cache spares a process in another working directory
# ANCHORS (default torchrun,raytrain; empty: none) names the anchors `start` times.
# With BYTECODE=1 (bench/device_env.sh) every package is compiled to bytecode first, as pip
# leaves an install; the lent hosts' default has none.
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
step_out="$OUT/${TAG:-plain}"
mkdir -p "$step_out"
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    start)
      anchors=()
      case ",${ANCHORS-torchrun,raytrain}," in *,torchrun,*)
        anchors+=(--torchrun bench/startup_torchrun_resnet.py) ;; esac
      case ",${ANCHORS-torchrun,raytrain}," in *,raytrain,*)
        anchors+=(--raytrain-script bench/startup_raytrain_resnet.py) ;; esac
      CUDA_VISIBLE_DEVICES=0 timeout -s INT "${LIMIT:-540}" python3 bench/startup.py \
        --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-2}" --warmup \
        --baseline "$PWD/.base" --modes "${MODES:-address,baseline_address,cold}" \
        "${anchors[@]}" --torchrun-procs 1 --timeout-s 150 \
        --out "$step_out/start.json" train.max_steps=40 > "$step_out/start.log" 2>&1 ;;
    cudnn)
      n=0
      for autotune in true false true false; do
        n=$((n + 1))
        { du -s ~/.nv/ComputeCache; find ~/.nv/ComputeCache -type f | wc -l; } \
          >> "$step_out/cudnn.log" 2>&1
        CUDA_VISIBLE_DEVICES=0 timeout 120 python3 bench/startup.py \
          --recipe cnn/synthetic_resnet18_bench --repeats 1 --modes private --timeout-s 100 \
          --out "$step_out/cudnn-$n-$autotune.json" train.max_steps=20 \
          "precision.cudnn_benchmark=$autotune" >> "$step_out/cudnn.log" 2>&1
      done
      { du -s ~/.nv/ComputeCache; find ~/.nv/ComputeCache -type f | wc -l; } \
        >> "$step_out/cudnn.log" 2>&1 ;;
    jitexit)
      for how in normal os_exit sigterm sigkill; do
        rm -rf "/tmp/jc-$how"
        for exit in "$how" normal normal; do
          CUDA_CACHE_PATH="/tmp/jc-$how" CUDA_VISIBLE_DEVICES=0 timeout 60 python3 \
            bench/jit_cache_probe.py --exit "$exit" >> "$step_out/jitexit.log" 2>&1
          echo "cache $how: $(find "/tmp/jc-$how" -type f | wc -l) files" >> "$step_out/jitexit.log"
        done
      done ;;
    jitcwd)
      rm -rf /tmp/jc-cwd && mkdir -p /tmp/cwd-a /tmp/cwd-b
      for folder in /tmp/cwd-a /tmp/cwd-a /tmp/cwd-b /tmp/cwd-b; do
        (cd "$folder" && CUDA_CACHE_PATH=/tmp/jc-cwd CUDA_VISIBLE_DEVICES=0 timeout 60 python3 \
          "$OLDPWD/bench/jit_cache_probe.py" --exit normal) >> "$step_out/jitcwd.log" 2>&1
        echo "in $folder: $(find /tmp/jc-cwd -type f | wc -l) files" >> "$step_out/jitcwd.log"
      done ;;
    *) echo "unknown step $step"; continue ;;
  esac
  echo "== $step rc=$? $(( $(date +%s) - t0 )) s"
  tail -n 4 "$step_out/$step.log" | cut -c1-400
done
