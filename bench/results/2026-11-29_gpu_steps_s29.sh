#!/usr/bin/env bash
# Twenty-ninth session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-11-29_gpu_steps_s29.sh STEP...
#   gpucheck  one cold command of this checkout (synthetic ResNet-18 on GPU 0, 300 graphed
#             steps, system metrics every second): its MLflow run read back — the GPU's
#             system metrics that the command now samples (tracking/relay.py), rank 0's tags,
#             metrics, dataset and artifacts, the logged model (the command logs it from call
#             3 on), and nothing of the relay left in the run folder.
#             It is also the call's first cold command, which waits longer for the host's
#             first cuDNN work (twenty-seventh session): nothing of it is timed
#   ab        bench/startup.py, 40 graphed steps: the baseline (.base28, b75236c's runtime =
#             this session's start, given as an absolute path) cold and this checkout cold
#             (calls 1-2: 4c65cc1, the relay; call 3: the command logs the model too), in
#             the order MODES gives (default baseline first); REPEATS rounds (default 2)
#   bound     this checkout cold with tracking.enabled=false: no MLflow in any process, the
#             floor for the relay's first step; REPEATS rounds (default 1)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
cold() {  # cold STEP LIMIT_S MODES OVERRIDE...
  local step=$1 limit=$2 modes=$3; shift 3
  CUDA_VISIBLE_DEVICES=0 timeout "${LIMIT:-$limit}" python3 bench/startup.py \
    --recipe cnn/synthetic_resnet18_bench --repeats "${REPEATS:-2}" --baseline "$PWD/.base28" \
    --modes "$modes" --timeout-s 150 --out "$OUT/$step.json" train.max_steps="${STEPS:-40}" "$@" \
    > "$OUT/$step.log" 2>&1
}
gpucheck() {
  local work home
  work=$(mktemp -d) home=$(mktemp -d)
  (cd "$work" && CUDA_VISIBLE_DEVICES=0 TRAINFORGE_HOME="$home" timeout 200 python3 -m trainforge \
    train "$OLDPWD/recipes/cnn/synthetic_resnet18_bench.yaml" run.name=check \
    train.max_steps=300 tracking.system_metrics_interval_s=1)
  echo "command rc=$?"
  python3 - "$work" <<'PY'
import sys
from pathlib import Path
from mlflow.tracking import MlflowClient
work = Path(sys.argv[1])
client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
(run,) = client.search_runs([client.get_experiment_by_name("trainforge").experiment_id])
keys = sorted(run.data.metrics)
print("status", run.info.status)
print("gpu tag", run.data.tags.get("gpu"), "world_size", run.data.tags.get("world_size"))
print("system metrics", [k for k in keys if k.startswith("system/")])
print("train/loss points", len(client.get_metric_history(run.info.run_id, "train/loss")))
print("datasets", [i.dataset.name for i in run.inputs.dataset_inputs])
print("artifacts", [a.path for a in client.list_artifacts(run.info.run_id)])
models = client.search_logged_models([run.info.experiment_id])
print("logged models", [(m.name, m.source_run_id == run.info.run_id) for m in models])
print("relay left", [p.name for p in (work / "runs" / "check").iterdir() if p.name.startswith("tracking-")])
PY
  TRAINFORGE_HOME="$home" python3 -c "from trainforge.driver import own_workers; own_workers.wait_for_background(240)"
  TRAINFORGE_HOME="$home" python3 -m trainforge cluster stop
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    gpucheck) gpucheck > "$OUT/$step.log" 2>&1 ;;
    ab) cold "ab${CALL:-}" 560 "${MODES:-baseline_cold,cold}" ;;
    bound) REPEATS=${REPEATS:-1} cold "bound${CALL:-}" 250 cold tracking.enabled=false ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step${CALL:-}" $? "$t0"
done
