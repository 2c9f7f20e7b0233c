#!/usr/bin/env bash
# Issue 13, second device call on the same warm 4-GPU host: DDP and NCCL options against the
# weak scaling of the graphed step (bench/ddp_scaling_options.py), one launch per NCCL setting.
set -u
export RAY_DEDUP_LOGS=0 MLFLOW_DISABLE_TELEMETRY=true OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
options() {  # NAME TIMEOUT GPUS [ENV=VALUE ...] -- OPTIONS...
  local name=$1 limit=$2 gpus=$3; shift 3
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local t0; t0=$(date +%s)
  env "${envs[@]}" timeout "$limit" python3 -m torch.distributed.run --standalone \
    --nproc_per_node="$gpus" bench/ddp_scaling_options.py --out "$OUT/$name.json" \
    --options "$@" --repeats 2 > "$OUT/$name.log" 2>&1
  echo "$name (${envs[*]}) rc=$? $(( $(date +%s) - t0 )) s"; grep '^\[ddp\]' "$OUT/$name.log"
  grep -m3 -i "capture failed\|error" "$OUT/$name.log" | cut -c1-300
}
options one_gpu 90 1 -- bucket25
options default 200 4 -- bucket25 bucket10 bf16 nobuffers
options channels8 120 4 NCCL_MAX_NCHANNELS=8 -- bucket25 bf16
options channels4 90 4 NCCL_MAX_NCHANNELS=4 -- bucket25
options channels16 90 4 NCCL_MAX_NCHANNELS=16 -- bucket25
