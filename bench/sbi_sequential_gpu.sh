#!/usr/bin/env bash
# Sequential rounds on one GPU of a lent device machine, from the repo root:
#   OBS="1 2 3 4 5" STEPS="slcp tests" bash bench/sbi_sequential_gpu.sh
# (DEADLINE, SLCP_LIMIT, AT_ONCE, GPU_SHARE, TESTS_LIMIT: seconds and shares, defaults below)
# slcp: sequential NPE (TSNPE) on slcp, 5 rounds of 20,000 simulations (10^5 in all), one
#   command per sbibm observation in OBS, all at once on the GPU (bench/sbi_sequential.py:
#   its own Ray head, each round's run on Ray Train's group with a fifth of the GPU), the
#   npe_1e5 recipe with the spline flow that CUDA graphs capture (zuko_nsf, hidden 128);
#   round r0 trained once, by the first observation's command, and kept by the others;
#   each final posterior scored by C2ST at its observation (10,000 samples against sbibm's
#   references); the runs' folder /tmp/seqwork is kept while the host stays warm (a folder in the
#   repo is not: each call replaces the tree), so a call cut by its deadline resumes;
#   $OUT/slcp/
# tests: the GPU tier of sequential rounds (tests/gpu/test_gpu_rounds.py); $OUT/tests.log
set -u
source bench/device_env.sh
OBS=${OBS:-1 2 3 4 5}
for step in ${STEPS:-slcp}; do
  t0=$(date +%s)
  case "$step" in
    slcp)
      mkdir -p "$OUT/slcp" /tmp/seqwork
      # shellcheck disable=SC2086 # OBS is a list of observation numbers
      TRAINFORGE_HOME=/tmp/seqwork/home timeout -s INT "${SLCP_LIMIT:-540}" python3 \
        bench/sbi_sequential.py --recipe recipes/sbi/npe_1e5.yaml --task slcp --rounds 5 \
        --total 100000 --observations $OBS --concurrent-runs "${AT_ONCE:-5}" \
        --gpu-share "${GPU_SHARE:-0.2}" --c2st-workers 5 --deadline-s "${DEADLINE:-420}" \
        --work /tmp/seqwork --sbibm-path .device/sbibm_files \
        --out "$OUT/slcp/sbi_sequential_obs${OBS// /_}.json" \
        workload.estimator.model=zuko_nsf workload.estimator.hidden_features=128 \
        precision.cuda_graphs=true > "$OUT/slcp/bench_obs${OBS// /_}.log" 2>&1
      rc=$?
      cp /tmp/seqwork/*.log "$OUT/slcp/" 2>/dev/null
      ;;
    tests)
      timeout -s INT "${TESTS_LIMIT:-200}" python3 -m pytest -p no:cacheprovider -q -rA \
        --tb=short tests/gpu/test_gpu_rounds.py > "$OUT/tests.log" 2>&1
      rc=$?
      ;;
    *) echo "unknown step $step"; continue ;;
  esac
  step_done "$step" "$rc" "$t0"
done
