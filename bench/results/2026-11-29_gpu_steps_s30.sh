#!/usr/bin/env bash
# Thirtieth session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-11-29_gpu_steps_s30.sh STEP...
#   phases    bench/worker_start_phases.py: a cold GPU worker's start, step by step, in fresh
#             processes (VARIANTS: WarmWorker's order; the CUDA context on a thread; the CUDA
#             driver started through ctypes before torch's import; cuDNN and cuBLAS loaded on
#             a thread), REPEATS rounds (default 3); IMPORTTIME=1: one more under -X importtime
#   mlflowimp what the command's MLflow import costs on this host: `import mlflow` and its
#             client, twice (the first one reads the files from disk), the second under
#             -X importtime
#   spy       two cold commands one after the other in one new TRAINFORGE_HOME (as startup.py
#             runs them), each under `py-spy record --subprocesses --idle` (speedscope JSON,
#             50 samples/s), each console line timestamped: where the first command of a call
#             spends the 5-7 s between its setup line and its first step that later ones do not
#   jitcache  the CUDA driver's JIT cache (~/.nv/ComputeCache, or $CUDA_CACHE_PATH): its size
#             and file count, appended to $OUT/jitcache.log
#   sbicheck  one cold SBI command on GPU 0 (two_moons_debug, one worker, 5 epochs, the model
#             logged): the command logs the posterior pyfunc that rank 0 hands it
#             (tracking/relay.py); the run read back, the pyfunc loaded and sampled, nothing of
#             the relay left, and the console's lines other than trainforge's
#   flavourimp `import mlflow.pytorch` in fresh processes, as MLflow does it (this host's
#             Python has PyTorch Lightning, which it imports) and through
#             model_logging.pytorch_flavour (Lightning refused), two of each in turning order
#   ab        bench/startup.py cold commands (MODES, default baseline_cold,cold; REPEATS rounds)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
stamped() {  # each line of stdin with the seconds since it began
  python3 -u -c 'import sys, time
t = time.time()
for line in sys.stdin: print(f"{time.time() - t:7.2f} {line}", end="")'
}
spy() {
  local home work
  home=$(mktemp -d) work=$(mktemp -d)
  for n in 1 2; do
    (cd "$work" && CUDA_VISIBLE_DEVICES=0 TRAINFORGE_HOME="$home" timeout 200 py-spy record \
      --subprocesses --idle --rate 50 --format speedscope -o "$OUT/spy$n.speedscope.json" -- \
      python3 -m trainforge train "$OLDPWD/recipes/cnn/synthetic_resnet18_bench.yaml" \
      run.name="spy$n" train.max_steps=40 2>&1 | stamped)
    stop_background_cluster "$home"
  done
}
sbicheck() {
  local work home
  work=$(mktemp -d) home=$(mktemp -d)
  (cd "$work" && CUDA_VISIBLE_DEVICES=0 TRAINFORGE_HOME="$home" timeout 200 python3 -m trainforge \
    train "$OLDPWD/recipes/sbi/two_moons_debug.yaml" run.name=sbi scaling.num_workers=1 \
    scaling.use_gpu=true train.epochs=5 tracking.log_model=true tracking.system_metrics=true \
    > "$OUT/sbicheck_console.log" 2>&1)
  echo "command rc=$?"
  echo "console lines not trainforge's: $(grep -vc '^\[trainforge\]' "$OUT/sbicheck_console.log")"
  python3 - "$work" <<'PY'
import sys
from pathlib import Path

import mlflow
import numpy as np
from mlflow.tracking import MlflowClient

work = Path(sys.argv[1])
uri = f"sqlite:///{work / 'mlflow.db'}"
mlflow.set_tracking_uri(uri)
client = MlflowClient(uri)
(run,) = client.search_runs([client.get_experiment_by_name("trainforge").experiment_id])
print("status", run.info.status, "gpu tag", run.data.tags.get("gpu"))
print("system metrics", len([k for k in run.data.metrics if k.startswith("system/")]))
print("artifacts", [a.path for a in client.list_artifacts(run.info.run_id)])
models = client.search_logged_models([run.info.experiment_id])
print("logged models", [(m.name, m.source_run_id == run.info.run_id) for m in models])
loaded = mlflow.pyfunc.load_model(models[0].model_uri)
samples = loaded.predict(np.zeros((1, 2), dtype=np.float32), params={"num_samples": 5})
print("posterior samples", getattr(samples, "shape", None))
print("relay left", [p.name for p in (work / "runs" / "sbi").iterdir() if p.name.startswith("tracking-")])
PY
  stop_background_cluster "$home"
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    phases) CUDA_VISIBLE_DEVICES=0 timeout 400 python3 bench/worker_start_phases.py \
              --repeats "${REPEATS:-3}" ${IMPORTTIME:+--importtime} \
              --variants "${VARIANTS:-sequential,cuda_thread,driver_thread}" \
              --out "$OUT/phases${CALL:-}.json" \
              > "$OUT/phases${CALL:-}.log" 2>&1 ;;
    mlflowimp)
      for flags in "" "-X importtime"; do
        TIMEFORMAT="${flags:-plain}: %R s wall, %U s user"
        # shellcheck disable=SC2086 # the flags are two words, or none
        time python3 $flags -c "import mlflow; from mlflow.tracking import MlflowClient" \
          2> "$OUT/mlflowimp.txt"
      done > "$OUT/mlflowimp${CALL:-}.log" 2>&1 ;;
    jitcache) { echo "== ${CALL:-} $(date +%T)"; cache=${CUDA_CACHE_PATH:-$HOME/.nv/ComputeCache}
                du -sh "$cache"; find "$cache" -type f | wc -l; } >> "$OUT/jitcache.log" 2>&1 ;;
    sbicheck) sbicheck > "$OUT/sbicheck${CALL:-}.log" 2>&1 ;;
    spy) spy > "$OUT/spy${CALL:-}.log" 2>&1 ;;
    flavourimp)
      for how in plain ours plain ours; do
        if [ "$how" = plain ]; then code="import mlflow.pytorch"
        else code="from trainforge.tracking import model_logging; model_logging.pytorch_flavour()"; fi
        python3 -c "import sys, time; t = time.perf_counter(); exec(sys.argv[1]); \
print('$how', round(time.perf_counter() - t, 2), 's', 'lightning' in sys.modules \
or 'pytorch_lightning' in sys.modules)" "$code"
      done > "$OUT/flavourimp${CALL:-}.log" 2>&1 ;;
    ab) startup_cold "ab${CALL:-}" 560 "${MODES:-baseline_cold,cold}" ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step${CALL:-}" $? "$t0"
done
