#!/usr/bin/env bash
# Twenty-eighth session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-11-29_gpu_steps_s28.sh STEP...
#   noprep    edit this checkout's copy ON THE DEVICE ONLY: rank 0 starts no `prepare_end`
#             thread (the end does those imports itself, after the loop); the edit is checked
#   ab        bench/startup.py, synthetic ResNet-18 on GPU 0, 40 graphed steps: the baseline
#             (.base27, 98f540c's runtime = this session's start, given as an absolute path)
#             cold and this checkout cold, in the order MODES gives (default baseline first);
#             REPEATS rounds (default 2). A call's first cold command waits 5.7-8.1 s for the
#             host's first cuDNN work (twenty-seventh session): not counted, and the calls
#             alternate which side goes first
#   long      ab with 2,000 steps (about 10 s of loop, one round by default): does a long loop
#             hide the thread's imports, or does it stall by as long as they take?
#   bound     the baseline cold with tracking.enabled=false: no MLflow in any process, the
#             most that moving MLflow out of rank 0 could gain; REPEATS rounds (default 2)
#   lite      this checkout cold with MLflow on but no model logged and no system metrics: what
#             is left is the MLflow import and connection in rank 0 and the command's run
#             (as run, startup.py added its private-Ray `baseline` mode to `--modes cold`;
#             it now runs the modes listed and no others)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
cold() {  # cold STEP LIMIT_S MODES OVERRIDE...
  local step=$1 limit=$2 modes=$3; shift 3
  CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-$limit}" python3 bench/startup.py \
    --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-2}" --baseline "$PWD/.base27" \
    --modes "$modes" --timeout-s 150 --out "$OUT/$step.json" train.max_steps="${STEPS:-40}" "$@" \
    > "$OUT/$step.log" 2>&1
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    noprep) python3 - > "$OUT/$step.log" 2>&1 <<'PY'
from pathlib import Path
path = Path("runtime/tracking/worker.py")
text = path.read_text()
marker = "        if not self.logs_metrics or not self.online or self.ctx.device.type != \"cuda\":\n            return\n"
assert text.count(marker) == 1, "prepare_end's guard moved: update this step"
path.write_text(text.replace(marker, "        return  # s28 A/B: no prepare_end thread\n" + marker))
print("prepare_end disabled in", path)
PY
    ;;
    ab) cold "ab${CALL:-}" 560 "${MODES:-baseline_cold,cold}" ;;
    long) STEPS=2000 REPEATS=${REPEATS:-1} cold "long${CALL:-}" 300 "${MODES:-baseline_cold,cold}" ;;
    bound) cold bound 300 baseline_cold tracking.enabled=false ;;
    lite) cold lite 250 cold tracking.log_model=false tracking.system_metrics=false ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step${CALL:-}" $? "$t0"
done
