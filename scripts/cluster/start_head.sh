#!/usr/bin/env bash
# Starts the head of a warpfleet Ray cluster by hand: token authentication on, the dashboard on
# this node's loopback only.
#   scripts/cluster/start_head.sh NODE_IP [PORT]
# NODE_IP: this node's address on the private network the GPU nodes reach it by. PORT: the GCS
# port (default 6379). Then, on every GPU node: scripts/cluster/start_worker.sh NODE_IP:PORT
#
# Security. Ray's ports (GCS, raylet, object manager, worker ports) must be reachable from the
# cluster's nodes and from nothing else: keep them behind a firewall or security group, never open
# to the internet. Token authentication makes every Ray RPC and dashboard request carry a shared
# secret; this script turns it on explicitly (Ray 2.60 turns it on unasked for a local ray.init(),
# never on a joining node) and keeps the token in ~/.ray/auth_token (mode 600), off command lines.
# The dashboard listens on 127.0.0.1:8265: reach it with `ssh -L 8265:127.0.0.1:8265 HEAD`.
set -euo pipefail

prog=$(basename "$0")
usage="usage: $prog NODE_IP [PORT]"
die() { echo "$prog: $1 ($usage)" >&2; exit 2; }

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    echo "$usage"
    echo "Starts the Ray head on this node (token authentication on, dashboard on 127.0.0.1)."
    exit 0
fi
[[ $# -ge 1 ]] || die "missing NODE_IP"
[[ $# -le 2 ]] || die "too many arguments"
node_ip=$1
port=${2:-6379}
ipv4='^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$'
if [[ $node_ip =~ $ipv4 ]]; then
    for octet in "${BASH_REMATCH[@]:1}"; do
        (( 10#$octet <= 255 )) || die "NODE_IP '$node_ip' is not an IPv4 address"
    done
    [[ $node_ip != 0.* && $node_ip != 127.* ]] || die "NODE_IP must be an address the other nodes reach, not '$node_ip'"
elif [[ ! $node_ip =~ ^[0-9A-Fa-f:]+$ || $node_ip != *:* ]]; then
    die "NODE_IP '$node_ip' is not an IP address"
fi
if [[ ! $port =~ ^[0-9]{1,5}$ ]] || (( 10#$port < 1024 || 10#$port > 65535 )); then
    die "PORT must be a number from 1024 to 65535, not '$port'"
fi
command -v ray >/dev/null || die "ray is not on PATH: activate the environment that has Ray"

export RAY_AUTH_MODE=token
if [[ -z ${RAY_AUTH_TOKEN:-} && -z ${RAY_AUTH_TOKEN_PATH:-} ]]; then
    # Keeps an existing ~/.ray/auth_token, else writes a new one (256 random bits). The token it
    # prints goes nowhere: it must not land in a log.
    (umask 077 && ray get-auth-token --generate >/dev/null)
fi
token_file=${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}

ray start --head --node-ip-address="$node_ip" --port="$port" --dashboard-host=127.0.0.1

cat <<EOF
Ray head at $node_ip:$port: token authentication on, dashboard on 127.0.0.1:8265 of this node.
On every GPU node: copy $token_file to ~/.ray/auth_token there (mode 600), then run
    scripts/cluster/start_worker.sh $node_ip:$port
Sweep from this node:
    RAY_AUTH_MODE=token warpfleet sweep CONFIG --address $node_ip:$port
EOF
