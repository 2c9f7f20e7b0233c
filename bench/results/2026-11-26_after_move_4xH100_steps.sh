#!/usr/bin/env bash
# Device steps, named on the command line, run in order on one warm host:
#   gpu       GPU tests on the moved code
#   cnn_new   bench/cnn_throughput.py on the moved code;  cnn_old: on the pre-move commit a1b5699
#   sbi_new   bench/sbi_scaling.py on the moved code;     sbi_old: on a1b5699
set -u
source .device/setup.sh
mkdir -p /tmp/tf && ln -sfn "$PWD/runtime" /tmp/tf/trainforge
NEW_PP="$PYTHONPATH:/tmp/tf:$PWD"
OLD_PP="$PYTHONPATH:$PWD/.baseline"
export RAY_DEDUP_LOGS=0 MLFLOW_DISABLE_TELEMETRY=true
[ -f "$OUT/gpus.txt" ] || { nvidia-smi -L; python3 -c "import torch; print(torch.__version__)"; } > "$OUT/gpus.txt"
for step in "$@"; do
  t0=$(date +%s); tag="$step-$(date +%H%M%S)"
  case "$step" in
    gpu) PYTHONPATH="$NEW_PP" OMP_NUM_THREADS=4 timeout 290 python3 -m pytest -m gpu tests/gpu \
           tests/unit/test_data_types.py -v -s -p no:cacheprovider > "$OUT/$tag.log" 2>&1 ;;
    gpu2) PYTHONPATH="$NEW_PP" OMP_NUM_THREADS=4 timeout 280 python3 -m pytest -m gpu \
           tests/gpu/test_sbi_gpu.py -k "two_gpus or cannot or streamed" tests/unit -v -s \
           -p no:cacheprovider > "$OUT/$tag.log" 2>&1 ;;
    gpu3) PYTHONPATH="$NEW_PP" OMP_NUM_THREADS=4 timeout 120 python3 -m pytest -m gpu tests/unit \
           -v -p no:cacheprovider > "$OUT/$tag.log" 2>&1 ;;
    cnn_new) PYTHONPATH="$NEW_PP" OMP_NUM_THREADS=4 timeout 200 python3 bench/cnn_throughput.py \
           --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1 ;;
    cnn_old) (cd .baseline && PYTHONPATH="$OLD_PP" OMP_NUM_THREADS=4 timeout 200 python3 \
           bench/cnn_throughput.py --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1) ;;
    sbi_new) PYTHONPATH="$NEW_PP" timeout 280 python3 bench/sbi_scaling.py --out "$OUT/$tag.json" \
           > "$OUT/$tag.log" 2>&1 ;;
    sbi_old) (cd .baseline && PYTHONPATH="$OLD_PP" timeout 280 python3 bench/sbi_scaling.py \
           --out "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1) ;;
  esac
  echo "$tag rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$OUT/steps.txt"
  tail -4 "$OUT/$tag.log"
done
