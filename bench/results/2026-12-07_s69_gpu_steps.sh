#!/usr/bin/env bash
# The sixty-ninth session's device calls (one H100), from the repo root:
#   STEPS="tests seq" OBS="1 2 3 4 5 6" bash bench/results/2026-12-07_s69_gpu_steps.sh
# tests: the rounds' unit tests on the GPU machine (the prior's truncation runs on its GPU);
#   $OUT/tests.log
# seq: sequential NPE (TSNPE) on slcp, 5 rounds of 20,000 simulations (10^5 in all), one
#   command per sbibm observation in OBS, all at once on one GPU (bench/sbi_sequential.py),
#   with the flow that CUDA graphs capture (zuko_nsf); sbibm's files for slcp carried in
#   .device/sbibm_files (the GPU machine cannot fetch the wheel); $OUT/seq/
set -u
source bench/device_env.sh
for step in ${STEPS:-tests seq}; do
  t0=$(date +%s)
  case "$step" in
    tests)
      timeout 200 python3 -m pytest -p no:cacheprovider -q tests/unit/test_sbi_rounds.py \
        > "$OUT/tests.log" 2>&1
      rc=$?
      ;;
    seq)
      mkdir -p "$OUT/seq"
      # shellcheck disable=SC2086
      timeout "${SEQ_LIMIT:-560}" python3 bench/sbi_sequential.py --task slcp --rounds 5 \
        --simulations 20000 --observations ${OBS:-1 2 3 4 5 6} --concurrent-runs "${AT_ONCE:-6}" \
        --gpu-share "${SHARE:-0.15}" --c2st-workers "${C2ST_WORKERS:-6}" \
        --sbibm-path .device/sbibm_files --deadline-s "${DEADLINE:-480}" \
        --out "$OUT/seq/slcp_seq.json" \
        workload.estimator.model=zuko_nsf precision.cuda_graphs=true > "$OUT/seq/bench.log" 2>&1
      rc=$?
      ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" "$rc" "$t0"
done
