#!/usr/bin/env bash
# Sourced by a session's device steps script (bench/results/*_gpu_steps_*.sh) on the lent GPU
# machine, in the repo root: the package bundle (.device, carried on the first call and
# unpacked into /tmp/site, kept while the host stays warm), this checkout importable as
# `trainforge`, the settings every step shares, and the host's facts in $OUT/host.txt.
if [ -f .device/setup.sh ]; then
  # shellcheck source=/dev/null
  source .device/setup.sh
else
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
mkdir -p /tmp/tf && ln -sfn "$PWD/runtime" /tmp/tf/trainforge
export PYTHONPATH="$PYTHONPATH:/tmp/tf:$PWD"
export RAY_DEDUP_LOGS=0 MLFLOW_DISABLE_TELEMETRY=true OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
# BYTECODE=1: compile the host's site-packages and the bundle to bytecode first, once per host.
# The lent hosts set PYTHONDONTWRITEBYTECODE=1 over a venv without .pyc files, so by default every
# process compiles torch's source again (`import torch` 3.5 s against 1.9 s with bytecode, torch
# and sympy 5.5 against 2.1 s; thirty-third session): that default overstates what a user whose
# pip wrote bytecode at install waits for. Results say which they ran with (host.txt).
if [ -n "${BYTECODE:-}" ] && [ ! -f /tmp/.bytecode-done ]; then
  python3 -m compileall -q -q -j 0 /tmp/site \
    "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null 2>&1
  touch /tmp/.bytecode-done
fi
# the CPUs this command may run on (not `nproc`: it honours OMP_NUM_THREADS)
[ -f "$OUT/host.txt" ] || { nvidia-smi -L
  python3 -c "import os; print(len(os.sched_getaffinity(0)), 'usable CPUs')"
  grep -m1 "model name" /proc/cpuinfo
  python3 -c "import torch; print(torch.__version__)"
  echo "bytecode compiled first (BYTECODE): ${BYTECODE:-no}"; } > "$OUT/host.txt" 2>&1

# the end of a step: its exit status and seconds, and the tail of what it wrote
step_done() {  # step_done STEP RC STARTED_AT
  echo "== $1 rc=$2 $(( $(date +%s) - $3 )) s"
  if [ -d "$OUT/$1" ]; then tail -n 3 "$OUT/$1"/*.log; else tail -4 "$OUT/$1.log"; fi | cut -c1-600
}

# one torchrun launch of bench/ddp_scaling_options.py (graphed SGD, batch 256, 2 repeats of each
# option; one more argument in OPTS_ARGS, e.g. --eager), its JSON in $OUT/STEP/NAME.json and its
# output in the step's log
opts() {  # opts STEP NAME GPUS OPTION... (environment variables before the call)
  local step=$1 name=$2 gpus=$3; shift 3
  mkdir -p "$OUT/$step"
  timeout "${OPTS_TIMEOUT:-200}" python3 -m torch.distributed.run --standalone --nproc_per_node="$gpus" \
    bench/ddp_scaling_options.py --options "$@" --repeats 2 ${OPTS_ARGS:+"$OPTS_ARGS"} \
    --out "$OUT/$step/$name.json" >> "$OUT/$step/$step.log" 2>&1
  echo "$name rc=$?" >> "$OUT/$step/$step.log"
}

# bench/startup.py on GPU 0 alone: the synthetic ResNet-18 recipe, 40 graphed steps, cold and
# warm commands and the hand-written torchrun script, REPEATS times; $OUT/STEP.{json,log}
start_one_gpu() {  # start_one_gpu STEP DEFAULT_LIMIT_S (LIMIT and REPEATS override)
  CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-$2}" python3 bench/startup.py \
    --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" \
    --modes cold,warm --torchrun bench/startup_torchrun_resnet.py --torchrun-procs 1 \
    --timeout-s 150 --out "$OUT/$1.json" train.max_steps=40 > "$OUT/$1.log" 2>&1
}

# bench/startup.py on GPU 0: cold commands (MODES, e.g. baseline_cold,cold) of the synthetic
# ResNet-18 recipe, STEPS graphed steps (default 40), REPEATS rounds (default 2), the baseline
# package from $BASELINE (an absolute path; default .base28 here); $OUT/STEP.{json,log}
startup_cold() {  # startup_cold STEP DEFAULT_LIMIT_S MODES OVERRIDE... (LIMIT overrides)
  local step=$1 limit=$2 modes=$3; shift 3
  CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-$limit}" python3 bench/startup.py \
    --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-2}" \
    --baseline "${BASELINE:-$PWD/.base28}" --modes "$modes" --timeout-s 150 \
    --out "$OUT/$step.json" train.max_steps="${STEPS:-40}" "$@" > "$OUT/$step.log" 2>&1
}

# after a cold command in TRAINFORGE_HOME=HOME: wait for the lasting cluster it starts in the
# background, then stop it, so that the next command is cold too
stop_background_cluster() {  # stop_background_cluster HOME
  TRAINFORGE_HOME="$1" python3 -c \
    "from trainforge.driver import background; background.wait(240)"
  TRAINFORGE_HOME="$1" python3 -m trainforge cluster stop
}

# the GPU tests whose runs take Ray Train's worker group (the test session's
# TRAINFORGE_WORKERS=private); $OUT/tests.log
raytrain_gpu_tests() {  # raytrain_gpu_tests (LIMIT: seconds, default 300)
  timeout -s INT "${LIMIT:-300}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
    tests/gpu/test_gpu_training.py tests/gpu/test_gpu_tracking.py > "$OUT/tests.log" 2>&1
}

# bench/startup.py on GPU 0, synthetic ResNet-18, 40 graphed steps: Ray Train's worker group on
# a private Ray, this checkout against the package in BASELINE_DIR (under the repo root),
# REPEATS (default 3) interleaved rounds; $OUT/start.{json,log}
raytrain_private_ray_start() {  # raytrain_private_ray_start BASELINE_DIR (LIMIT, REPEATS)
  CUDA_VISIBLE_DEVICES=0 timeout -s INT "${LIMIT:-300}" python3 bench/startup.py \
    --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-3}" \
    --baseline "$PWD/$1" --modes private_ray,baseline_private_ray \
    --timeout-s 150 --out "$OUT/start.json" train.max_steps=40 > "$OUT/start.log" 2>&1
}

# the steps of a session that measured Ray Train's start: `tests` (raytrain_gpu_tests) and
# `start` (raytrain_private_ray_start BASELINE_DIR), each ended by step_done
raytrain_steps() {  # raytrain_steps BASELINE_DIR STEP...
  local baseline=$1 step t0; shift
  for step in "$@"; do
    t0=$(date +%s)
    case "$step" in
      tests) raytrain_gpu_tests ;;
      start) raytrain_private_ray_start "$baseline" ;;
      *) echo "unknown step $step"; continue ;;
    esac
    step_done "$step" $? "$t0"
  done
}
