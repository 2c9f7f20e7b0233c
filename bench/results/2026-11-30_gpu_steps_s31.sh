#!/usr/bin/env bash
# Thirty-first session's device steps (run from the repo root on the lent machine, one H200):
#   bash bench/results/2026-11-30_gpu_steps_s31.sh STEP...
#   gpustep   the GPU tests of the optimizer step (tests/gpu/test_gpu_step.py: graphed against
#             eager, loss by loss, for every optimizer, with a schedule) and the one-GPU SBI
#             recipe with CUDA graphs, now on optim.WithoutDynamo's optimizers
#   dynwatch  a cold one-GPU CNN command (synthetic ResNet-18, 40 graphed steps) and a cold
#             one-GPU SBI command (two_moons_debug), every Python process watched by a
#             sitecustomize that writes a file with its command line and stack when it imports
#             torch._dynamo: which processes import it now (the command's own worker should
#             not; the background cluster's warm worker does, on purpose)
#   ab        bench/startup.py cold commands (MODES, default baseline_cold,cold; REPEATS rounds,
#             default 3; BASELINE, an absolute path: fc2ce36's package)
set -u
# shellcheck source=bench/device_env.sh
source bench/device_env.sh
dynwatch() {
  local hook work home
  hook=$(mktemp -d) work=$(mktemp -d) home=$(mktemp -d)
  cat > "$hook/sitecustomize.py" <<PY
import importlib.abc, os, sys, traceback
class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch._dynamo":
            with open(f"$hook/dynamo.{os.getpid()}", "w") as f:
                f.write(" ".join(sys.argv)[:300] + "\n")
                traceback.print_stack(file=f)
        return None
sys.meta_path.insert(0, _Watch())
PY
  for recipe in cnn/synthetic_resnet18_bench sbi/two_moons_debug; do
    rm -f "$hook"/dynamo.*
    local extra=(train.max_steps=40)
    [ "$recipe" = sbi/two_moons_debug ] && extra=(scaling.num_workers=1 scaling.use_gpu=true train.epochs=5)
    echo "== $recipe"
    (cd "$work" && CUDA_VISIBLE_DEVICES=0 TRAINFORGE_HOME="$home" PYTHONPATH="$hook:$PYTHONPATH" \
      timeout 200 python3 -m trainforge train "$OLDPWD/recipes/$recipe.yaml" "${extra[@]}" 2>&1 \
      | grep -E "workers|first step|finished|Error|error" | head -8)
    echo "-- imported torch._dynamo before the background start: $(find "$hook" -name 'dynamo.*' | wc -l)"
    PYTHONPATH="$hook:$PYTHONPATH" stop_background_cluster "$home"
    for f in "$hook"/dynamo.*; do [ -f "$f" ] && { echo "-- $f"; head -c 300 "$f"; echo; }; done
  done
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    gpustep) timeout "${LIMIT:-300}" python3 -m pytest -p no:cacheprovider -q -rA --tb=short \
               -W always tests/gpu/test_gpu_step.py \
               tests/gpu/test_sbi_gpu.py::test_sbi_recipe_on_one_gpu_with_cuda_graphs \
               tests/gpu/test_sbi_gpu.py::test_graphed_step_matches_the_eager_step \
               > "$OUT/$step${CALL:-}.log" 2>&1 ;;
    dynwatch) dynwatch > "$OUT/dynwatch${CALL:-}.log" 2>&1 ;;
    ab) REPEATS=${REPEATS:-3} startup_cold "ab${CALL:-}" 560 "${MODES:-baseline_cold,cold}" ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step${CALL:-}" $? "$t0"
done
