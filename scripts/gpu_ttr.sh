#!/usr/bin/env bash
# Issue 25's time-to-result runs on a lent GPU machine, in calls of at most 10 minutes: a sweep of
# 600 s (plus the command's own start) runs in a session of its own, started by one call and
# collected by the next (the machine stays up between calls that follow each other closely).
#
#   scripts/gpu_ttr.sh setup                 unpack the offline bundle (WF_SITE_TAR) and bubblewrap (WF_BWRAP_DEB)
#   scripts/gpu_ttr.sh smoke OUT             every configs/unseen baseline built and run once (smoke.sh), doctor
#   scripts/gpu_ttr.sh start OUT NAME CONFIG BUDGET [--no-sanitize-run]
#                                            bench_time_to_result.py in the background (setsid): OUT/NAME/
#   scripts/gpu_ttr.sh wait OUT NAME SECONDS wait for it (at most SECONDS), then print its table
#   scripts/gpu_ttr.sh pack OUT              OUT/ttr.tar.gz: logs, tables, each run without references/
# CUDA_VISIBLE_DEVICES picks the GPUs a run sees (a two-GPU host runs two one-GPU sweeps at once).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:?setup, smoke, start, wait or pack}
if [ -d /opt/wfsite/ray ]; then export PYTHONPATH="/opt/wfsite:$PWD"; fi
[ -x /opt/bw/usr/bin/bwrap ] && export PATH="/opt/bw/usr/bin:$PATH"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
case "$mode" in
  setup)
    mkdir -p /opt/wfsite && tar -xJf "${WF_SITE_TAR:?}" -C /opt/wfsite
    dpkg -x "${WF_BWRAP_DEB:?}" /opt/bw
    export PYTHONPATH="/opt/wfsite:$PWD" PATH="/opt/bw/usr/bin:$PATH"
    "$PY" -m cluster.cli doctor ;;
  smoke)
    OUT=${2:?OUT}; mkdir -p "$OUT"
    { date -u +%FT%TZ; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv; nproc;
      "$PY" --version; nvcc --version | tail -1; } >"$OUT/machine.txt" 2>&1
    bash configs/unseen/smoke.sh 2>&1 | tee "$OUT/smoke_unseen.log" ;;
  start)
    OUT=${2:?OUT}; name=${3:?NAME}; config=${4:?CONFIG}; budget=${5:?BUDGET}; shift 5
    mkdir -p "$OUT/$name"
    setsid nohup "$PY" scripts/bench_time_to_result.py --out "$OUT/$name" --config "$config" --budget "$budget" "$@" \
      >"$OUT/$name/bench.log" 2>&1 < /dev/null &
    echo $! >"$OUT/$name/pid"; echo "started $name: pid $(cat "$OUT/$name/pid")" ;;
  wait)
    OUT=${2:?OUT}; name=${3:?NAME}; limit=${4:?SECONDS}; pid=$(cat "$OUT/$name/pid")
    for _ in $(seq "$limit"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && echo "$name still running" || echo "$name done"
    tail -n 30 "$OUT/$name/bench.log" ;;
  pack)
    OUT=${2:?OUT}
    tar -czf "$OUT/ttr.tar.gz" --exclude='references' --exclude='*.bin' --exclude='variant_sources' \
      --exclude='optuna.journal' -C "$OUT" . 2>/dev/null
    ls -la "$OUT/ttr.tar.gz" ;;
esac
