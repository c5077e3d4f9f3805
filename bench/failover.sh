#!/usr/bin/env bash
# bench/failover.sh — how fast the operator fails over, and whether it ever loses an acknowledged
# write, on the real pods of the local cluster (hack/cluster with real nodes).
#
# Runs the chaos suite (operator/tests/chaos.rs) with every scenario repeated RUNS times, and
# prints per scenario:
#   - time to first write: from the fault to the first write accepted through the read-write
#     Service's ClusterIP after writes started failing (median and worst);
#   - write pause: the longest time after the fault without an accepted write (median and worst;
#     for the planned switchover this is the figure that matters);
#   - acknowledged writes lost: writes whose SET was OK and whose WAIT 1 reported a replica, not
#     readable afterwards on the primary (summed over the runs; must be 0);
#   - acknowledged writes lost of those written straight to the old primary's pod IP (direct),
#     by a second writer that holds a connection to it as a client of the headless Service would;
#   - fencing: the longest time the old primary still accepted a write of that direct writer
#     after another pod had become primary (the first 200 ms sample of INFO replication at each
#     pod IP in which another pod answered role:master) — what a cut-off old primary takes;
#   - 2 primaries: the longest time two pods answered role:master at once (200 ms samples);
#   - settle: from the fault until every check holds again (one primary, the Service on it, the
#     old primary a replica with its link up, status.primary), median.
#
#   bench/failover.sh                       every scenario, 5 runs each
#   RUNS=1 bench/failover.sh hang           one scenario (a test-name filter), one run
#
# Environment:
#   RUNS       runs per scenario (default 5)
#   PROFILE    cargo profile of the operator and the test (default: dev, as `cargo test`;
#              release builds everything again)
#   Arguments: test-name filters passed to the test binary (default: every scenario)
#
# The suite's clients run on the host beside the cluster: the figures include kube-proxy's update
# of the Service rules, as a client in a pod would see them. Results: target/bench/<run>/ (the
# JSON lines of every run and the clients' logs under target/tmp/e2e/).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

RUNS=${RUNS:-5}
PROFILE=${PROFILE:-dev}
RUN=failover-$(date +%Y%m%d-%H%M%S)-$$
WORK=$ROOT/target/bench/$RUN

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $RUNS =~ ^[0-9]+$ && $RUNS -ge 1 ]] || die "RUNS must be a positive integer"
mkdir -p "$WORK"
log "run $RUN: RUNS=$RUNS PROFILE=$PROFILE (work dir $WORK)"

hack/cluster up >"$WORK/cluster-up.log" 2>&1 || { cat "$WORK/cluster-up.log" >&2; die "hack/cluster up failed"; }
eval "$(hack/cluster env)"

log "building the plugin and the chaos suite"
cargo build -q --profile "$PROFILE" -p kubectl-valkey
cargo test -q --profile "$PROFILE" -p valkey-operator --test chaos --no-run 2>"$WORK/build.log" ||
  { cat "$WORK/build.log" >&2; die "building the chaos suite failed"; }

RESULTS=$WORK/results.jsonl
: >"$RESULTS"
log "running the scenarios (this takes minutes)"
rc=0
CHAOS_RUNS=$RUNS CHAOS_RESULTS=$RESULTS \
  cargo test -q --profile "$PROFILE" -p valkey-operator --test chaos -- \
  --ignored --test-threads 1 --nocapture "$@" >"$WORK/suite.log" 2>&1 || rc=$?
if ((rc != 0)); then
  log "some scenario failed its checks (exit $rc); its figures are below if it got that far"
  grep -E '^(test |thread .* panicked|failures:)' "$WORK/suite.log" | head -40 >&2 || true
fi
[[ -s $RESULTS ]] || die "no figures (see $WORK/suite.log)"

python3 - "$RESULTS" <<'EOF'
import json, statistics, sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
order = ["kill-server", "delete-pod", "hang", "node-loss", "operator-killed",
         "switchover", "rolling-update", "no-volume-pod-deleted"]
by = {}
for r in rows:
    by.setdefault(r["scenario"], []).append(r)

def med(xs):
    return statistics.median(xs) if xs else None

def fmt(x):
    return "-" if x is None else f"{x:.2f}"

head = ("scenario", "runs", "first write s (med/worst)", "write pause s (med/worst)",
        "acked", "lost (direct)", "fencing s (max)", "2 primaries s", "settle s (med)", "moved")
print("%-22s %4s %26s %26s %8s %13s %16s %13s %14s %6s" % head)
for name in order + sorted(set(by) - set(order)):
    rs = by.get(name)
    if not rs:
        continue
    first = [r["time_to_first_write"] for r in rs if r["time_to_first_write"] is not None]
    unrecovered = sum(1 for r in rs if r["time_to_first_write"] is None)
    pause = [r["write_pause"] for r in rs]
    windows = [r["fencing_window"] for r in rs if r["fencing_window"] is not None]
    fencing = max(windows) if windows else None
    settle = [r["time_to_settled"] for r in rs]
    moved = sum(1 for r in rs if r["new_primary"] != r["old_primary"])
    print("%-22s %4d %26s %26s %8d %13s %16s %13s %14s %6s" % (
        name, len(rs),
        f"{fmt(med(first))} / {fmt(max(first) if first else None)}" + (f" ({unrecovered} never)" if unrecovered else ""),
        f"{fmt(med(pause))} / {fmt(max(pause))}",
        sum(r["acked"] for r in rs),
        f"{sum(r['lost_acked'] for r in rs)} ({sum(r['lost_acked_direct'] for r in rs)})",
        f"{fmt(fencing)} ({max(r['fencing_writes'] for r in rs)} w)" if windows else "-",
        fmt(max(r["two_primaries"] for r in rs)),
        fmt(med(settle)),
        f"{moved}/{len(rs)}",
    ))
lost = sum(r["lost_acked"] for r in rows)
print()
print(f"acknowledged writes lost over all {len(rows)} runs: {lost}")
EOF
log "results: $RESULTS"
exit $rc
