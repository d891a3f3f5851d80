# Scenario file for `run.sh --scenarios e2e/ipvs-vm/capture.sh`: the bytes ipvsadm sends and the kernel's
# dump replies, traced with strace, for the golden tests of the agent's IPVS codec
# (node-agent/src/ipvs/codec/golden.rs holds what one run printed).
modprobe ip_vs; modprobe dummy
ip link add d0 type dummy; ip link set d0 up
# IPVS refuses a real server whose address it cannot classify as unicast: give the range an address.
ip addr add 10.244.0.1/16 dev d0; ip -6 addr add fd00:10:244::1/64 dev d0 nodad
trace() { strace -e trace=sendmsg,recvmsg -xx -s 65535 "$@" 2>&1 | grep -E 'sendmsg|recvmsg' ; }
diag "ADD4 $(trace ipvsadm -A -t 10.96.0.10:80 -s rr)"
diag "DEST4 $(trace ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1)"
diag "ADD6 $(trace ipvsadm -A -u [fd00::1]:53 -s sh -p 600)"
diag "DEST6 $(trace ipvsadm -a -u [fd00::1]:53 -r [fd00:10:244::5]:5353 -m -w 0)"
diag "SCTP $(trace ipvsadm -A --sctp-service 10.96.0.11:3868 -s wrr)"
diag "EDIT $(trace ipvsadm -E -t 10.96.0.10:80 -s wrr -p 10800)"
diag "LIST $(trace ipvsadm -Ln)"
diag "$(ipvsadm -Ln)"
pass capture
