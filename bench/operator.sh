#!/usr/bin/env bash
# bench/operator.sh — how the operator copes with many Valkeys, on the local control plane.
#
# Creates N Valkeys at once in a fresh namespace, with the operator (release build) running as its
# own process under the shipped RBAC, and prints:
#   - the time until all N are Running;
#   - the operator's API requests per instance (reads and writes) while they converge;
#   - the operator's API requests, and writes, during an idle window (the goal: 0 writes to Valkeys,
#     their children and events; the leader Lease renewals are counted apart);
#   - the operator's peak and idle RSS.
#
#   bench/operator.sh                      N=100, 10 idle minutes
#   N=1000 bench/operator.sh               the big run
#   N=100 IDLE_SECONDS=60 bench/operator.sh   a quick run
#
# Environment:
#   N              instances (default 100)
#   REPLICAS       pods per instance (default 1)
#   IDLE_SECONDS   idle window once all are Running (default 600)
#   TIMEOUT        seconds allowed for all to be Running (default 300 + N/2)
#   CONCURRENCY    the operator's --concurrency (default: the operator's own default)
#   KEEP=1         keep the namespace, nodes and operator log for inspection (the operator is stopped)
#
# How requests are counted: the API server has no per-client request metric, so the bench runs the
# operator as its own ServiceAccount (valkey-operator-bench, bound to the shipped ClusterRole and
# leader-election Role) and adds FlowSchemas that match only that ServiceAccount, split into lease
# writes, event writes, other writes and everything else. The API server's
# apiserver_flowcontrol_dispatched_requests_total{flow_schema=...} then counts exactly the
# operator's requests, whatever else runs on the (shared) cluster. The Valkeys' pods go to fake
# nodes of their own (tainted, so nothing else lands there), sized for N x REPLICAS pods.
#
# Everything the bench creates is removed on exit (namespace, nodes, FlowSchemas, ServiceAccount,
# bindings, Lease); the operator process is stopped. Results: target/bench/<run>/results.txt.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

N=${N:-100}
REPLICAS=${REPLICAS:-1}
IDLE_SECONDS=${IDLE_SECONDS:-600}
TIMEOUT=${TIMEOUT:-$((300 + N / 2))}
CONCURRENCY=${CONCURRENCY:-}
KEEP=${KEEP:-}

RUN=bench-$(date +%Y%m%d-%H%M%S)-$$
WORK=$ROOT/target/bench/$RUN
NS=$RUN
SA=valkey-operator-bench
OPNS=valkey-operator-system
LEASE=$RUN
NODE_PREFIX=$RUN-node
TAINT_KEY=bench.valkey-operator.kuberly.io/dedicated
FS_PREFIX=$RUN

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

[[ $N =~ ^[0-9]+$ && $N -ge 1 ]] || die "N must be a positive integer"
[[ $REPLICAS =~ ^[0-5]$ && $REPLICAS -ge 1 ]] || die "REPLICAS must be 1..5"
[[ $IDLE_SECONDS =~ ^[0-9]+$ ]] || die "IDLE_SECONDS must be a number of seconds"

mkdir -p "$WORK"
log "run $RUN: N=$N REPLICAS=$REPLICAS IDLE_SECONDS=$IDLE_SECONDS (work dir $WORK)"

# ------------------------------------------------------------------------------------- preparation

hack/cluster up >"$WORK/cluster-up.log" 2>&1 || { cat "$WORK/cluster-up.log" >&2; die "hack/cluster up failed"; }
eval "$(hack/cluster env)"

log "building the operator (release)"
cargo build --release -q -p valkey-operator
OPERATOR_BIN=$ROOT/target/release/valkey-operator

OPERATOR_PID=
cleanup() {
  local rc=$?
  set +e
  if [[ -n $OPERATOR_PID ]] && kill -0 "$OPERATOR_PID" 2>/dev/null; then
    kill -TERM "$OPERATOR_PID"
    for _ in $(seq 50); do kill -0 "$OPERATOR_PID" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$OPERATOR_PID" 2>/dev/null && kill -KILL "$OPERATOR_PID"
  fi
  if [[ -n $KEEP ]]; then
    log "KEEP=1: kept namespace $NS, nodes $NODE_PREFIX-*, FlowSchemas $FS_PREFIX-*, ServiceAccount $OPNS/$SA"
    exit $rc
  fi
  log "cleaning up"
  kubectl delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1
  # Give the namespace's pods and volumes a bounded time to go before their nodes do.
  local deadline=$((SECONDS + 300))
  while kubectl get namespace "$NS" >/dev/null 2>&1 && ((SECONDS < deadline)); do sleep 2; done
  kubectl get namespace "$NS" >/dev/null 2>&1 && log "namespace $NS is still terminating; leaving it to the API server"
  kubectl delete nodes -l "$TAINT_KEY=$RUN" --ignore-not-found --wait=false >/dev/null 2>&1
  kubectl delete flowschemas -l "$TAINT_KEY=$RUN" --ignore-not-found >/dev/null 2>&1
  kubectl delete clusterrolebinding "$RUN" --ignore-not-found >/dev/null 2>&1
  kubectl -n "$OPNS" delete rolebinding "$RUN" --ignore-not-found >/dev/null 2>&1
  kubectl -n "$OPNS" delete lease "$LEASE" --ignore-not-found >/dev/null 2>&1
  # The ServiceAccount is shared by concurrent runs: removed when no binding of another run uses it.
  if ! kubectl get clusterrolebindings -o jsonpath='{range .items[*]}{.subjects[*].name}{"\n"}{end}' 2>/dev/null | grep -qx "$SA"; then
    kubectl -n "$OPNS" delete serviceaccount "$SA" --ignore-not-found >/dev/null 2>&1
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "installing the manifests"
kubectl apply --server-side --force-conflicts -k manifests/ >"$WORK/install.log"
kubectl wait --for=condition=Established crd/valkeys.database.kuberly.io --timeout=60s >/dev/null

# The operator's own identity for this run, bound to the shipped roles, and FlowSchemas counting
# its requests. Labels let the cleanup find everything of this run.
NODES=$(((N * REPLICAS + 399) / 400))
{
  cat <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: $SA, namespace: $OPNS}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: $RUN, labels: {$TAINT_KEY: $RUN}}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: valkey-operator}
subjects: [{kind: ServiceAccount, name: $SA, namespace: $OPNS}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: $RUN, namespace: $OPNS, labels: {$TAINT_KEY: $RUN}}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: valkey-operator-leader-election}
subjects: [{kind: ServiceAccount, name: $SA, namespace: $OPNS}]
---
apiVersion: v1
kind: Namespace
metadata:
  name: $NS
  labels: {pod-security.kubernetes.io/enforce: restricted, $TAINT_KEY: $RUN}
EOF
  precedence=1000
  for fs in lease-writes event-writes writes reads; do
    case $fs in
      lease-writes) rule='{verbs: [create, update, patch, delete, deletecollection], apiGroups: [coordination.k8s.io], resources: [leases], namespaces: ["*"]}' ;;
      event-writes) rule='{verbs: [create, update, patch, delete, deletecollection], apiGroups: ["", events.k8s.io], resources: [events], namespaces: ["*"]}' ;;
      writes) rule='{verbs: [create, update, patch, delete, deletecollection], apiGroups: ["*"], resources: ["*"], namespaces: ["*"], clusterScope: true}' ;;
      reads) rule='{verbs: ["*"], apiGroups: ["*"], resources: ["*"], namespaces: ["*"], clusterScope: true}' ;;
    esac
    nonresource=
    [[ $fs == reads ]] && nonresource='nonResourceRules: [{verbs: ["*"], nonResourceURLs: ["*"]}]'
    cat <<EOF
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {name: $FS_PREFIX-$fs, labels: {$TAINT_KEY: $RUN}}
spec:
  # Where a ServiceAccount's requests go anyway (the service-accounts FlowSchema).
  priorityLevelConfiguration: {name: workload-low}
  matchingPrecedence: $precedence
  distinguisherMethod: {type: ByUser}
  rules:
  - subjects: [{kind: ServiceAccount, serviceAccount: {name: $SA, namespace: $OPNS}}]
    resourceRules: [$rule]
    $nonresource
EOF
    precedence=$((precedence + 1))
  done
  for ((i = 0; i < NODES; i++)); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $NODE_PREFIX-$i
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels:
    kubernetes.io/hostname: $NODE_PREFIX-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    $TAINT_KEY: $RUN
spec:
  taints: [{key: $TAINT_KEY, value: $RUN, effect: NoSchedule}]
status:
  allocatable: {cpu: "1000", memory: 4Ti, pods: "500"}
  capacity: {cpu: "1000", memory: 4Ti, pods: "500"}
EOF
  done
} >"$WORK/setup.yaml"
kubectl apply --server-side -f "$WORK/setup.yaml" >"$WORK/setup.log"
log "waiting for $NODES bench node(s) to be Ready"
kubectl wait --for=condition=Ready node -l "$TAINT_KEY=$RUN" --timeout=120s >/dev/null

# A kubeconfig with only a token of that ServiceAccount.
TOKEN=$(kubectl -n "$OPNS" create token "$SA" --duration=24h)
SERVER=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
CA=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
OPERATOR_KUBECONFIG=$WORK/operator.kubeconfig
(
  umask 077
  cat >"$OPERATOR_KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$SERVER", certificate-authority-data: "$CA"}}]
users: [{name: $SA, user: {token: "$TOKEN"}}]
contexts: [{name: bench, context: {cluster: local, user: $SA, namespace: $OPNS}}]
current-context: bench
EOF
)
unset TOKEN

# ------------------------------------------------------------------------------------ measurements

# The operator's requests so far, by FlowSchema: "lease event writes reads".
counts() {
  kubectl get --raw /metrics | awk -v p="$FS_PREFIX-" '
    /^apiserver_flowcontrol_dispatched_requests_total\{/ {
      if (match($0, /flow_schema="[^"]*"/)) {
        fs = substr($0, RSTART + 13, RLENGTH - 14)
        if (index(fs, p) == 1) { n[substr(fs, length(p) + 1)] += $NF }
      }
    }
    END { printf "%d %d %d %d\n", n["lease-writes"], n["event-writes"], n["writes"], n["reads"] }'
}
rss_kb() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$OPERATOR_PID/status"; }
mb() { awk -v kb="$1" 'BEGIN { printf "%.1f MiB", kb / 1024 }'; }
running_count() {
  kubectl -n "$NS" get valkeys.database.kuberly.io -o jsonpath='{range .items[*]}{.status.status}{"\n"}{end}' 2>/dev/null |
    grep -c '^Running$' || true
}
metric() { curl -fsS "http://$HTTP_ADDR/metrics" 2>/dev/null | awk -v m="$1" '$1 == m { print $2 }'; }

HTTP_ADDR=127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
args=(run --log-format json --watch-namespace "$NS" --lease-name "$LEASE" --lease-namespace "$OPNS"
  --identity "$RUN" --http-addr "$HTTP_ADDR")
[[ -n $CONCURRENCY ]] && args+=(--concurrency "$CONCURRENCY")
log "starting the operator: $OPERATOR_BIN ${args[*]}"
KUBECONFIG=$OPERATOR_KUBECONFIG RUST_LOG=info "$OPERATOR_BIN" "${args[@]}" \
  </dev/null >"$WORK/operator.log" 2>&1 &
OPERATOR_PID=$!
deadline=$((SECONDS + 60))
until [[ $(metric valkey_operator_leader) == 1 ]]; do
  kill -0 "$OPERATOR_PID" 2>/dev/null || { tail -20 "$WORK/operator.log" >&2; die "the operator exited"; }
  ((SECONDS < deadline)) || die "the operator did not become the leader within 60s"
  sleep 0.2
done
log "operator pid $OPERATOR_PID leads; log $WORK/operator.log"
RSS_START=$(rss_kb VmRSS)

# N Valkeys, one request each, all at once (kubectl create sends them back to back).
for ((i = 0; i < N; i++)); do
  cat <<EOF
---
apiVersion: database.kuberly.io/v1alpha1
kind: Valkey
metadata: {name: vk-$i, namespace: $NS}
spec:
  replicas: $REPLICAS
  nodeSelector: {$TAINT_KEY: $RUN}
  tolerations: [{key: $TAINT_KEY, operator: Equal, value: $RUN, effect: NoSchedule}]
EOF
done >"$WORK/valkeys.yaml"

read -r L0 E0 W0 R0 < <(counts)
T0=$(now)
kubectl create -f "$WORK/valkeys.yaml" >/dev/null
T_CREATED=$(now)
log "created $N Valkeys in $(elapsed "$T0" "$T_CREATED")s; waiting for all to be Running (timeout ${TIMEOUT}s)"
deadline=$((SECONDS + TIMEOUT))
last=-1
while :; do
  running=$(running_count)
  if ((running != last)); then
    log "  $running/$N Running after $(elapsed "$T0" "$(now)")s, operator RSS $(mb "$(rss_kb VmRSS)")"
    last=$running
  fi
  ((running >= N)) && break
  kill -0 "$OPERATOR_PID" 2>/dev/null || { tail -20 "$WORK/operator.log" >&2; die "the operator exited"; }
  ((SECONDS < deadline)) || die "only $running/$N Running after ${TIMEOUT}s"
  sleep 1
done
T_RUNNING=$(now)
read -r L1 E1 W1 R1 < <(counts)
RSS_CONVERGED=$(rss_kb VmRSS)
HWM_CONVERGED=$(rss_kb VmHWM)
log "all $N Running after $(elapsed "$T0" "$T_RUNNING")s"

# Idle: nothing changes; the operator should write nothing but its Lease.
log "idle window: ${IDLE_SECONDS}s"
read -r L2 E2 W2 R2 < <(counts)
deadline=$((SECONDS + IDLE_SECONDS))
while ((SECONDS < deadline)); do
  kill -0 "$OPERATOR_PID" 2>/dev/null || { tail -20 "$WORK/operator.log" >&2; die "the operator exited while idle"; }
  remaining=$((deadline - SECONDS))
  sleep $((remaining < 10 ? remaining : 10))
done
read -r L3 E3 W3 R3 < <(counts)
RSS_IDLE=$(rss_kb VmRSS)
HWM=$(rss_kb VmHWM)
STILL_RUNNING=$(running_count)
RECONCILES=$(curl -fsS "http://$HTTP_ADDR/metrics" | awk '/^valkey_operator_reconciles_total/ { n += $NF } END { print n + 0 }')
ERRORS=$(curl -fsS "http://$HTTP_ADDR/metrics" | awk '/^valkey_operator_reconcile_errors_total/ { n += $NF } END { print n + 0 }')

per() { awk -v a="$1" -v n="$N" 'BEGIN { printf "%.1f", a / n }'; }
CONV_ALL=$(((L1 - L0) + (E1 - E0) + (W1 - W0) + (R1 - R0)))
{
  echo "valkey-operator bench $RUN"
  echo "  command:                   N=$N REPLICAS=$REPLICAS IDLE_SECONDS=$IDLE_SECONDS${CONCURRENCY:+ CONCURRENCY=$CONCURRENCY} bench/operator.sh"
  echo "  operator:                  $OPERATOR_BIN (release), --concurrency ${CONCURRENCY:-default}"
  echo "  instances:                 $N x $REPLICAS pod(s), on $NODES fake node(s)"
  echo "  created (kubectl create):  $(elapsed "$T0" "$T_CREATED") s"
  echo "  all Running after:         $(elapsed "$T0" "$T_RUNNING") s"
  echo "  API requests to converge:  $CONV_ALL ($(per "$CONV_ALL") per instance)"
  echo "    writes (objects+status): $((W1 - W0)) ($(per $((W1 - W0))) per instance)"
  echo "    event writes:            $((E1 - E0)) ($(per $((E1 - E0))) per instance)"
  echo "    reads:                   $((R1 - R0)) ($(per $((R1 - R0))) per instance)"
  echo "    lease writes:            $((L1 - L0))"
  echo "  idle ${IDLE_SECONDS} s:"
  echo "    API writes (goal 0):     $(((W3 - W2) + (E3 - E2))) (objects+status $((W3 - W2)), events $((E3 - E2)))"
  echo "    lease renewals:          $((L3 - L2))"
  echo "    reads:                   $((R3 - R2))"
  echo "    still Running:           $STILL_RUNNING/$N"
  echo "  operator RSS:              start $(mb "$RSS_START"), converged $(mb "$RSS_CONVERGED") (peak so far $(mb "$HWM_CONVERGED")), idle $(mb "$RSS_IDLE"), peak (VmHWM) $(mb "$HWM")"
  echo "  reconciles:                $RECONCILES ($ERRORS failed)"
} | tee "$WORK/results.txt"
[[ $STILL_RUNNING == "$N" ]] || die "$((N - STILL_RUNNING)) instance(s) left Running during the idle window"
