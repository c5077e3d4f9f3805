#!/usr/bin/env bash
# bench/apiserver-restart.sh — how fast the operator acts again after kube-apiserver restarts.
#
# On a cluster of its own (hack/cluster with VALKEY_OPERATOR_CLUSTER, default `restart-bench`:
# killing the API server must not disturb anything else), with N Valkeys Running and the operator
# (release build) running as its own process under the shipped ServiceAccount and RBAC, each run:
#   1. SIGKILLs kube-apiserver, waits OUTAGE seconds, restarts it (`hack/cluster up`);
#   2. as soon as the API server is ready again (GET /readyz passes; /version answers earlier, but
#      until /readyz passes requests are refused, e.g. 403 while its RBAC caches fill), changes one
#      Valkey's spec.resource.memory and deletes its read-write Service;
#   3. measures, from the moment /readyz passed, until the Service is recreated and until the
#      StatefulSet carries the new memory (and prints when /version first answered, for reference).
# RUNS runs for each outage in OUTAGES; prints every run and the median per outage.
#
#   bench/apiserver-restart.sh                         RUNS=5 OUTAGES="0 35" N=10
#   RUNS=1 OUTAGES=0 bench/apiserver-restart.sh        a quick look
#   OPERATOR_BIN=path/to/valkey-operator bench/...     another build (e.g. an older one)
#
# Environment:
#   N             Valkeys (default 10)
#   RUNS          runs per outage (default 5)
#   OUTAGES       seconds between the kill and the restart, one run series each (default "0 35")
#   GIVE_UP       seconds to wait for the operator to act before a run counts as failed (default 300)
#   OPERATOR_BIN  the operator binary (default: cargo build --release, target/release/valkey-operator)
#   VALKEY_OPERATOR_CLUSTER  the cluster (default restart-bench); taken down at the end unless KEEP=1
#   VALKEY_OPERATOR_APISERVER_PORT  its API server's port (default: a free one from the ephemeral range)
#
# Results: target/bench/<run>/results.txt (and the operator's log next to it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

N=${N:-10}
RUNS=${RUNS:-5}
OUTAGES=${OUTAGES:-"0 35"}
GIVE_UP=${GIVE_UP:-300}
KEEP=${KEEP:-}
export VALKEY_OPERATOR_CLUSTER=${VALKEY_OPERATOR_CLUSTER:-restart-bench}
# A fixed API server port from the ephemeral range: kwokctl picks ports counting down from 32765,
# so a cluster created by anyone while the API server is stopped could take a port kwokctl chose.
export VALKEY_OPERATOR_APISERVER_PORT=${VALKEY_OPERATOR_APISERVER_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}

RUN=restart-$(date +%Y%m%d-%H%M%S)-$$
WORK=$ROOT/target/bench/$RUN
NS=$RUN
OPNS=valkey-operator-system
LEASE=$RUN

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

[[ $N =~ ^[0-9]+$ && $N -ge 1 ]] || die "N must be a positive integer"
[[ $RUNS =~ ^[0-9]+$ && $RUNS -ge 1 ]] || die "RUNS must be a positive integer"

mkdir -p "$WORK"
log "run $RUN: N=$N RUNS=$RUNS OUTAGES=($OUTAGES) cluster $VALKEY_OPERATOR_CLUSTER (work dir $WORK)"

hack/cluster up >"$WORK/cluster-up.log" 2>&1 || { cat "$WORK/cluster-up.log" >&2; die "hack/cluster up failed"; }
eval "$(hack/cluster env)"
PIDS=$VALKEY_OPERATOR_CLUSTER_DIR/kwok/clusters/valkey-operator/pids

if [[ -z ${OPERATOR_BIN:-} ]]; then
  log "building the operator (release)"
  cargo build --release -q -p valkey-operator
  OPERATOR_BIN=$ROOT/target/release/valkey-operator
fi
[[ -x $OPERATOR_BIN ]] || die "no operator binary at $OPERATOR_BIN"

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
    log "KEEP=1: kept cluster $VALKEY_OPERATOR_CLUSTER and namespace $NS"
  else
    log "taking cluster $VALKEY_OPERATOR_CLUSTER down"
    hack/cluster down >>"$WORK/cluster-down.log" 2>&1 || log "hack/cluster down failed: $WORK/cluster-down.log"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "installing the manifests"
kubectl apply --server-side --force-conflicts -k manifests/ >"$WORK/install.log"
kubectl wait --for=condition=Established crd/valkeys.database.kuberly.io --timeout=60s >/dev/null
kubectl create namespace "$NS" >/dev/null
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted >/dev/null

# The operator under the shipped ServiceAccount: a kubeconfig with only its token.
TOKEN=$(kubectl -n "$OPNS" create token valkey-operator --duration=6h)
SERVER=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
CA=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
OPERATOR_KUBECONFIG=$WORK/operator.kubeconfig
(
  umask 077
  cat >"$OPERATOR_KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$SERVER", certificate-authority-data: "$CA"}}]
users: [{name: valkey-operator, user: {token: "$TOKEN"}}]
contexts: [{name: valkey-operator, context: {cluster: local, user: valkey-operator, namespace: $OPNS}}]
current-context: valkey-operator
EOF
)
HTTP_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
KUBECONFIG=$OPERATOR_KUBECONFIG "$OPERATOR_BIN" run --log-format json --watch-namespace "$NS" \
  --lease-name "$LEASE" --lease-namespace "$OPNS" --identity "$RUN" \
  --http-addr "127.0.0.1:$HTTP_PORT" >"$WORK/operator.log" 2>&1 &
OPERATOR_PID=$!

log "creating $N Valkeys"
for ((i = 0; i < N; i++)); do
  cat <<EOF
---
apiVersion: database.kuberly.io/v1alpha1
kind: Valkey
metadata: {name: vk-$i, namespace: $NS}
spec: {replicas: 1, resource: {memory: 256Mi}}
EOF
done | kubectl apply -f - >/dev/null

running_count() {
  kubectl -n "$NS" get valkeys -o jsonpath='{range .items[*]}{.status.status}{"\n"}{end}' 2>/dev/null | grep -c '^Running$' || true
}
wait_all_running() {
  local deadline=$((SECONDS + GIVE_UP)) next_up=$((SECONDS + 5))
  until (($(running_count) == N)); do
    ((SECONDS < deadline)) || die "not all $N Valkeys Running within ${GIVE_UP}s"
    # Nothing restarts a crashed component here (kube-scheduler sometimes exits a while after an
    # outage, "scheduler cache is corrupted"): hack/cluster up does, and is quick when all runs.
    if ((SECONDS >= next_up)); then
      hack/cluster up >>"$WORK/cluster-up.log" 2>&1 || die "hack/cluster up failed: $WORK/cluster-up.log"
      next_up=$((SECONDS + 5))
    fi
    sleep 0.5
  done
}
wait_all_running
log "all $N Running"

retry() { # retry <what> <command...>: every 0.1 s, for at most GIVE_UP seconds
  local what=$1 deadline=$((SECONDS + GIVE_UP))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "gave up on $what after ${GIVE_UP}s"
    sleep 0.1
  done
}
api_answers() { kubectl get --raw /version --request-timeout=1s >/dev/null 2>&1; }
api_ready() { kubectl get --raw /readyz --request-timeout=1s >/dev/null 2>&1; }
sts_memory() {
  kubectl -n "$NS" get statefulset "$1" -o jsonpath='{.spec.template.spec.containers[0].resources.limits.memory}' 2>/dev/null || true
}
service_uid() { kubectl -n "$NS" get service "$1" -o jsonpath='{.metadata.uid}' 2>/dev/null || true; }

RESULTS=$WORK/results.txt
printf '%-8s %-4s %-10s %-16s %-16s %s\n' outage run instance service_back_s statefulset_s version_answered_s_before | tee "$RESULTS"
run=0
for outage in $OUTAGES; do
  for ((r = 1; r <= RUNS; r++)); do
    name=vk-$((run % N))
    memory=$((300 + run * 4))Mi
    run=$((run + 1))
    old_uid=$(service_uid "$name")
    pid=$(<"$PIDS/kube-apiserver.pid")
    kill -KILL "$pid"
    sleep "$outage"
    hack/cluster up >>"$WORK/cluster-up.log" 2>&1 &
    up_pid=$!
    retry "the API server to answer" api_answers
    answered=$(now)
    retry "the API server to be ready" api_ready
    back=$(now)
    # Writes may be refused while the API server's storage initializes: retry them.
    retry "changing $name" kubectl -n "$NS" patch valkey "$name" --type merge \
      -p "{\"spec\":{\"resource\":{\"memory\":\"$memory\"}}}"
    retry "deleting Service $name" kubectl -n "$NS" delete service "$name" --wait=false
    svc=- sts=-
    deadline=$((SECONDS + GIVE_UP))
    while [[ $svc == - || $sts == - ]] && ((SECONDS < deadline)); do
      if [[ $svc == - ]]; then
        uid=$(service_uid "$name")
        [[ -n $uid && $uid != "$old_uid" ]] && svc=$(elapsed "$back" "$(now)")
      fi
      [[ $sts == - && $(sts_memory "$name") == "$memory" ]] && sts=$(elapsed "$back" "$(now)")
      sleep 0.1
    done
    wait "$up_pid" || die "hack/cluster up failed: $WORK/cluster-up.log"
    printf '%-8s %-4s %-10s %-16s %-16s %s\n' "${outage}s" "$r" "$name" "$svc" "$sts" "$(elapsed "$answered" "$back")" | tee -a "$RESULTS"
    kill -0 "$OPERATOR_PID" 2>/dev/null || die "the operator exited: $WORK/operator.log"
    wait_all_running
  done
done

{
  echo
  printf '%-8s %-26s %-26s\n' outage median_service_back_s median_statefulset_s
  for outage in $OUTAGES; do
    svc=$(awk -v o="${outage}s" '$1 == o && $4 != "-" { print $4 }' "$RESULTS" | median)
    sts=$(awk -v o="${outage}s" '$1 == o && $5 != "-" { print $5 }' "$RESULTS" | median)
    failed=$(awk -v o="${outage}s" '$1 == o && ($4 == "-" || $5 == "-")' "$RESULTS" | wc -l)
    printf '%-8s %-26s %-26s %s\n' "${outage}s" "$svc" "$sts" "$( ((failed)) && echo "($failed run(s) not acted on within ${GIVE_UP}s)")"
  done
  echo
  echo "watch restarts: $(curl -s "http://127.0.0.1:$HTTP_PORT/metrics" | awk '/^valkey_operator_watch_restarts_total/ { s += $2 } END { print s + 0 }')"
  echo "outage warnings in the log: $(grep -c 'lost the API server; retrying' "$WORK/operator.log" || true)"
} | tee -a "$RESULTS"
log "results: $RESULTS"
