#!/usr/bin/env bash
# bench/plugin.sh — how fast `kubectl valkey` answers, on the local control plane (hack/cluster).
#
# Measures, side by side with `kubectl get valkeys` (the floor: one list request, no extra work):
#   - `kubectl valkey list` and `kubectl valkey status` (no name: the instances table) with 1 and
#     with 200 instances in the namespace; `kubectl valkey status NAME` (Valkey, pods and events);
#   - `kubectl-valkey --help` start-up time (no cluster involved);
#   - the release binary's size (as built, and stripped).
# Every command runs through kubectl's plugin discovery, as users run it.
#
# Uses hyperfine when available (installed with apt-get when running as root), else a loop timed
# with `date +%s%N`. Environment: RUNS (default 20), WARMUP (default 3), KEEP=1 keeps the
# namespaces it creates.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${RUNS:-20}
WARMUP=${WARMUP:-3}
NS_ONE=bench-plugin-1
NS_MANY=bench-plugin-200

log() { printf '[bench] %s\n' "$*" >&2; }

log "building kubectl-valkey (release)"
cargo build --release --quiet -p kubectl-valkey --manifest-path "$ROOT/Cargo.toml"
BIN="$ROOT/target/release/kubectl-valkey"

"$ROOT/hack/cluster" up >/dev/null
eval "$("$ROOT/hack/cluster" env)"
PLUGIN_DIR=$(mktemp -d)
ln -s "$BIN" "$PLUGIN_DIR/kubectl-valkey"
export PATH="$PLUGIN_DIR:$PATH"

cleanup() {
  if [[ ${KEEP:-} != 1 ]]; then
    kubectl delete namespace "$NS_ONE" "$NS_MANY" --wait=false --ignore-not-found >/dev/null 2>&1 || true
  fi
  rm -rf "$PLUGIN_DIR"
}
trap cleanup EXIT

if ! command -v hyperfine >/dev/null && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  log "installing hyperfine with apt-get"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine; } >/dev/null 2>&1 || true
fi

log "installing the CRD and the operator's manifests"
kubectl valkey install >/dev/null 2>&1

# N instances named vk-0..vk-(N-1) in namespace $1, in one server-side apply.
populate() {
  local ns=$1 count=$2 i
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  for ((i = 0; i < count; i++)); do
    printf -- '---\napiVersion: database.kuberly.io/v1alpha1\nkind: Valkey\nmetadata: {name: vk-%d, namespace: %s}\nspec: {replicas: 3}\n' "$i" "$ns"
  done | kubectl apply --server-side --field-manager=bench -f - >/dev/null
}
log "creating 1 instance in $NS_ONE and 200 in $NS_MANY"
populate "$NS_ONE" 1
populate "$NS_MANY" 200

# One benchmark: a label and a command line; prints "label  mean ± stddev (min … max)".
measure() {
  local label=$1 command=$2
  if command -v hyperfine >/dev/null; then
    local json
    json=$(mktemp)
    hyperfine --style none --warmup "$WARMUP" --runs "$RUNS" --export-json "$json" "$command" >/dev/null 2>&1
    python3 - "$label" "$json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[2]))["results"][0]
ms = lambda s: s * 1000
print(f"{sys.argv[1]:<52} {ms(r['mean']):7.1f} ms ± {ms(r['stddev'] or 0):5.1f}   (min {ms(r['min']):6.1f}, max {ms(r['max']):6.1f})")
EOF
    rm -f "$json"
  else
    local i start end total=0 min= max=0 t
    for ((i = 0; i < WARMUP; i++)); do bash -c "$command" >/dev/null 2>&1; done
    for ((i = 0; i < RUNS; i++)); do
      start=$(date +%s%N)
      bash -c "$command" >/dev/null 2>&1
      end=$(date +%s%N)
      t=$(((end - start) / 1000))
      total=$((total + t))
      ((t > max)) && max=$t
      [[ -z $min || $t -lt $min ]] && min=$t
    done
    printf '%-52s %7.1f ms           (min %6.1f, max %6.1f)\n' "$label" \
      "$(bc -l <<<"$total / $RUNS / 1000")" "$(bc -l <<<"$min / 1000")" "$(bc -l <<<"$max / 1000")"
  fi
}

echo
echo "kubectl valkey latency ($(command -v hyperfine >/dev/null && echo "hyperfine, $RUNS runs, $WARMUP warm-up" || echo "date loop, $RUNS runs")), $(kubectl version -o json 2>/dev/null | python3 -c 'import json,sys; print("server", json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
for ns in "$NS_ONE" "$NS_MANY"; do
  n=${ns##*-}
  echo "-- $n instance(s) in the namespace"
  measure "kubectl get valkeys ($n)" "kubectl get valkeys -n $ns"
  measure "kubectl valkey list ($n)" "kubectl valkey list -n $ns"
  measure "kubectl valkey status ($n)" "kubectl valkey status -n $ns"
  measure "kubectl valkey status vk-0 ($n in the namespace)" "kubectl valkey status vk-0 -n $ns"
  measure "kubectl valkey list -o json ($n)" "kubectl valkey list -n $ns -o json"
  measure "kubectl-valkey list ($n, direct, no kubectl)" "$BIN list -n $ns"
done
echo "-- start-up, no cluster"
measure "kubectl-valkey --help" "$BIN --help"
measure "kubectl valkey --help (through kubectl)" "kubectl valkey --help"
measure "kubectl version --client (for scale)" "kubectl version --client"

echo
echo "binary size (release)"
size=$(stat -c %s "$BIN")
stripped=$(mktemp)
strip -o "$stripped" "$BIN" 2>/dev/null || cp "$BIN" "$stripped"
printf '  %-30s %6.1f MiB\n' "target/release/kubectl-valkey" "$(bc -l <<<"$size / 1048576")"
printf '  %-30s %6.1f MiB\n' "stripped" "$(bc -l <<<"$(stat -c %s "$stripped") / 1048576")"
rm -f "$stripped"
