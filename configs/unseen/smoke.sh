#!/usr/bin/env bash
# Builds every unseen program's baseline with nvcc, as its target.yaml does, and runs it once with
# seed 0 (the target's run arguments), printing each exit status, wall time, number of samples and
# median sample. Needs a GPU and nvcc; run from anywhere. Builds and logs go to $1 (default: a
# fresh temporary folder); each program runs in its own folder there.
set -u
here=$(cd "$(dirname "$0")" && pwd)
include=$(cd "$here/../../cluster/compile/include" && pwd)
work=${1:-$(mktemp -d)}
arch=${ARCH:-sm_90}
mkdir -p "$work"

build() {  # name, nvcc arguments...
    local name=$1; shift
    mkdir -p "$work/$name"
    (cd "$here/$name" && nvcc -O3 -I"$include" -I. -arch="$arch" -o "$work/$name/$name" "$@" \
        > "$work/$name/build.log" 2>&1) || echo "$name: BUILD FAILED (see $work/$name/build.log)"
}

run() {  # name, arguments...
    local name=$1; shift
    [ -x "$work/$name/$name" ] || return
    local start end rc stats
    start=$(date +%s%N)
    (cd "$work/$name" && "./$name" "$@" > run.log 2>&1)
    rc=$?
    end=$(date +%s%N)
    stats=$(grep -o 'time_ms=[0-9.eE+-]*' "$work/$name/run.log" | cut -d= -f2 | sort -g |
            awk '{a[NR] = $1} END {if (NR) printf "%d samples, median %s ms", NR, a[int((NR + 1) / 2)]; else print "no samples"}')
    echo "$name: exit $rc, $(( (end - start) / 1000000 )) ms wall, $stats"
    [ "$rc" -eq 0 ] || tail -n 5 "$work/$name/run.log"
}

build pb_correlation -DMINI_DATASET correlation.cu &
build rodinia_nw needle.cu &
build cs_fastWalshTransform fastWalshTransform.cu fastWalshTransform_gold.cpp &
build cs_sortingNetworks -x cu main.cpp bitonicSort.cu sortingNetworks_validate.cpp &
build histogram_atomic histogram.cu &
build softmax_rows softmax.cu &
build spmv_csr spmv.cu &
build nbody_step nbody.cu &
wait

run pb_correlation --max-time 2
run rodinia_nw 2048 10 0
run cs_fastWalshTransform --seed=0
run cs_sortingNetworks --seed 0
run histogram_atomic --seed 0 --n 134217728
run softmax_rows --seed 0 --rows 16384 --cols 1000 --reps 50
run spmv_csr --seed 0 --rows 524288
run nbody_step --seed 0 --n 32768 --reps 20
echo "logs: $work"
