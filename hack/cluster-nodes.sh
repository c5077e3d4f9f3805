# shellcheck shell=bash
# hack/cluster-nodes.sh — the real nodes of hack/cluster (sourced by hack/cluster, not run).
#
# Each real node is a kubelet with its own containerd (runc, CNI bridge), root directory, cgroup
# root, bridge and pod subnet, all on this machine. One kube-proxy (iptables) and one CoreDNS run
# on the host for all of them. Every fixed resource is offset by CLUSTER_INDEX so that up to four
# clusters (other VALKEY_OPERATOR_CACHE, other VALKEY_OPERATOR_CLUSTER_INDEX) run side by side.
# See hack/README.md, "Real nodes".
#
# Expects from hack/cluster: BIN, STATE, CLUSTER_DIR, KUBECONFIG_PATH, CLUSTER_INDEX, REAL_NODES,
# HOST_PATH, log, die, kubectl_, wait_for.

# ------------------------------------------------------------------------------ layout (per index)

# node_layout <index> <real nodes>: every name, range and port below depends on the index.
node_layout() {
  I=$1 REAL_NODES=$2
  REAL_POD_CIDR=10.$((88 + I)).0.0/16   # node n: 10.(88+I).n.0/24, node IP 10.(88+I).n.1
  SERVICE_CIDR=10.$((96 + I)).0.0/16
  SERVICE_APISERVER_IP=10.$((96 + I)).0.1 # the `kubernetes` Service
  KWOK_POD_CIDR=10.$((244 + I)).0.0/16
  ROUTE_TABLE=$((4240 + I))             # routing table and rule priority for traffic from the pods
  BRIDGE_PREFIX=vo${I}node              # bridges vo<I>node<n>; iptables matches vo<I>node+
  IPT_PREFIX=VO${I}-                    # every iptables chain of this cluster (kube-proxy's KUBE-* too)
  CGROUP_ROOT=valkey-operator-$I        # /sys/fs/cgroup/<controller>/valkey-operator-<I>/real-node-<n>
  PORT_BASE=$((11000 + 100 * I))        # 127.0.0.1 health/metrics ports, see node_port
}
# Commands on an existing cluster use the layout it was created with.
recorded_layout() {
  local i r
  if [[ -f $STATE/nodes.settings ]] && read -r i r <"$STATE/nodes.settings"; then
    node_layout "$i" "$r"
  fi
  return 0
}
record_layout() { echo "$I $REAL_NODES" >"$STATE/nodes.settings"; }
KWOK_TAINT_KEY=kwok.x-k8s.io/node     # KWOK nodes carry kwok.x-k8s.io/node=fake:NoSchedule
ZONES=(zone-a zone-b zone-c)
NODES_DIR=$STATE/nodes
HOSTSVC_DIR=$STATE/host               # kube-proxy, CoreDNS, iptables wrappers
PAUSE_IMAGE=registry.k8s.io/pause:3.10.1
VALKEY_IMAGE=docker.io/valkey/valkey:9.1.2
# The kubelet sets these once at start (protectKernelDefaults: false); they are put back after it.
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

node_name() { echo "real-node-$1"; }
node_ip() { echo "10.$((88 + I)).$1.1"; }
node_subnet() { echo "10.$((88 + I)).$1.0/24"; }
node_bridge() { echo "$BRIDGE_PREFIX$1"; }
node_dir() { echo "$NODES_DIR/real-node-$1"; }
# 127.0.0.1 ports: kubelet healthz PORT_BASE+10n; kube-proxy healthz/metrics +90/+91; CoreDNS
# health/ready +92/+93.
node_port() { echo $((PORT_BASE + 10 * $1)); }
node_index() { # real-node-N -> N
  [[ $1 =~ ^real-node-([0-9]+)$ ]] && ((BASH_REMATCH[1] < REAL_NODES)) || return 1
  echo "${BASH_REMATCH[1]}"
}
ctr_() { "$BIN/ctr" --address "$(node_dir "$1")/run/containerd.sock" -n k8s.io "${@:2}"; }

validate_node_settings() {
  [[ $CLUSTER_INDEX =~ ^[0-3]$ ]] || die "VALKEY_OPERATOR_CLUSTER_INDEX must be 0, 1, 2 or 3 (got '$CLUSTER_INDEX')"
  [[ $REAL_NODES =~ ^[0-9]$ ]] || die "VALKEY_OPERATOR_REAL_NODES must be 0..9 (got '$REAL_NODES')"
}

need_root() {
  [[ $(id -u) == 0 ]] || die "real nodes need root (VALKEY_OPERATOR_REAL_NODES=$REAL_NODES); run as root or set VALKEY_OPERATOR_REAL_NODES=0"
}

# Started as detached processes (own session, no inherited lock fd, fixed environment), like
# kwokctl starts the control plane. PATH puts the iptables wrappers first (see write_iptables_wrappers).
spawn() { # spawn <pidfile> <logfile> <command...>
  local pidfile=$1 logfile=$2
  shift 2
  env -i HOME="$HOME" LANG=C.UTF-8 PATH="$HOSTSVC_DIR/iptables:$BIN:$HOST_PATH" \
    setsid "$@" </dev/null >>"$logfile" 2>&1 9>&- &
  echo $! >"$pidfile"
}

pid_alive() { # pid_alive <pidfile>: the pid, if it runs a binary of this cache
  local pid exe state
  [[ -f $1 ]] || return 1
  pid=$(<"$1")
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [[ $exe == "$CACHE"/bin/* ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z ]] || return 1
  echo "$pid"
}

stop_pidfile() { # stop_pidfile <pidfile> [signal]
  local pid
  if pid=$(pid_alive "$1"); then
    kill "-${2:-TERM}" "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 15))
    while pid_alive "$1" >/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    pid_alive "$1" >/dev/null && { kill -KILL "$pid" 2>/dev/null || true; }
  fi
  rm -f "$1"
}

apiserver_port() {
  kubectl_ config view -o jsonpath='{.clusters[0].cluster.server}' | sed -n 's|^https://127.0.0.1:\([0-9]*\).*|\1|p'
}

# ------------------------------------------------------------------------------------ iptables

# kube-proxy and the kubelet name their iptables chains KUBE-*, and a second kube-proxy on the
# same machine would rewrite (and delete) the first one's chains. They run with these wrappers
# first on PATH: every KUBE- they write becomes VO<I>- in the kernel; what they read back shows
# VO<I>- as KUBE- and hides every other KUBE- chain (HOST-KUBE-), so each cluster only ever sees
# and touches its own chains.
write_iptables_wrappers() {
  local dir=$HOSTSVC_DIR/iptables cmd real
  mkdir -p "$dir"
  for cmd in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    real=$(PATH=$HOST_PATH command -v "$cmd") || die "$cmd not found (hack/cluster build installs iptables)"
    cat >"$dir/$cmd" <<EOF
#!/usr/bin/env bash
# Generated by hack/cluster: $cmd with chain names KUBE-* kept apart per cluster (hack/cluster-nodes.sh).
set -o pipefail
args=("\${@//KUBE-/$IPT_PREFIX}")
case $cmd in
  *-restore) sed 's/KUBE-/$IPT_PREFIX/g' | $real "\${args[@]}" ;;
  *) $real "\${args[@]}" | sed -e 's/KUBE-/HOST-KUBE-/g' -e 's/$IPT_PREFIX/KUBE-/g' ;;
esac
EOF
    chmod 0755 "$dir/$cmd"
  done
}

# Removes every rule that jumps to a chain of this cluster and every chain of this cluster
# (VO<I>-*), in all tables, IPv4 and IPv6.
iptables_cleanup() {
  local fam table rule chain
  for fam in iptables ip6tables; do
    command -v "$fam" >/dev/null || continue
    for table in filter nat mangle raw; do
      "$fam-save" -t "$table" >/dev/null 2>&1 || continue
      while read -r rule; do
        [[ -n $rule ]] || continue
        eval "$fam -t $table -D ${rule#-A }" 2>/dev/null || true
      done < <("$fam-save" -t "$table" 2>/dev/null | grep -E "^-A [^ ]+ .*-j $IPT_PREFIX" | grep -vE "^-A $IPT_PREFIX")
      while read -r chain; do
        "$fam" -t "$table" -F "$chain" 2>/dev/null || true
      done < <("$fam-save" -t "$table" 2>/dev/null | sed -n "s/^:\($IPT_PREFIX[^ ]*\) .*/\1/p")
      while read -r chain; do
        "$fam" -t "$table" -X "$chain" 2>/dev/null || true
      done < <("$fam-save" -t "$table" 2>/dev/null | sed -n "s/^:\($IPT_PREFIX[^ ]*\) .*/\1/p")
    done
  done
}

# ------------------------------------------------------------------------------------- network

# Confinement: every range of this cluster leads only into this machine.
# - Pods: a bridge per node (isGateway false in CNI, so the bridge plugin never sets the global
#   net.ipv4.ip_forward); forwarding is switched on per bridge only; everything that enters from a
#   bridge is routed with table ROUTE_TABLE, which knows only this cluster's node subnets and
#   otherwise `unreachable`. iptables drops forwarding between the bridges and any other interface.
# - Pods -> host: only DNS (CoreDNS on the node IPs), the API server (see below) and replies.
# - The Service range is routed into node 0's bridge: a packet kube-proxy does not DNAT dies
#   there as an unanswered ARP (a blackhole route would fail connect() before kube-proxy's OUTPUT
#   DNAT). Without real nodes it is unreachable.
# - KWOK's fake pod IPs and unused parts of the pod range: unreachable (no route off the machine).
# - Pods reach the API server at the `kubernetes` Service IP: PREROUTING DNATs it to the API
#   server's 127.0.0.1 port, allowed by route_localnet on the bridges only.
net_up() {
  local n br ip api_port
  api_port=$(apiserver_port)
  [[ -n $api_port ]] || die "cannot read the API server port from $KUBECONFIG_PATH"
  for ((n = 0; n < REAL_NODES; n++)); do
    br=$(node_bridge "$n") ip=$(node_ip "$n")
    ip link add "$br" type bridge
    ip addr add "$ip/24" dev "$br"
    ip link set "$br" up
    sysctl -qw "net.ipv4.conf.$br.forwarding=1" "net.ipv4.conf.$br.route_localnet=1"
    ip rule add iif "$br" lookup "$ROUTE_TABLE" pref "$ROUTE_TABLE"
    ip route add "$(node_subnet "$n")" dev "$br" src "$ip" table "$ROUTE_TABLE"
  done
  if ((REAL_NODES > 0)); then
    ip route add unreachable default table "$ROUTE_TABLE"
    ip route add "$SERVICE_CIDR" dev "$(node_bridge 0)" src "$(node_ip 0)"
    ip route add unreachable "$REAL_POD_CIDR"
  else
    ip route add unreachable "$SERVICE_CIDR"
  fi
  ip route add unreachable "$KWOK_POD_CIDR"

  ((REAL_NODES > 0)) || return 0
  local any="${BRIDGE_PREFIX}+" c=(-m comment --comment "valkey-operator cluster $I")
  iptables -N "${IPT_PREFIX}NODES-DOWN"   # filled by `node stop`
  iptables -N "${IPT_PREFIX}NODES-FORWARD"
  iptables -A "${IPT_PREFIX}NODES-FORWARD" -i "$any" ! -o "$any" -j DROP
  iptables -A "${IPT_PREFIX}NODES-FORWARD" -o "$any" ! -i "$any" -j DROP
  iptables -N "${IPT_PREFIX}NODES-INPUT"
  iptables -A "${IPT_PREFIX}NODES-INPUT" -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
  iptables -A "${IPT_PREFIX}NODES-INPUT" -d "$REAL_POD_CIDR" -p udp --dport 53 -j RETURN
  iptables -A "${IPT_PREFIX}NODES-INPUT" -d "$REAL_POD_CIDR" -p tcp --dport 53 -j RETURN
  iptables -A "${IPT_PREFIX}NODES-INPUT" -d 127.0.0.1 -p tcp --dport "$api_port" -m conntrack --ctstate DNAT -j RETURN
  iptables -A "${IPT_PREFIX}NODES-INPUT" -j DROP
  iptables -t nat -N "${IPT_PREFIX}NODES-APISERVER"
  iptables -t nat -A "${IPT_PREFIX}NODES-APISERVER" -d "$SERVICE_APISERVER_IP" -p tcp --dport 443 \
    -j DNAT --to-destination "127.0.0.1:$api_port"
  local chain
  for chain in INPUT OUTPUT FORWARD; do
    iptables -I "$chain" 1 "${c[@]}" -j "${IPT_PREFIX}NODES-DOWN"
  done
  iptables -I FORWARD 2 "${c[@]}" -j "${IPT_PREFIX}NODES-FORWARD"
  iptables -I INPUT 2 -i "$any" "${c[@]}" -j "${IPT_PREFIX}NODES-INPUT"
  iptables -t nat -I PREROUTING 1 -i "$any" "${c[@]}" -j "${IPT_PREFIX}NODES-APISERVER"
}

net_down() {
  local n br
  while ip rule del pref "$ROUTE_TABLE" 2>/dev/null; do :; done
  ip route flush table "$ROUTE_TABLE" 2>/dev/null || true
  ip route del "$SERVICE_CIDR" 2>/dev/null || true
  ip route del "$REAL_POD_CIDR" 2>/dev/null || true
  ip route del "$KWOK_POD_CIDR" 2>/dev/null || true
  for br in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//'); do
    [[ $br =~ ^$BRIDGE_PREFIX[0-9]+$ ]] && ip link del "$br"
  done
  return 0
}

# ------------------------------------------------------------------------------------- cgroups

# The cgroup v1 hierarchies (where cgroupRoot must exist); with `all`, also the cgroup2 one of a
# hybrid host, where runc creates the containers' cgroups too.
cgroup_hierarchies() {
  local d
  for d in /sys/fs/cgroup/*/; do
    d=${d%/}
    [[ $d == */unified && ${1:-} != all ]] && continue
    [[ -f $d/cgroup.procs ]] && echo "$d"
  done
  return 0
}

cgroups_up() {
  local n d
  for d in $(cgroup_hierarchies); do
    for ((n = 0; n < REAL_NODES; n++)); do
      mkdir -p "$d/$CGROUP_ROOT/real-node-$n"
      if [[ $d == */cpuset ]]; then
        cat "$d/cpuset.cpus" >"$d/$CGROUP_ROOT/cpuset.cpus"
        cat "$d/cpuset.mems" >"$d/$CGROUP_ROOT/cpuset.mems"
        cat "$d/cpuset.cpus" >"$d/$CGROUP_ROOT/real-node-$n/cpuset.cpus"
        cat "$d/cpuset.mems" >"$d/$CGROUP_ROOT/real-node-$n/cpuset.mems"
      fi
    done
  done
}

# Kills every process left in this cluster's cgroups (thawed first), then removes the cgroups.
thaw_all() {
  local f
  [[ -d /sys/fs/cgroup/freezer/$CGROUP_ROOT ]] || return 0
  while read -r f; do echo THAWED >"$f" 2>/dev/null || true; done < <(find "/sys/fs/cgroup/freezer/$CGROUP_ROOT" -name freezer.state)
}

cgroups_down() {
  local d f pids
  thaw_all
  for d in $(cgroup_hierarchies all); do
    [[ -d $d/$CGROUP_ROOT ]] || continue
    pids=$(find "$d/$CGROUP_ROOT" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
    [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
  done
  local deadline=$((SECONDS + 10))
  for d in $(cgroup_hierarchies all); do
    [[ -d $d/$CGROUP_ROOT ]] || continue
    until find "$d/$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null; [[ ! -d $d/$CGROUP_ROOT ]]; do
      ((SECONDS < deadline)) || { log "cannot remove $d/$CGROUP_ROOT"; break; }
      sleep 0.2
    done
  done
  return 0
}

sysctls_save() {
  local f=$STATE/sysctl.saved k
  [[ -f $f ]] && return 0
  for k in "${KUBELET_SYSCTLS[@]}"; do echo "$k=$(sysctl -n "$k")"; done >"$f"
}
sysctls_restore() { [[ ! -f $STATE/sysctl.saved ]] || sysctl -q -p "$STATE/sysctl.saved" >/dev/null || true; }

# ------------------------------------------------------------------------------------- configs

write_node_config() {
  local n=$1 dir ip name port
  dir=$(node_dir "$n") ip=$(node_ip "$n") name=$(node_name "$n") port=$(node_port "$n")
  mkdir -p "$dir"/{run,logs,pki,kubelet,pod-logs,cni/conf,cni/networks,containerd}
  # The kubelet's serving certificate, signed by the cluster CA (the API server verifies it).
  openssl req -new -newkey rsa:2048 -nodes -keyout "$dir/pki/kubelet.key" \
    -subj "/O=system:nodes/CN=system:node:$name" -out "$dir/pki/kubelet.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s,DNS:%s\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' \
    "$ip" "$name" >"$dir/pki/ext.cnf"
  openssl x509 -req -in "$dir/pki/kubelet.csr" -CA "$CLUSTER_DIR/pki/ca.crt" -CAkey "$CLUSTER_DIR/pki/ca.key" \
    -CAcreateserial -CAserial "$dir/pki/ca.srl" -days 30 -extfile "$dir/pki/ext.cnf" -out "$dir/pki/kubelet.crt" 2>/dev/null
  # What pods with dnsPolicy Default get (ClusterFirst pods get clusterDNS and the search list).
  printf 'nameserver %s\n' "$ip" >"$dir/resolv.conf"

  cat >"$dir/cni/conf/10-$name.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "vo$I-$name",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$(node_bridge "$n")",
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/networks",
        "ranges": [[{"subnet": "$(node_subnet "$n")", "rangeStart": "10.$((88 + I)).$n.10", "gateway": "$ip"}]],
        "routes": [{"dst": "0.0.0.0/0", "gw": "$ip"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

  cat >"$dir/containerd.toml" <<EOF
# Generated by hack/cluster for $name.
version = 3
root = '$dir/containerd/root'
state = '$dir/containerd/state'
[grpc]
  address = '$dir/run/containerd.sock'
[ttrpc]
  address = '$dir/run/containerd.sock.ttrpc'
[debug]
  address = ''
[metrics]
  address = ''
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      # imported by hack/cluster; nothing is ever pulled
      sandbox = '$PAUSE_IMAGE'
  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    netns_mounts_under_state_dir = true
    # Without CAP_SYS_RESOURCE (as on the CI VMs) a negative oom_score_adj fails in runc init.
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$(PATH=$HOST_PATH command -v runc)'
          Root = '$dir/containerd/runc'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/usr/lib/cni']
      conf_dir = '$dir/cni/conf'
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
EOF

  cat >"$dir/kubelet.yaml" <<EOF
# Generated by hack/cluster for $name.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 host (kubelet >= 1.35 refuses it otherwise); no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT/real-node-$n
containerRuntimeEndpoint: unix://$dir/run/containerd.sock
imageServiceEndpoint: unix://$dir/run/containerd.sock
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $port
tlsCertFile: $dir/pki/kubelet.crt
tlsPrivateKeyFile: $dir/pki/kubelet.key
# The API server presents the admin client certificate; access is checked by webhook (RBAC).
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $CLUSTER_DIR/pki/ca.crt
authorization:
  mode: Webhook
podLogsDir: $dir/pod-logs
resolvConf: $dir/resolv.conf
clusterDomain: cluster.local
clusterDNS: [$ip]
# Locally imported images cannot be pulled again: never collected; no disk-pressure evictions.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
maxPods: 50
serializeImagePulls: false
staticPodPath: ""
EOF
}

write_host_config() {
  local b=$PORT_BASE n binds=""
  mkdir -p "$HOSTSVC_DIR"
  for ((n = 0; n < REAL_NODES; n++)); do binds+=" $(node_ip "$n")"; done
  cat >"$HOSTSVC_DIR/kube-proxy.yaml" <<EOF
# Generated by hack/cluster: one kube-proxy for all real nodes.
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: $KUBECONFIG_PATH
hostnameOverride: $(node_name 0)
healthzBindAddress: 127.0.0.1:$((b + 90))
metricsBindAddress: 127.0.0.1:$((b + 91))
clusterCIDR: $REAL_POD_CIDR
detectLocalMode: ClusterCIDR
nodePortAddresses: ["$REAL_POD_CIDR"]
iptables:
  localhostNodePorts: false
  # Every Service connection is masqueraded, so replies always come back through the host.
  masqueradeAll: true
  masqueradeBit: $((10 + I))
  syncPeriod: 30s
  minSyncPeriod: 1s
# 0: the machine's conntrack sysctls are left alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
EOF
  cat >"$HOSTSVC_DIR/Corefile" <<EOF
# Generated by hack/cluster: the cluster DNS of the real nodes (their clusterDNS is the node IP).
.:53 {
    bind$binds
    errors
    health 127.0.0.1:$((b + 92))
    ready 127.0.0.1:$((b + 93))
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KUBECONFIG_PATH
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    # no forward: nothing may leave this machine
    cache 5
}
EOF
}

# ----------------------------------------------------------------------------------- processes

start_containerd() {
  local n=$1 dir
  dir=$(node_dir "$n")
  spawn "$dir/containerd.pid" "$dir/logs/containerd.log" "$BIN/containerd" --config "$dir/containerd.toml"
  wait_for 30 "containerd of $(node_name "$n")" ctr_ "$n" version >/dev/null 2>&1 || {
    tail -n 20 "$dir/logs/containerd.log" >&2
    return 1
  }
}

start_kubelet() {
  local n=$1 dir
  dir=$(node_dir "$n")
  spawn "$dir/kubelet.pid" "$dir/logs/kubelet.log" "$BIN/kubelet" --config="$dir/kubelet.yaml" \
    --kubeconfig="$KUBECONFIG_PATH" --root-dir="$dir/kubelet" --cert-dir="$dir/pki" \
    --hostname-override="$(node_name "$n")" --node-ip="$(node_ip "$n")" \
    --node-labels="type=real,topology.kubernetes.io/zone=${ZONES[n % 3]},topology.kubernetes.io/region=local" \
    --v=1
}

import_images() { # import_images <n> <archives...>
  local n=$1 f
  shift
  for f in "$@"; do
    ctr_ "$n" images import "$f" >/dev/null 2>>"$(node_dir "$n")/logs/ctr.log" ||
      { log "cannot import $f into $(node_name "$n") (see $(node_dir "$n")/logs/ctr.log)"; return 1; }
  done
}

node_ready() {
  [[ $(kubectl_ get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
all_real_nodes_ready() {
  local n
  for ((n = 0; n < REAL_NODES; n++)); do node_ready "$(node_name "$n")" || return 1; done
}

real_nodes_running() {
  local n
  ((REAL_NODES > 0)) || return 0
  for ((n = 0; n < REAL_NODES; n++)); do
    pid_alive "$(node_dir "$n")/kubelet.pid" >/dev/null && pid_alive "$(node_dir "$n")/containerd.pid" >/dev/null || return 1
  done
  pid_alive "$HOSTSVC_DIR/kube-proxy.pid" >/dev/null && pid_alive "$HOSTSVC_DIR/coredns.pid" >/dev/null
}

# The images every node has: those `build` writes (IMAGES in hack/cluster: pause, Valkey, the
# metrics exporter), and whatever `load-image` loaded into this cluster.
node_images() {
  local i
  for i in "${IMAGES[@]}"; do echo "$BIN/$i"; done
  [[ -d $STATE/images ]] && find "$STATE/images" -name '*.tar' | sort
  return 0
}

# The volume helper: creates the hostPath directory of every kwok-volume PV as soon as the PV
# exists, mode 0777 (inside the root-only cache), because a kubelet creates a missing hostPath
# directory root-owned 0755 and applies no fsGroup to it, and Valkey runs as uid 999.
write_volume_helper() {
  cat >"$HOSTSVC_DIR/volume-helper" <<EOF
#!/usr/bin/env bash
# Generated by hack/cluster (write_volume_helper in hack/cluster-nodes.sh).
while :; do
  "$BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" get pv --watch \\
    -o jsonpath='{.spec.hostPath.path}{"\\n"}' 2>/dev/null | while read -r path; do
    case \$path in "$STATE/volumes/pvc-"*) mkdir -p "\$path" && chmod 0777 "\$path" ;; esac
  done
  sleep 1
done
EOF
  chmod 0755 "$HOSTSVC_DIR/volume-helper"
  mkdir -p "$STATE/volumes"
}

nodes_up() {
  validate_node_settings
  if ((REAL_NODES == 0)); then
    if [[ $(id -u) == 0 ]]; then net_up; else log "not root: KWOK's pod range $KWOK_POD_CIDR is not confined"; fi
    return 0
  fi
  need_root
  local n start=$SECONDS images
  mapfile -t images < <(node_images)
  log "real nodes: $REAL_NODES (cluster index $I: pods $REAL_POD_CIDR, services $SERVICE_CIDR, KWOK pods $KWOK_POD_CIDR)"
  mkdir -p "$NODES_DIR" "$HOSTSVC_DIR"
  # nft tables present before: iptables-nft creates ip/ip6 filter, nat, mangle on first use.
  [[ -f $STATE/nft-tables.before ]] || { nft list tables 2>/dev/null || true; } >"$STATE/nft-tables.before"
  write_iptables_wrappers
  net_up
  cgroups_up
  sysctls_save
  write_host_config
  for ((n = 0; n < REAL_NODES; n++)); do
    write_node_config "$n"
    start_containerd "$n" || return 1
    import_images "$n" "${images[@]}" || return 1
    start_kubelet "$n"
  done
  spawn "$HOSTSVC_DIR/kube-proxy.pid" "$HOSTSVC_DIR/kube-proxy.log" "$BIN/kube-proxy" \
    --config="$HOSTSVC_DIR/kube-proxy.yaml" --v=1
  spawn "$HOSTSVC_DIR/coredns.pid" "$HOSTSVC_DIR/coredns.log" "$BIN/coredns" -conf "$HOSTSVC_DIR/Corefile"
  write_volume_helper
  spawn "$HOSTSVC_DIR/volume-helper.pid" "$HOSTSVC_DIR/volume-helper.log" "$HOSTSVC_DIR/volume-helper"
  if ! wait_for 120 "$REAL_NODES Ready real nodes" all_real_nodes_ready; then
    for ((n = 0; n < REAL_NODES; n++)); do tail -n 10 "$(node_dir "$n")/logs/kubelet.log" >&2; done
    return 1
  fi
  # The kubelet writes its sysctls once, while its container manager starts (before Ready).
  sleep 1
  sysctls_restore
  wait_for 30 "CoreDNS" curl -fsS "http://127.0.0.1:$((PORT_BASE + 93))/ready" -o /dev/null || return 1
  log "real nodes Ready in $((SECONDS - start))s"
}

# Everything nodes_up made, in an order that leaves nothing behind; safe to run at any point and
# more than once. No pod is deleted gracefully: the containers are killed through their cgroups,
# and what CNI would release (veths, addresses) goes with the pod network namespaces and the bridges.
nodes_down() {
  [[ $(id -u) == 0 && -f $STATE/nodes.settings ]] || return 0
  local n dir api=0
  [[ -f $KUBECONFIG_PATH ]] && api_ready && api=1
  [[ -d $HOSTSVC_DIR ]] && {
    # the helper is a session leader (setsid): its group holds it and its kubectl watch
    [[ ! -f $HOSTSVC_DIR/volume-helper.pid ]] || kill -- "-$(<"$HOSTSVC_DIR/volume-helper.pid")" 2>/dev/null || true
    stop_pidfile "$HOSTSVC_DIR/coredns.pid"
    stop_pidfile "$HOSTSVC_DIR/kube-proxy.pid"
    [[ -x $BIN/kube-proxy && -d $HOSTSVC_DIR/iptables ]] &&
      env -i PATH="$HOSTSVC_DIR/iptables:$HOST_PATH" "$BIN/kube-proxy" --cleanup --v=0 >/dev/null 2>&1 9>&- || true
  }
  if [[ -d $NODES_DIR ]]; then
    thaw_all
    for dir in "$NODES_DIR"/real-node-*; do
      [[ -d $dir ]] || continue
      node_continue "$dir"
      stop_pidfile "$dir/kubelet.pid"
      if pid_alive "$dir/containerd.pid" >/dev/null; then
        local t c ctr=("$BIN/ctr" --address "$dir/run/containerd.sock" -n k8s.io)
        for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks kill -s KILL "$t" >/dev/null 2>&1; done
        sleep 0.5
        for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks delete -f "$t" >/dev/null 2>&1; done
        for c in $("${ctr[@]}" containers ls -q 2>/dev/null); do "${ctr[@]}" containers delete "$c" >/dev/null 2>&1; done
      fi
      stop_pidfile "$dir/containerd.pid"
      # shims outlive containerd
      local pid
      for pid in $(pgrep -f -- "-address $dir/run/containerd.sock" || true); do kill -KILL "$pid" 2>/dev/null || true; done
    done
    if ((api)); then
      for dir in "$NODES_DIR"/real-node-*; do
        [[ -d $dir ]] && kubectl_ delete node "${dir##*/}" --ignore-not-found --wait=false >/dev/null 2>&1 || true
      done
    fi
  fi
  cgroups_down
  if [[ -d $NODES_DIR ]]; then
    awk -v s="$NODES_DIR/" 'index($2, s) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  fi
  # iptables only if nodes_up got that far: any iptables-nft call, even -S, creates nft tables.
  [[ ! -f $STATE/nft-tables.before ]] || iptables_cleanup || true
  net_down
  # Last: the nft tables iptables-nft created, if they were not there before and are empty.
  if [[ -f $STATE/nft-tables.before ]] && command -v nft >/dev/null; then
    local t
    for t in "ip filter" "ip nat" "ip mangle" "ip raw" "ip6 filter" "ip6 nat" "ip6 mangle" "ip6 raw"; do
      grep -qx "table $t" "$STATE/nft-tables.before" && continue
      # only tables nobody else uses: no rule left in them
      nft list table $t >/dev/null 2>&1 || continue
      nft list table $t | grep -vqE '^\s*(table|chain|type|policy|\}|$)' || nft delete table $t 2>/dev/null || true
    done
  fi
  # Paths the kubelet and containerd use whatever they are configured with, shared by every
  # cluster on the machine: removed when no other real node runs.
  if ! pgrep -x kubelet >/dev/null && ! pgrep -f containerd-shim-runc-v2 >/dev/null; then
    rm -rf /run/containerd/s /var/lib/kubelet/device-plugins
    rmdir /run/containerd /var/lib/kubelet 2>/dev/null || true
  fi
  rm -f /var/lib/cni/results/vo"$I"-real-node-* 2>/dev/null
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
  sysctls_restore
  rm -rf "$NODES_DIR" "$HOSTSVC_DIR" "$STATE/sysctl.saved" "$STATE/nft-tables.before"
}

# ------------------------------------------------------------------------------ node stop/start

node_pids_of() { # containerd and its shims of a node dir
  local dir=$1
  pid_alive "$dir/containerd.pid" || true
  pgrep -f -- "-address $dir/run/containerd.sock" || true
}
node_continue() {
  local pid
  for pid in $(node_pids_of "$1"); do kill -CONT "$pid" 2>/dev/null || true; done
}

# The node dies as a machine does: its kubelet is killed, its containers are frozen (cgroup
# freezer), containerd and the shims are stopped (SIGSTOP), and its bridge drops every packet.
cmd_node_stop() {
  local n dir br freezer pid
  n=$(node_index "$1") || die "no real node named '$1' (real-node-0 .. real-node-$((REAL_NODES - 1)))"
  need_root
  dir=$(node_dir "$n") br=$(node_bridge "$n")
  if pid=$(pid_alive "$dir/kubelet.pid"); then kill -KILL "$pid" || true; fi
  freezer=/sys/fs/cgroup/freezer/$CGROUP_ROOT/real-node-$n
  echo FROZEN >"$freezer/freezer.state"
  for pid in $(node_pids_of "$dir"); do kill -STOP "$pid" 2>/dev/null || true; done
  iptables -C "${IPT_PREFIX}NODES-DOWN" -i "$br" -j DROP 2>/dev/null || {
    iptables -A "${IPT_PREFIX}NODES-DOWN" -i "$br" -j DROP
    iptables -A "${IPT_PREFIX}NODES-DOWN" -o "$br" -j DROP
  }
  log "$1 stopped: kubelet killed, containers frozen, $br unreachable (NotReady within about 30 s)"
}

cmd_node_start() {
  local n dir br
  n=$(node_index "$1") || die "no real node named '$1' (real-node-0 .. real-node-$((REAL_NODES - 1)))"
  need_root
  dir=$(node_dir "$n") br=$(node_bridge "$n")
  while iptables -D "${IPT_PREFIX}NODES-DOWN" -i "$br" -j DROP 2>/dev/null; do :; done
  while iptables -D "${IPT_PREFIX}NODES-DOWN" -o "$br" -j DROP 2>/dev/null; do :; done
  echo THAWED >"/sys/fs/cgroup/freezer/$CGROUP_ROOT/real-node-$n/freezer.state"
  node_continue "$dir"
  pid_alive "$dir/kubelet.pid" >/dev/null || start_kubelet "$n"
  wait_for 60 "$1 Ready" node_ready "$1" || return 1
  sleep 1
  sysctls_restore
  log "$1 started and Ready"
}

cmd_node() {
  lock
  [[ -f $KUBECONFIG_PATH ]] || die "no cluster (hack/cluster up)"
  case ${1:-} in
    stop) cmd_node_stop "${2:-}" ;;
    start) cmd_node_start "${2:-}" ;;
    *) die "usage: hack/cluster node stop|start real-node-N" ;;
  esac
}

# --------------------------------------------------------------------------------- load-image

cmd_load_image() {
  local f=${1:-} n
  [[ -f $f ]] || die "usage: hack/cluster load-image FILE.oci.tar (an OCI or docker archive)"
  lock
  ((REAL_NODES > 0)) || die "no real nodes (VALKEY_OPERATOR_REAL_NODES=0)"
  real_nodes_running || die "the real nodes do not run (hack/cluster up)"
  mkdir -p "$STATE/images"
  cp "$f" "$STATE/images/$(basename "$f")"
  for ((n = 0; n < REAL_NODES; n++)); do
    import_images "$n" "$f" || die "import into $(node_name "$n") failed"
  done
  log "loaded into $REAL_NODES real nodes: $(ctr_ 0 images ls -q 2>/dev/null | grep -v '^sha256:' | paste -sd' ')"
}

status_real_nodes() {
  local n dir p k c
  ((REAL_NODES > 0)) || return 0
  echo "real nodes (index $I: pods $REAL_POD_CIDR, services $SERVICE_CIDR, KWOK pods $KWOK_POD_CIDR):"
  for ((n = 0; n < REAL_NODES; n++)); do
    dir=$(node_dir "$n")
    k=$(pid_alive "$dir/kubelet.pid") || k=STOPPED
    c=$(pid_alive "$dir/containerd.pid") || c=STOPPED
    printf '  %-12s %-15s bridge %-9s kubelet %-8s containerd %s\n' "$(node_name "$n")" "$(node_ip "$n")" \
      "$(node_bridge "$n")" "$k" "$c"
  done
  for p in kube-proxy coredns; do
    printf '  %-12s %s\n' "$p" "$(pid_alive "$HOSTSVC_DIR/$p.pid" || echo STOPPED)"
  done
}

# ---------------------------------------------------------------------------------------- build

# Debian packages the real nodes use from the host: runc, the CNI plugins, iptables, conntrack (for
# kube-proxy), nftables (to remove the tables iptables-nft leaves behind), busybox-static (the
# shell and tools of the Valkey image). Installed when missing (apt-get update once, then install).
NODE_PACKAGES=(runc:/usr/sbin/runc containernetworking-plugins:/usr/lib/cni/bridge iptables:/usr/sbin/iptables
  conntrack:/usr/sbin/conntrack nftables:/usr/sbin/nft busybox-static:/bin/busybox)

ensure_node_packages() {
  local p missing=()
  for p in "${NODE_PACKAGES[@]}"; do
    [[ -e ${p#*:} ]] || missing+=("${p%%:*}")
  done
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]} with apt-get"
  local sudo=()
  [[ $(id -u) == 0 ]] || sudo=(sudo -n)
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >/dev/null &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null ||
    die "could not install ${missing[*]}; install them and rerun"
}

build_containerd() {
  local out=$1 v
  v=$(pin containerd github.com/containerd/containerd/v2)
  (cd "$BUILD_DIR/containerd" && go_ build -buildvcs=false -tags "no_btrfs no_zfs" \
    -ldflags "-X github.com/containerd/containerd/v2/version.Version=$v" -o "$out/" \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2)
}

build_coredns() {
  (cd "$BUILD_DIR/coredns" && CGO_ENABLED=0 go_ build -buildvcs=false -o "$1/" github.com/coredns/coredns)
}

# ---------------------------------------------------------------------------------------- images

# OCI archive of one single-layer image, written without any container engine; the reference is in
# index.json's io.containerd.image.name annotation, so `ctr images import` tags it.
oci_archive() { # oci_archive <rootfs> <ref> <config json> <out.tar> <work dir>
  local rootfs=$1 ref=$2 cfg=$3 out=$4 w=$5 layout
  layout=$w/layout
  rm -rf "$layout"
  mkdir -p "$layout/blobs/sha256"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$w/layer.tar" .
  local diff_id layer layer_size config config_size manifest manifest_size
  diff_id=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
  gzip -n -c "$w/layer.tar" >"$w/layer.tgz"
  layer=$(sha256sum "$w/layer.tgz" | cut -d' ' -f1) layer_size=$(stat -c %s "$w/layer.tgz")
  mv "$w/layer.tgz" "$layout/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$cfg" "$diff_id" >"$w/config.json"
  config=$(sha256sum "$w/config.json" | cut -d' ' -f1) config_size=$(stat -c %s "$w/config.json")
  mv "$w/config.json" "$layout/blobs/sha256/$config"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$w/manifest.json"
  manifest=$(sha256sum "$w/manifest.json" | cut -d' ' -f1) manifest_size=$(stat -c %s "$w/manifest.json")
  mv "$w/manifest.json" "$layout/blobs/sha256/$manifest"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$manifest_size" "$ref" "${ref##*:}" >"$layout/index.json"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$out" oci-layout index.json blobs
  rm -f "$w/layer.tar"
}

# Copies an executable and the shared libraries it links (as ldd resolves them) into a rootfs.
copy_with_libs() { # copy_with_libs <exe> <rootfs> <dest path>
  local exe=$1 root=$2 dest=$3 lib
  install -D -m 0755 "$exe" "$root$dest"
  for lib in $(ldd "$exe" | awk '/=>/ && $3 ~ /^\// {print $3} /^[[:space:]]*\/[^ ]*ld-linux/ {print $1}'); do
    [[ -e $root$lib ]] || install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
  done
}

# pause: the kubelet's sandbox image, from pause.c of the pinned Kubernetes release, static.
# valkey: the layout and commands of the upstream image valkey/valkey: valkey-server,
# valkey-sentinel and valkey-cli in /usr/local/bin, /data owned by valkey (999), a POSIX shell
# (busybox) for the operator's start.sh and probes. valkey-cli is Debian's redis-cli behind a
# wrapper that honours VALKEYCLI_AUTH as the real one does.
build_images() {
  local out=$1 w ksrc r
  w=$(mktemp -d "$CACHE/images.XXXXXX")
  mkdir -p "$out/images"
  export SOURCE_DATE_EPOCH=0
  ksrc=$(cd "$BUILD_DIR/kube" && go_ mod download -json "k8s.io/kubernetes@$(pin kube k8s.io/kubernetes)" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -f $ksrc/build/pause/linux/pause.c ]] || die "no pause.c in $ksrc"

  r=$w/pause
  mkdir -p "$r"
  gcc -Os -static -o "$r/pause" "$ksrc/build/pause/linux/pause.c" -DVERSION="${PAUSE_IMAGE##*:}-hack-cluster"
  strip "$r/pause"
  oci_archive "$r" "$PAUSE_IMAGE" '{"Entrypoint":["/pause"],"User":"65535:65535"}' "$out/images/pause.oci.tar" "$w"

  r=$w/valkey
  mkdir -p "$r"/{bin,usr/local/bin,usr/local/libexec,data,etc,tmp,proc,sys,dev}
  chmod 1777 "$r/tmp"
  install -m 0755 /bin/busybox "$r/bin/busybox"
  local a
  for a in $("$r/bin/busybox" --list); do
    [[ $a == busybox ]] || ln -sf busybox "$r/bin/$a"
  done
  copy_with_libs "$out/valkey-server" "$r" /usr/local/bin/valkey-server
  ln -sf valkey-server "$r/usr/local/bin/valkey-sentinel"
  copy_with_libs "$(PATH=$HOST_PATH command -v redis-cli)" "$r" /usr/local/libexec/redis-cli
  cat >"$r/usr/local/bin/valkey-cli" <<'CLI'
#!/bin/sh
# valkey-cli of the hack/cluster Valkey image: Debian's redis-cli (same protocol), with the
# password from VALKEYCLI_AUTH, which the real valkey-cli honours.
if [ -n "${VALKEYCLI_AUTH:-}" ] && [ -z "${REDISCLI_AUTH:-}" ]; then
  REDISCLI_AUTH=$VALKEYCLI_AUTH
  export REDISCLI_AUTH
fi
exec /usr/local/libexec/redis-cli "$@"
CLI
  chmod 0755 "$r/usr/local/bin/valkey-cli"
  printf 'root:x:0:0:root:/root:/bin/sh\nvalkey:x:999:999:valkey:/data:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$r/etc/passwd"
  printf 'root:x:0:\nvalkey:x:999:\nnogroup:x:65534:\n' >"$r/etc/group"
  chown 999:999 "$r/data"
  oci_archive "$r" "$VALKEY_IMAGE" \
    '{"Cmd":["valkey-server"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"WorkingDir":"/data","ExposedPorts":{"6379/tcp":{}},"Volumes":{"/data":{}}}' \
    "$out/images/valkey.oci.tar" "$w"
  rm -rf "$w"
}

validate_node_settings
node_layout "$CLUSTER_INDEX" "$REAL_NODES"
