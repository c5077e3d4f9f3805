#!/usr/bin/env bash
# bench/nodes.sh — figures of the local cluster's real nodes (hack/cluster):
#   - warm `hack/cluster up` from no cluster (binaries built), and `down`;
#   - idle memory (RSS) of the kubelets, containerds, shims, kube-proxy and CoreDNS, with no pod
#     and with one Valkey pod per node, after IDLE seconds.
# Brings its own cluster up and down: run it where no cluster of this cache runs.
#   bench/nodes.sh [IDLE_SECONDS]     (default 20)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
IDLE=${1:-20}
CACHE=${VALKEY_OPERATOR_CACHE:-$HOME/.cache/valkey-operator}
[[ ! -d $CACHE/cluster ]] || { echo "a cluster of $CACHE exists: hack/cluster down first" >&2; exit 2; }

hack/cluster build >/dev/null 2>&1
t0=$(date +%s.%N)
hack/cluster up >/dev/null 2>&1
t1=$(date +%s.%N)
eval "$(hack/cluster env)"
printf 'warm up (control plane + %s real nodes Ready): %.1f s\n' "$VALKEY_OPERATOR_REAL_NODES" "$(echo "$t1 - $t0" | bc -l)"

rss() { # rss <label> <pids...>: total RSS in MiB
  local label=$1 total=0 p kb
  shift
  for p in "$@"; do
    kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
    total=$((total + kb))
  done
  printf '  %-26s %3d process(es) %7.1f MiB\n' "$label" "$#" "$(echo "$total / 1024" | bc -l)"
}
footprint() {
  local state=$VALKEY_OPERATOR_CLUSTER_DIR
  mapfile -t kubelets < <(cat "$state"/nodes/*/kubelet.pid)
  mapfile -t containerds < <(cat "$state"/nodes/*/containerd.pid)
  mapfile -t shims < <(pgrep -f "containerd-shim-runc-v2 .*-address $state/" || true)
  rss kubelet "${kubelets[@]}"
  rss containerd "${containerds[@]}"
  rss containerd-shim-runc-v2 "${shims[@]}"
  rss kube-proxy "$(cat "$state/host/kube-proxy.pid")"
  rss coredns "$(cat "$state/host/coredns.pid")"
}

sleep "$IDLE"
echo "idle, no pod:"
footprint

kubectl create namespace bench-nodes >/dev/null
kubectl -n bench-nodes create deployment vk --image=valkey/valkey:9.1.2 --replicas="$VALKEY_OPERATOR_REAL_NODES" >/dev/null
kubectl -n bench-nodes wait --for=condition=Available deployment/vk --timeout=120s >/dev/null
sleep "$IDLE"
echo "idle, $VALKEY_OPERATOR_REAL_NODES Valkey pods:"
footprint

t0=$(date +%s.%N)
hack/cluster down >/dev/null 2>&1
t1=$(date +%s.%N)
printf 'down: %.1f s\n' "$(echo "$t1 - $t0" | bc -l)"
