# The guest's topology and the helpers every scenario file uses, sourced once (busybox ash, after
# lib.sh): the node (root namespace), an off-cluster client, three pods behind the node.
#
#   root namespace = the node (agent, IPVS, swyd-ipvs0)   192.168.100.1 ── veth ── client 192.168.100.2
#   pod-a 10.244.0.2, pod-b 10.244.0.3, pod-c 10.244.0.4: /32 behind the node (gateway 10.244.0.1)
#   each pod: `switchyard-lab serve` on tcp 8080 / udp 5353 (answers with its name and the source it
#   saw), and a socat echo on tcp 9000 that holds connections open (for graceful removal)
#   10.244.9.0/24: "pods on another node", routed to the client, which drops them
TOPOLOGY=up

NODE=192.168.100.1
CLIENT=192.168.100.2
PLAN=/tmp/plan.yaml
STATUS=/tmp/status.yaml

# --- topology ------------------------------------------------------------------------------------
modprobe veth
modprobe dummy
ip link set lo up
echo 1 >/proc/sys/net/ipv4/ip_forward
ip netns add client
ip link add vcl type veth peer name eth0 netns client
ip addr add $NODE/24 dev vcl
ip link set vcl up
ip -n client link set lo up
ip -n client addr add $CLIENT/24 dev eth0
ip -n client link set eth0 up
ip -n client route add default via $NODE
ip route add 10.244.9.0/24 via $CLIENT

pod() {
  ip netns add "$1"
  ip link add "v$1" type veth peer name eth0 netns "$1"
  ip addr add 10.244.0.1/32 dev "v$1"
  ip link set "v$1" up
  ip route add "$2/32" dev "v$1"
  ip -n "$1" link set lo up
  ip -n "$1" addr add "$2/32" dev eth0
  ip -n "$1" link set eth0 up
  ip -n "$1" route add 10.244.0.1 dev eth0
  ip -n "$1" route add default via 10.244.0.1
  ip netns exec "$1" /mnt/host/switchyard-lab serve --name "$1" --tcp 8080 --udp 5353 >"/tmp/$1.log" 2>&1 &
  ip netns exec "$1" /usr/bin/socat TCP-LISTEN:9000,fork,reuseaddr SYSTEM:"echo $1; exec cat" >/dev/null 2>&1 &
}
pod pod-a 10.244.0.2
pod pod-b 10.244.0.3
pod pod-c 10.244.0.4
# Something listening on every node address, port 81: reaching it through a service IP must be refused.
lab serve --name node --tcp 81 >/tmp/node81.log 2>&1 &

probe() { lab probe "$@" --timeout-ms 2000; }
# answers COUNT DST [NETNS]: the JSON tally of COUNT TCP probes from the client (or NETNS).
tally() { lab probe tcp "$2" --netns "${3:-client}" --count "$1" --timeout-ms 2000 2>/dev/null; }
contains() { case "$1" in *"$2"*) return 0 ;; *) echo "expected '$2' in: $1"; return 1 ;; esac; }
lacks() { case "$1" in *"$2"*) echo "did not expect '$2' in: $1"; return 1 ;; *) return 0 ;; esac; }
not() { if "$@" >/dev/null 2>&1; then echo "unexpectedly true: $*"; return 1; fi; }
# one_pod TALLY N: all N answers came from a single pod.
# has_line TEXT REGEX: TEXT has a line matching REGEX (shows TEXT when not).
has_line() { echo "$1" | grep -Eq "$2" || { echo "no line matching '$2' in:"; echo "$1"; return 1; }; }
one_pod() { echo "$1" | grep -Eq '"answered":\{"pod-.":'"$2"'\}' || { echo "not all from one pod: $1"; return 1; }; }
# masq_reals VS WEIGHT: how many masquerading real servers of VS have WEIGHT.
masq_reals() { ipvsadm -Ln -t "$1" | awk -v w="$2" '$3 == "Masq" && $4 == w' | wc -l; }
count_is() { local n="$1"; shift; [ "$("$@")" -eq "$n" ] || { echo "$*: $("$@") instead of $n"; return 1; }; }
# real_state VS REAL: "weight/active" of one real server ("" when absent).
real_state() { ipvsadm -Ln -t "$1" | awk -v r="$2" '$2 == r {print $4 "/" $5}'; }
state_is() { [ "$(real_state "$1" "$2")" = "$3" ] || { echo "$2 of $1 is '$(real_state "$1" "$2")', want '$3'"; return 1; }; }
on_dummy() { /usr/sbin/ip -o addr show dev swyd-ipvs0 2>/dev/null | grep -q " $1/"; }
has_vs() { ipvsadm -Ln | grep -q "$1"; }
in_status() { grep -q "$1" $STATUS; }
now_ms() { awk '{printf "%d\n", $1 * 1000}' /proc/uptime; }
first_line_from() { /usr/sbin/ip netns exec client sh -c "echo | /usr/bin/socat -T 2 - TCP:$1" 2>/dev/null | head -n 1; }
eventually 20 probe tcp 10.244.0.2:8080 >/dev/null && eventually 20 probe tcp 10.244.0.4:8080 >/dev/null \
  || diag "pods did not come up: $(cat /tmp/pod-*.log)"

# write_plan REVISION BACKEND <<services: a bare NodeForwardingPlan spec, replaced atomically.
# write_plan NAME BACKEND < entries (CLUSTER_EXTRA: more lines of its cluster settings): the plan named NAME (sealed: `agent seal` gives it the revision its
# content hashes to, which every plan file must carry; rev NAME says it), written atomically.
write_plan() {
  {
    cat <<EOF
nodeName: vm-node
nodeIPs: ["$NODE"]
podCIDRs: ["10.244.0.0/24"]
backend: $2
cluster:
  detectLocal: ClusterCIDR
  localTrafficCIDRs: ["10.244.0.0/16"]
  masqueradeBit: 14
  masqueradeAll: false
  nodePortAddresses: ["primary"]
${CLUSTER_EXTRA:-}
revision: "$1"
summary: {entries: 0, endpoints: 0}
services:
EOF
    cat
  } >/tmp/plan.tmp && agent seal /tmp/plan.tmp >"/tmp/rev-$1" && mv /tmp/plan.tmp $PLAN
}
# rev NAME: the revision of the plan write_plan wrote as NAME.
rev() { cat "/tmp/rev-$1" 2>/dev/null || echo "$1"; }
applied() { grep -q "observedRevision: $(rev "$1")\$" $STATUS 2>/dev/null; }
ep() { echo "  - {ip: $1, port: $2, cluster: true, local: true, onNode: true}"; }
remote_ep() { echo "  - {ip: $1, port: $2, cluster: true}"; }
svc() { # name ip port [extra yaml lines...]
  local name="$1" ip="$2" port="$3"
  shift 3
  printf '%s\n' "- name: default/$name" "  protocol: TCP" "  family: IPv4" "  clusterIP: $ip" "  port: $port"
  for line in "$@"; do echo "  $line"; done
}
ab() { echo "  endpoints:"; ep 10.244.0.2 "${1:-8080}"; ep 10.244.0.3 "${1:-8080}"; }

