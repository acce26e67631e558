#!/usr/bin/env bash
# The GPU measurements of issues 13-16, in the calls a lease of fixed length allows. From the
# repository root, on a GPU machine whose Python has warpfleet's dependencies (or with them unpacked
# by WF_SITE_TAR, a tar.xz of site-packages, and bubblewrap by WF_BWRAP_DEB, a Debian package):
#
#   scripts/gpu_session.sh single OUT    one GPU: doctor, the GPU tests (the attacks with CUDA targets, the
#                                        kernel runner's cheat checks, the persistent runner, the agents'),
#                                        the sandbox's cost with a CUDA program
#   scripts/gpu_session.sh scaling OUT   every GPU of the host: a suite sweep of flags and params on 4, 2
#                                        and 1 GPUs (bench_scaling.py); a count takes up to 9 minutes with
#                                        SEARCH_S=420 (about 200 candidates): COUNTS=1, 2, 4 a call each
#   scripts/gpu_session.sh scaling12 OUT four GPUs: the suite sweep on 1 GPU (card 0, cores 0-15) and on 2
#                                        (cards 1-2, cores 16-47) at the same time, 30 trials a target (210
#                                        candidates); meanwhile on card 3 (cores 48-63) the Kernel Tuner
#                                        comparison's repeated runs (the same-winner rate) and the kernel
#                                        runner's fixed cost
#   scripts/gpu_session.sh scaling4 OUT  four GPUs: the same sweep on all four (16 cores a GPU), then the
#                                        simulated fleet (sim): merge with scaling12's by bench_scaling --report
#   scripts/gpu_session.sh halves OUT    the suite with the agents on (cards 0-1, or 0 of two) and the public
#                                        suite with the agents on (cards 2-3, or 1) at the same time; TARGETS=
#                                        a,b,... for some public programs, SUITE=a,b,... for some suite targets
#   scripts/gpu_session.sh sim OUT       the driver on a simulated fleet of 64 and 16 workers (bench_sim.py)
#   scripts/gpu_session.sh agents OUT    every GPU: the suite with the agents on (bench_agents.py); SUITE=a,b,...
#                                        for some of its targets
#   scripts/gpu_session.sh public OUT    every GPU: the public suite with the agents on (bench_public.py);
#                                        TARGETS=a,b,... for some of them
#   scripts/gpu_session.sh last OUT      one GPU: the Kernel Tuner comparison's one-GPU runs, the kernel
#                                        runner's fixed cost, the public cs_transpose with the agents on
#   scripts/gpu_session.sh ab OUT        one GPU: the Kernel Tuner comparison's one-GPU runs twice, with the
#                                        search's sample cap (measure.search_samples) and without, the tools
#                                        in turn on the card; the kernel runner's fixed cost
#   scripts/gpu_session.sh actor OUT     one GPU: where a measuring actor's time goes per job besides the run
#                                        (bench_runners.py --actor: the NVML monitor, staging, the run)
#   scripts/gpu_session.sh recheck OUT   one GPU: the comparison's one-GPU runs again (the search unmonitored),
#                                        regpressure and conv2d with the agents on (the constant expert), the
#                                        GPU tests of the sweep's telemetry and of the constant expert
#   scripts/gpu_session.sh stack OUT     one GPU: the suite's targets where several changes are accepted
#                                        (regpressure, conv2d, multikernel) with the agents on and stacking
#   scripts/gpu_session.sh inputs OUT    one GPU: the comparison's one-GPU runs (inputs kept per array), the
#                                        kernel runner's and the persistent runner's GPU tests
#   scripts/gpu_session.sh stage OUT     one GPU: the shared_stage expert's GPU tests, then the suite's unroll
#                                        target with the agents on (SUITE= for others)
#   scripts/gpu_session.sh checks OUT    one GPU: the agents' GPU tests, and two public programs with the agents
#                                        on (TARGETS=, default pb_2mm,cs_transpose): each verdict's seconds
#   scripts/gpu_session.sh kernels OUT   every GPU: Kernel Tuner against warpfleet's kernel targets on 1, 2
#                                        and 4 GPUs (bench_kerneltuner.py), the kernel runner's fixed cost
#
# One session a device call: each ends within about 9.5 minutes (the attacks with CUDA targets took
# 74 s on an H200: `python3 -m pytest -m gpu tests/cluster/engine/test_attacks.py`).
#
# Each step runs under its own time limit (STEP_SCALE multiplies them), its output in OUT/logs/STEP.log
# and a line in OUT/steps.tsv (step, exit status, seconds); a step that fails or runs out of time does
# not stop the next. At the end OUT/logs and the small results are packed into OUT/<session>.tar.gz
# (a device lease returns few files).
set -uo pipefail
cd "$(dirname "$0")/.."
session=${1:?single, scaling, scaling12, scaling4, halves, sim, agents, public, kernels, ab, actor, recheck, stack, inputs, checks, stage or last}
OUT=$(mkdir -p "${2:?OUT}" && cd "$2" && pwd)
mkdir -p "$OUT/logs"
scale=${STEP_SCALE:-1}
T0=$(date +%s)

if [ -n "${WF_SITE_TAR:-}" ] && [ ! -d /opt/wfsite/ray ]; then
  mkdir -p /opt/wfsite && tar -xJf "$WF_SITE_TAR" -C /opt/wfsite
fi
if [ -n "${WF_SITE_TAR:-}" ]; then export PYTHONPATH="/opt/wfsite:$PWD"; else export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"; fi
if [ -n "${WF_BWRAP_DEB:-}" ] && ! command -v bwrap >/dev/null; then
  [ -x /opt/bw/usr/bin/bwrap ] || dpkg -x "$WF_BWRAP_DEB" /opt/bw
  export PATH="/opt/bw/usr/bin:$PATH"
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
PY=${PYTHON:-python3}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  limit=$(awk -v l="$limit" -v s="$scale" 'BEGIN { printf "%d", l * s }')
  local start; start=$(date +%s)
  echo "[$(date +%T)] $name (at most ${limit} s): $*" | tee -a "$OUT/steps.log"
  timeout -k 15 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - start ))
  printf '%s\t%s\t%s\n' "$name" "$rc" "$took" >>"$OUT/steps.tsv"
  echo "[$(date +%T)] $name: exit $rc in ${took} s; last lines:" | tee -a "$OUT/steps.log"
  tail -n 4 "$OUT/logs/$name.log" | cut -c1-300 | tee -a "$OUT/steps.log"
}

machine() {
  { date -u +%FT%TZ; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv;
    nproc; "$PY" --version; nvcc --version | tail -1; } >"$OUT/logs/machine.txt" 2>&1
}

pack() {  # pack NAME PATH... : one tar of the logs and the named results (run directories without their outputs)
  local name=$1; shift
  tar -czf "$OUT/$name.tar.gz" --exclude='references' --exclude='*.bin' --exclude='variant_sources' \
    -C "$OUT" logs steps.tsv steps.log "$@" 2>/dev/null
  echo "packed $OUT/$name.tar.gz ($(du -h "$OUT/$name.tar.gz" | cut -f1)) after $(( $(date +%s) - T0 )) s"
}

case "$session" in
  single)
    machine
    step doctor 60 "$PY" -m cluster.cli doctor --gpu
    step gpu_tests 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/cluster/engine/test_attacks.py \
      tests/cluster/runners/test_kernel_gpu.py tests/cluster/runners/test_persistent.py
    step gpu_tests_agents 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/agents/test_streamify_gpu.py \
      tests/agents/test_vectorize.py tests/cluster/engine/test_gpu_agents.py
    step sandbox 75 "$PY" scripts/bench_sandbox.py --repeat 40 --cuda --json "$OUT/bench_sandbox.json"
    pack single bench_sandbox.json ;;
  scaling)  # COUNTS (default 4,2,1, or 2,1 on a smaller host); SEARCH_S: the search budget of one GPU (plus 60 s a count: the sweep's budget),
    # divided among more (420 s: at the 28.6 candidates/min of one H200 on the suite, about 200 candidates)
    machine
    counts=${COUNTS:-4,2,1}; [ "$ngpu" -ge 4 ] || counts=${COUNTS:-2,1}
    search=${SEARCH_S:-420}; budgets=""; kills=""; total=0
    for c in ${counts//,/ }; do
      b=$(( search / c + 60 )); k=$(( b + 30 )); total=$(( total + k + 15 ))
      budgets="$budgets${budgets:+,}$c:$b"; kills="$kills${kills:+,}$c:$k"
    done
    step scaling "$total" "$PY" scripts/bench_scaling.py configs/suite.yaml --counts "$counts" --trials 30 \
      --out "$OUT/scaling" --time-budget "$budgets" --child-timeout-s "$kills"
    pack scaling scaling/scaling.json scaling/scaling.md scaling/count-4.log scaling/count-2.log \
      scaling/count-1.log scaling/runs-4 scaling/runs-2 scaling/runs-1 ;;
  scaling12)  # counts 1 and 2 at once, each with 16 cores a GPU; the kernel comparison's repeats on card 3
    machine
    pin=(); command -v taskset >/dev/null && pin=(taskset -c 48-63)
    step scaling12 560 "$PY" scripts/bench_scaling.py configs/suite.yaml --counts 1,2 --concurrent --cpus-per-gpu 16 \
      --trials 30 --out "$OUT/scaling" --time-budget 1:515,2:360 --child-timeout-s 1:540,2:540 &
    { step kt_repeats 500 env CUDA_VISIBLE_DEVICES=3 "${pin[@]}" "$PY" scripts/bench_kerneltuner.py --out "$OUT/kt" \
        --gpus 1 --wf-kind kernel --seeds 1 --repeats 3 --strategies best --max-evals 40 --budget-s 480 \
        --wf-compile-workers 8
      step kernel_fixed 40 env CUDA_VISIBLE_DEVICES=3 "${pin[@]}" "$PY" scripts/bench_runners.py configs/kernels.yaml \
        --repeats 5 --out "$OUT/kernel_fixed"; } &
    wait
    pack scaling12 scaling/scaling.json scaling/scaling.md scaling/count-1.json scaling/count-2.json \
      scaling/count-1.log scaling/count-2.log scaling/runs-1 scaling/runs-2 kt/report.md kt/summary.parquet \
      kt/meta.json kt/raw kt/logs kernel_fixed ;;
  scaling4)  # count 4 with 16 cores a GPU (as scaling12's), then the simulated fleet on this host's cores
    machine
    step scaling4 300 "$PY" scripts/bench_scaling.py configs/suite.yaml --counts 4 --cpus-per-gpu 16 --trials 30 \
      --out "$OUT/scaling" --time-budget 4:210 --child-timeout-s 4:280
    step sim 120 "$PY" scripts/bench_sim.py --workers 64 --run-s 1.0 --candidates-per-worker 12 --sampler random \
      --out "$OUT/sim"
    step sim50 75 "$PY" scripts/bench_sim.py --workers 16 --run-s 0.05 --candidates-per-worker 40 --sampler random \
      --out "$OUT/sim50"
    pack scaling4 scaling/scaling.json scaling/scaling.md scaling/count-4.json scaling/count-4.log scaling/runs-4 \
      sim sim50 ;;
  halves)  # the suite (cards 0-1) and the public suite (cards 2-3) with the agents on, at the same time
    machine
    first=0,1 second=2,3; [ "$ngpu" -ge 4 ] || { first=0; second=1; }
    step agents 555 env CUDA_VISIBLE_DEVICES=$first "$PY" scripts/bench_agents.py --out "$OUT/agents" --trials 8 \
      --hand-repeats 2 --time-budget 480 --no-profile ${SUITE:+--targets "$SUITE"} &
    step public 555 env CUDA_VISIBLE_DEVICES=$second "$PY" scripts/bench_public.py --out "$OUT/public" --trials 8 \
      --hand-repeats 2 --time-budget 480 --no-profile ${TARGETS:+--targets "$TARGETS"} &
    wait
    pack halves agents public ;;
  sim)  # the driver on a simulated fleet of 64 workers, on a host with the cores for it
    machine
    step sim 120 "$PY" scripts/bench_sim.py --workers 64 --run-s 1.0 --candidates-per-worker 12 --sampler random \
      --out "$OUT/sim"
    step sim50 90 "$PY" scripts/bench_sim.py --workers 16 --run-s 0.05 --candidates-per-worker 40 --sampler random \
      --out "$OUT/sim50"
    pack sim sim sim50 ;;
  kernels)
    machine
    gpus=4; [ "$ngpu" -ge 4 ] || gpus=$ngpu; [ "$gpus" -ne 3 ] || gpus=2
    step kt_compare 395 "$PY" scripts/bench_kerneltuner.py --out "$OUT/kt" --gpus "$gpus" --wf-kind kernel \
      --budget-s 380 --seeds 2 --repeats 3 --max-evals 40 --wf-compile-workers 8
    step kernel_fixed 40 "$PY" scripts/bench_runners.py configs/kernels.yaml --repeats 5 --out "$OUT/kernel_fixed"
    step kernel_tests 120 "$PY" -m pytest -q -m gpu tests/cluster/runners/test_kernel_gpu.py
    pack kernels kt/report.md kt/summary.parquet kt/meta.json kt/raw kt/logs kernel_fixed ;;
  agents)  # every GPU: the suite with the agents on (six targets took 284 s on four H200s, hand figures
    # included); the analysts' profile kept, the winners' not (--no-profile)
    machine
    step agents 555 "$PY" scripts/bench_agents.py --out "$OUT/agents" --trials 8 --hand-repeats 2 --time-budget 480 \
      --no-profile ${SUITE:+--targets "$SUITE"}
    pack agents agents ;;
  last)  # one GPU, one call: the Kernel Tuner comparison's one-GPU runs (the tools in turn; 3 runs of seed
    # 0 a kernel, for the same-winner rate), the kernel runner's fixed cost, then the public suite's
    # cs_transpose with the agents on (its hand version is the sample's padded tile)
    machine
    step kt_compare 245 "$PY" scripts/bench_kerneltuner.py --out "$OUT/kt" --gpus 1 --wf-kind kernel --seeds 1 \
      --repeats 3 --strategies best --max-evals 40 --budget-s 230 --wf-compile-workers 8
    step kernel_fixed 30 "$PY" scripts/bench_runners.py configs/kernels.yaml --repeats 5 --out "$OUT/kernel_fixed"
    step public 290 "$PY" scripts/bench_public.py --out "$OUT/public" --trials 8 --hand-repeats 2 --time-budget 240 \
      --no-profile --targets cs_transpose
    pack last kt/report.md kt/summary.parquet kt/meta.json kt/raw kt/logs kernel_fixed public ;;
  ab)  # one GPU: the one-GPU comparison with the search's sample cap (the default) and without, in turn
    machine
    step kt_cap 245 "$PY" scripts/bench_kerneltuner.py --out "$OUT/kt_cap" --gpus 1 --wf-kind kernel --seeds 1 \
      --repeats 3 --strategies best --max-evals 40 --budget-s 230 --wf-compile-workers 8
    step kt_nocap 245 "$PY" scripts/bench_kerneltuner.py --out "$OUT/kt_nocap" --gpus 1 --wf-kind kernel --seeds 1 \
      --repeats 3 --strategies best --max-evals 40 --budget-s 230 --wf-compile-workers 8 --wf-search-samples none
    step kernel_fixed 30 "$PY" scripts/bench_runners.py configs/kernels.yaml --repeats 5 --out "$OUT/kernel_fixed"
    pack ab kt_cap/report.md kt_cap/summary.parquet kt_cap/meta.json kt_cap/raw kt_cap/logs kt_nocap/report.md \
      kt_nocap/summary.parquet kt_nocap/meta.json kt_nocap/raw kt_nocap/logs kernel_fixed ;;
  inputs)  # one GPU, about 4 minutes
    machine
    step kt_compare 245 "$PY" scripts/bench_kerneltuner.py --out "$OUT/kt" --gpus 1 --wf-kind kernel --seeds 1 \
      --repeats 3 --strategies best --max-evals 40 --budget-s 230 --wf-compile-workers 8
    step gpu_tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/cluster/runners/test_kernel_gpu.py \
      tests/cluster/runners/test_persistent.py
    pack inputs kt/report.md kt/summary.parquet kt/meta.json kt/raw kt/logs ;;
  stack)  # one GPU, about 6 minutes
    machine
    step agents 520 "$PY" scripts/bench_agents.py --out "$OUT/agents" --trials 12 --hand-repeats 2 --time-budget 450 \
      --no-profile --targets regpressure,conv2d,multikernel
    pack stack agents ;;
  recheck)  # one GPU, about 8 minutes
    machine
    step kt_compare 245 "$PY" scripts/bench_kerneltuner.py --out "$OUT/kt" --gpus 1 --wf-kind kernel --seeds 1 \
      --repeats 3 --strategies best --max-evals 40 --budget-s 230 --wf-compile-workers 8
    step gpu_tests 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/cluster/engine/test_gpu.py \
      tests/agents/test_constant.py
    step agents 300 "$PY" scripts/bench_agents.py --out "$OUT/agents" --trials 8 --hand-repeats 2 --time-budget 480 \
      --no-profile --targets regpressure,conv2d
    pack recheck kt/report.md kt/summary.parquet kt/meta.json kt/raw kt/logs agents ;;
  actor)  # one GPU, about a minute: the measuring actor's time per job besides the run
    machine
    step actor 120 "$PY" scripts/bench_runners.py configs/kernels.yaml --actor --repeats 30 --out "$OUT/actor"
    pack actor actor ;;
  stage)  # one GPU, about 9 minutes: the shared_stage expert's GPU test and the sanitizer's, then the suite's
    # unroll target (SUITE= for others) with the agents on (on an H200 the first try ran out of its limits:
    # 5 tests passed in 150 s, the optimize test cut; the sweep done in 400 s, its table not written)
    machine
    step gpu_tests 100 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/agents/test_shared_stage.py \
      tests/cluster/engine/test_gpu_agents.py -k "not optimize"
    step agents 460 "$PY" scripts/bench_agents.py --out "$OUT/agents" --trials 8 --hand-repeats 2 --time-budget 480 \
      --no-profile --targets "${SUITE:-unroll}"
    pack stage agents ;;
  checks)  # one GPU, about 8 minutes: where an agent stage's time goes (each verdict's seconds), the agents' GPU tests
    machine
    step gpu_tests_agents 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/cluster/engine/test_gpu_agents.py
    step public 330 "$PY" scripts/bench_public.py --out "$OUT/public" --trials 4 --hand-repeats 1 --time-budget 270 \
      --no-profile --targets "${TARGETS:-pb_2mm,cs_transpose}"
    pack checks public ;;
  public)  # every GPU: the public suite with the agents on (on two H200s, 555 s finished four of eight, a fifth in its finals)
    machine
    step public 555 "$PY" scripts/bench_public.py --out "$OUT/public" --trials 8 --hand-repeats 2 --time-budget 480 \
      --no-profile ${TARGETS:+--targets "$TARGETS"}
    pack public public ;;
  *)
    sed -n '2,/^set -uo/p' "$0" | grep '^#'; exit 2 ;;
esac
