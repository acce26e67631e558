#!/usr/bin/env bash
# Joins this GPU node to a warpfleet Ray cluster started with start_head.sh.
#   scripts/cluster/start_worker.sh HEAD_HOST[:PORT]
# Needs the head's token in ~/.ray/auth_token (copied from the head, mode 600), or in the file
# RAY_AUTH_TOKEN_PATH names. The node needs Ray and Python of the same versions as the head,
# warpfleet's dependencies, nvcc and gcc (compile tasks run on any node with CPUs); warpfleet's
# own code comes with each sweep through Ray's runtime environment.
#
# GPUs: the count nvidia-smi lists (or the devices CUDA_VISIBLE_DEVICES names) becomes --num-gpus.
# The accelerator type needs nothing here: Ray reads the first GPU's name through NVML and gives
# the node the resource accelerator_type:<TYPE> and the label ray.io/accelerator-type=<TYPE>
# (H100, H200, A100, L40S, ...); warpfleet records it in every row (accelerator_type).
set -euo pipefail

prog=$(basename "$0")
usage="usage: $prog HEAD_HOST[:PORT]"
die() { echo "$prog: $1 ($usage)" >&2; exit 2; }

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    echo "$usage"
    echo "Starts a Ray worker on this node, joined to the head at HEAD_HOST:PORT (default port 6379)."
    exit 0
fi
[[ $# -ge 1 ]] || die "missing HEAD_HOST"
[[ $# -le 1 ]] || die "too many arguments"
if [[ ! $1 =~ ^([A-Za-z0-9][A-Za-z0-9.-]*)(:([0-9]{1,5}))?$ ]]; then
    die "'$1' is not HEAD_HOST or HEAD_HOST:PORT"
fi
head_host=${BASH_REMATCH[1]}
port=${BASH_REMATCH[3]:-6379}
(( 10#$port >= 1024 && 10#$port <= 65535 )) || die "PORT must be a number from 1024 to 65535, not '$port'"

if [[ -z ${RAY_AUTH_TOKEN:-} ]]; then
    token_file=${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}
    [[ -s $token_file ]] || die "no Ray auth token at $token_file: copy the head's ~/.ray/auth_token here (mode 600)"
fi
command -v ray >/dev/null || die "ray is not on PATH: activate the environment that has Ray"

if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then
    IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
    gpus=${#visible[@]}
elif command -v nvidia-smi >/dev/null; then
    listed=$(nvidia-smi --query-gpu=index --format=csv,noheader) || die "nvidia-smi failed: check the NVIDIA driver"
    gpus=$(grep -c . <<<"$listed" || true)
else
    echo "$prog: note: no nvidia-smi, so no GPUs: this node takes compile tasks and CPU targets only" >&2
    gpus=0
fi
command -v nvcc >/dev/null || echo "$prog: warning: nvcc is not on PATH: CUDA compile tasks placed here will fail" >&2

export RAY_AUTH_MODE=token
ray start --address="$head_host:$port" --num-gpus="$gpus"
echo "Joined $head_host:$port with $gpus GPUs."
