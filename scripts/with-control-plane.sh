#!/usr/bin/env bash
# Runs COMMAND... with KUBECONFIG naming a real API server, for the cluster suites.
#
#   scripts/with-control-plane.sh COMMAND...
#
# KUBECONFIG set: that API server, as it is. Otherwise, with SWITCHYARD_K8S_BIN (a folder of Kubernetes
# binaries: docs/reference.md, "The Kubernetes binaries") and root: a bare API server (etcd and kube-apiserver with
# RBAC, as `switchyard-lab kube up --nodes 0` makes it; no controller rewrites what the suites write) in
# its own network namespaces, reached through a relay on 127.0.0.1, removed when COMMAND ends (also
# when it fails). Neither: COMMAND runs as it is, and the
# cluster suites say they are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n ${KUBECONFIG:-} ]]; then
  echo "with-control-plane: KUBECONFIG=$KUBECONFIG: the cluster suites run against that API server"
  exec "$@"
fi
if [[ -z ${SWITCHYARD_K8S_BIN:-} ]]; then
  echo "with-control-plane: neither KUBECONFIG nor SWITCHYARD_K8S_BIN is set: the cluster suites" \
    "(cluster_controller, cluster_agent, cluster_demo's real-server test, kube_cluster) are SKIPPED" \
    "(docs/reference.md, \"The Kubernetes binaries\", says what SWITCHYARD_K8S_BIN holds)"
  exec "$@"
fi
if [[ $(id -u) != 0 ]]; then
  echo "with-control-plane: a bare API server needs root (network namespaces); the cluster suites are SKIPPED"
  exec "$@"
fi

${CARGO:-cargo} build -q --locked -p switchyard-e2e --bin switchyard-lab
lab=${CARGO_TARGET_DIR:-target}/debug/switchyard-lab
# Bound to this script: should it be killed before its trap runs, the next `switchyard-lab gc` (every
# lab start runs one) removes the control plane.
up=$("$lab" kube up --nodes 0 --keep --bound-to $$)
id=$(sed -n 's/^kept cluster \([^;]*\);.*/\1/p' <<<"$up")
# Removed however this script ends, as soon as its id is known.
[[ -n $id ]] && trap '"$lab" kube down "$id" >/dev/null || echo "with-control-plane: removing $id failed; switchyard-lab gc --all removes it" >&2' EXIT
echo "$up"
kubeconfig=$(sed -n 's/^  export KUBECONFIG=//p' <<<"$up")
if [[ -z $id || -z $kubeconfig ]]; then
  echo "with-control-plane: the control plane did not come up" >&2
  exit 1
fi
echo "with-control-plane: SWITCHYARD_K8S_BIN=$SWITCHYARD_K8S_BIN: the cluster suites run against the bare API server of lab $id"
KUBECONFIG=$kubeconfig "$@"
