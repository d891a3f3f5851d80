# Backend switches on a real kernel (issue 43), run by scenarios.sh last, or alone:
# `run.sh --scenarios e2e/ipvs-vm/switch.sh` (the topology comes up first either way).
#
# 7. The node moves IPVS → nftables and back under steady traffic from the client (new connections to a
#    ClusterIP and a NodePort, one after another): make before break, so not one fails; no IPVS virtual
#    server is left on nftables and no nftables table on IPVS; the agent verifies each backend it
#    switches to (status.verification: kernel agrees, probes answered). A connection held open through
#    IPVS keeps flowing after the switch to nftables: the virtual server that carries it stays (the only
#    one; it is no leftover for the verification) until it closes, then IPVS's objects all go.
# 8. The verdict gate: with IPVS weights 3:1 a switch to nftables (which spreads evenly) is refused
#    before anything changes (Degraded/BackendSwitchRefused naming the Service, IPVS keeps forwarding at
#    3:1, no nftables table, counted in a metric); without the weights the same switch happens.

[ -n "${TOPOLOGY:-}" ] || . /mnt/host/topology.sh

METRICS=127.0.0.1:10264
# The status' verification block (its indented lines).
verification() { awk '/^verification:/ {v = 1; next} v && /^[^ ]/ {exit} v' $STATUS; }
# verified BACKEND REVISION [probed]: the verification is of BACKEND with REVISION and the kernel agrees;
# with `probed`, probes ran and all answered, without it none ran (a start checks the kernel only: probes
# are real connections to the Services, which their counters would count at every agent restart).
verified() {
  local v
  v=$(verification)
  if [ "${3:-}" = probed ]; then probes='echo "$v" | grep -q "^    failed: 0\$"'; else probes='! echo "$v" | grep -q "^  probes:"'; fi
  echo "$v" | grep -q "^  backend: $1\$" && echo "$v" | grep -q "^  revision: $(rev "$2")\$" \
    && echo "$v" | grep -q "^    mismatches: 0\$" && eval "$probes" \
    || { echo "verification: $v"; return 1; }
}
in_use() { grep -q "^backend: $1\$" $STATUS || { echo "status says $(grep '^backend:' $STATUS)"; return 1; }; }
nft_table() { /usr/sbin/nft list table ip switchyard >/dev/null 2>&1; }
our_vs() { ipvsadm -Ln | grep -Eq '10\.96\.1\.|192\.168\.100\.1:'; }
# steady: new TCP connections from the client, one after another, to the ClusterIP and the NodePort in
# turn (twenty per probe run: each run is a fork and exec, dear under emulation), until /tmp/steady.stop
# exists; each stream's tallies go to /tmp/steady-NAME.out.
steady() {
  rm -f /tmp/steady-clusterip.out /tmp/steady-nodeport.out
  ( while [ ! -e /tmp/steady.stop ]; do
      lab probe tcp 10.96.1.10:80 --netns client --count 20 --timeout-ms 2000 >>/tmp/steady-clusterip.out 2>&1
      lab probe tcp $NODE:30180 --netns client --count 20 --timeout-ms 2000 >>/tmp/steady-nodeport.out 2>&1
    done ) &
  STEADY=$!
}
# sum_of NAME KEY: the KEY counts of every tally of stream NAME, added up ("pod-" adds the answers).
sum_of() { grep -o "\"$2[a-z-]*\":[0-9]*" "/tmp/steady-$1.out" | awk -F: '{s += $2} END {print s + 0}'; }
# why REVISION: what the agent said while REVISION was not applied.
why() {
  applied "$1" && return 0
  diag "$1 not applied at $(now_ms) ms; status: $(grep -A4 'type: Applied' $STATUS); agent: $(tail -n 30 /tmp/agent-switch.log)"
  eventually 90 applied "$1" && diag "$1 applied at $(now_ms) ms"
}
no_failures() {
  local bad=$(($(sum_of "$1" refused) + $(sum_of "$1" timed_out) + $(sum_of "$1" errors)))
  [ "$bad" -eq 0 ] && [ "$(sum_of "$1" pod-)" -gt 0 ] || {
    echo "$1: $(sum_of "$1" pod-) answered, $bad failed:"; grep -v '"refused":0,"timed_out":0,"errors":0' "/tmp/steady-$1.out" | head -n 5
    return 1
  }
}
# held_flows: the held connection is open and its echoes keep coming back.
held_flows() {
  local before after
  before=$(grep -c x /tmp/held.out)
  sleep 2
  after=$(grep -c x /tmp/held.out)
  [ ! -e /tmp/held.end ] && [ "$after" -gt "$before" ] \
    || { echo "echoes: $before, 2 s later $after; ended at: $(cat /tmp/held.end 2>/dev/null)"; ipvsadm -Lnc; return 1; }
}
held_vs_stays() { ipvsadm -Ln | grep -q '10\.96\.1\.12:80' || { ipvsadm -Ln; return 1; }; }
# The other virtual servers IPVS still counts established connections on (the steady stream's, in
# flight at the switch), with IPVS's connection entries: said, not judged. IPVS sometimes keeps such an
# entry ESTABLISHED after its connection ended (seen 1 run in 35: 38 entries of steady connections
# whose close IPVS did not see), which keeps its virtual server until the drain period ends (kube-proxy's
# IPVS graceful termination reads the same counters); this agent runs with a 90 s period so the
# checks below wait for that bound instead of 10 minutes.
others_kept() {
  if ipvsadm -Ln | grep -Eq '10\.96\.1\.1[01]:|192\.168\.100\.1:'; then
    diag "kept beside the held connection's: $(ipvsadm -Ln | grep -A2 -E '10\.96\.1\.1[01]:|192\.168\.100\.1:'); entries: $(ipvsadm -Lnc | grep -v TIME_WAIT | head -n 12)"
  fi
}
switch_services() {
  svc sw-web:http 10.96.1.10 80 "hasEndpoints: true"; ab
  svc sw-nodeport:http 10.96.1.11 80 "nodePort: 30180" "hasEndpoints: true"; ab
  svc sw-hold:hold 10.96.1.12 80 "hasEndpoints: true" "endpoints:"; ep 10.244.0.3 9000
}

# --- 7. IPVS → nftables → IPVS under steady traffic ----------------------------------------------------------
# The node's own connections to a ClusterIP (the verification's probes) need a route to leave by before
# nftables' output DNAT picks the pod, as on any node with a default route.
ip route add 10.96.1.0/24 via $CLIENT
switch_services | write_plan s1 ipvs
rm -f $STATUS /tmp/steady.stop
/mnt/host/switchyard-lab agent run --plan-file $PLAN --status-file $STATUS --resync-period 1s --min-sync-interval 200ms \
  --poll-interval 100ms --metrics-bind $METRICS --healthz-bind-address off --status-bind-address off \
  --verify-probes 3 --verify-refusals-every 1s --verify-refusals-for 30s --ipvs-switch-drain-period 90s \
  >/tmp/agent-switch.log 2>&1 &
SWITCH_AGENT=$!
eventually 60 applied s1 || diag "s1 not applied: $(tail -n 20 /tmp/agent-switch.log)"
check "switch: IPVS programs the plan" has_vs 10.96.1.10:80
check "switch: the agent verifies IPVS at start (the kernel only, no probes)" eventually 30 verified ipvs s1
rm -f /tmp/held.end /tmp/held.writer
# The writer's pid is kept: killing it closes the connection (socat sees the end of its input).
( /bin/busybox sh -c 'echo $$ >/tmp/held.writer; while sleep 0.2; do echo x; done' ) |
  { /usr/sbin/ip netns exec client /usr/bin/socat - TCP:10.96.1.12:80 >/tmp/held.out 2>&1; now_ms >/tmp/held.end; } &
eventually 10 grep -q pod-b /tmp/held.out || diag "the held connection did not open: $(cat /tmp/held.out)"
steady
sleep 3
switch_services | write_plan s2 nftables
check "switch: the plan asking for nftables is applied" eventually 120 applied s2
why s2
check "switch: nftables is in use" in_use nftables
check "switch: nftables holds the rules" nft_table
check "switch: the connection held open through IPVS still flows" held_flows
check "switch: the virtual server that carries it stays" held_vs_stays
sleep 2
others_kept
check "switch: the agent verifies nftables (kernel agrees, probes answered)" eventually 30 verified nftables s2 probed
kill "$(cat /tmp/held.writer)"
check "switch: the held connection closes" eventually 10 test -e /tmp/held.end
# Within the drain period at the latest (90 s from the switch), whatever else IPVS counted.
check "switch: then no IPVS virtual server is left" eventually 120 not our_vs
check "switch: then swyd-ipvs0 is removed" eventually 5 not /usr/sbin/ip link show swyd-ipvs0
sleep 3
switch_services | write_plan s3 ipvs
check "switch back: the plan asking for IPVS is applied" eventually 120 applied s3
why s3
check "switch back: IPVS is in use" in_use ipvs
check "switch back: IPVS programs the plan again" has_vs 10.96.1.11:80
check "switch back: no nftables table left behind" not nft_table
check "switch back: the agent verifies IPVS again" eventually 30 verified ipvs s3 probed
sleep 3
touch /tmp/steady.stop
wait $STEADY
diag "steady traffic: ClusterIP $(sum_of clusterip pod-) answered, NodePort $(sum_of nodeport pod-) answered"
check "switches: not one new connection to the ClusterIP failed" no_failures clusterip
check "switches: not one new connection to the NodePort failed" no_failures nodeport
no_unexpected() { verification | grep -q '^    unexpected: 0$' || { echo "verification: $(verification)"; return 1; }; }
check "refusals: the verification counts none the plan does not explain" no_unexpected

# --- 8. the verdict gate refuses a switch that would change a Service's spread ---------------------------------
weighted_services() {
  switch_services
  svc sw-wrr:http 10.96.1.20 80 "scheduler: wrr" "hasEndpoints: true" "endpoints:"
  if [ "$1" = weights ]; then
    echo "  - {ip: 10.244.0.2, port: 8080, cluster: true, local: true, onNode: true, weight: 3}"
  else
    ep 10.244.0.2 8080
  fi
  ep 10.244.0.3 8080
}
weighted_services weights | write_plan w1 ipvs
eventually 30 applied w1 || diag "w1 not applied: $(tail -n 5 /tmp/agent-switch.log)"
weighted_services weights | write_plan w2 nftables
check "gate: the plan asking for nftables is applied by IPVS" eventually 30 applied w2
why w2
check "gate: IPVS stays in use" in_use ipvs
check "gate: Degraded/BackendSwitchRefused" in_status "reason: BackendSwitchRefused"
check "gate: the reason names the Service whose spread would change" in_status "default/sw-wrr"
check "gate: the Services that keep their verdicts are not named" not sh -c "grep '^backendReason:' $STATUS | grep -q sw-web"
check "gate: nothing of nftables was programmed" not nft_table
check "gate: IPVS keeps the planned weight" count_is 1 masq_reals 10.96.1.20:80 3
# wrr at 3:1: 30 of 40 new connections to pod-a, unless another scheduling decision or an update of
# the virtual server falls inside the tally and shifts wrr's position in its cycle (seen 2 runs in 40:
# 14/6 of 20, the kernel's own cause not found). An even spread would be 20/20, so pod-a with 27 or
# more (and pod-b with 7 or more) says the weights hold. The kernel's per-real-server counts and the
# connection entries are printed when it fails.
wrr_spread() {
  local tally a b
  tally=$(tally 40 10.96.1.20:80)
  a=$(echo "$tally" | grep -o '"pod-a":[0-9]*' | cut -d: -f2)
  b=$(echo "$tally" | grep -o '"pod-b":[0-9]*' | cut -d: -f2)
  [ "${a:-0}" -ge 27 ] && [ "${b:-0}" -ge 7 ] && [ $((${a:-0} + ${b:-0})) -eq 40 ] || {
    sleep 3
    echo "expected about 30/10 of 40: $tally"
    ipvsadm -Ln --stats -t 10.96.1.20:80
    ipvsadm -Lnc | grep 10.96.1.20 | sort -k4
    return 1
  }
}
check "gate: IPVS keeps forwarding at 3:1" wrr_spread
check "gate: the refusal is counted once" \
  sh -c "wget -qO- http://$METRICS/metrics | grep -q '^switchyard_agent_backend_switches_refused_total 1\$'"
weighted_services even | write_plan w3 nftables
check "gate: without the weights the switch happens" eventually 120 applied w3
why w3
check "gate: nftables is in use" in_use nftables
check "gate: the refusal clears" not in_status BackendSwitchRefused
check "gate: no IPVS virtual server left behind" eventually 120 not our_vs
check "gate: nftables spreads evenly" contains "$(tally 20 10.96.1.20:80)" '"timed_out":0,"errors":0'

kill $SWITCH_AGENT
wait $SWITCH_AGENT 2>/dev/null
agent cleanup >/dev/null 2>&1
check "switch cleanup: no nftables table, no virtual server of ours" sh -c "! /usr/sbin/nft list table ip switchyard >/dev/null 2>&1 && ! ipvsadm -Ln | grep -Eq '10\.96\.1\.|192\.168\.100\.1:'"
