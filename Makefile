# Switchyard — every task CI and developers run. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
CLUSTER ?= examples/cluster.yaml
CONFIG ?= examples/controller-config.yaml
CONTAINER_ENGINE ?= docker
IMAGE_REGISTRY ?= ghcr.io/switchyard
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
IMAGE_REVISION ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

.PHONY: help build install test disk-check unit bench-all lint fmt generate verify-generated demo demo-cluster plan bench fuzz e2e e2e-cluster e2e-kube kube-up image image-docker clean clean-labs clean-caches

help: ## List the targets
	@grep -E '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

build: ## Build the binaries and the lab (debug) into target/debug/: switchyard-controller, switchyard-agent, kubectl-switchyard, switchyard-lab
	$(CARGO) build --workspace --bins

install: ## cargo install switchyard-controller, kubectl-switchyard (the kubectl plugin), switchyard-agent and switchyard-lab (release) into ~/.cargo/bin (INSTALL_ROOT=dir: dir/bin); one shared target dir, so dependencies are built once
	$(CARGO) install --locked --target-dir target/install --path controller $(if $(INSTALL_ROOT),--root $(INSTALL_ROOT))
	$(CARGO) install --locked --target-dir target/install --path node-agent $(if $(INSTALL_ROOT),--root $(INSTALL_ROOT))
	$(CARGO) install --locked --target-dir target/install --path e2e --bin switchyard-lab $(if $(INSTALL_ROOT),--root $(INSTALL_ROOT))

test: disk-check verify-generated lint unit ## Everything CI checks: free disk first, generated files, fmt, clippy, all tests (installs missing apt packages and a Debian kernel for the IPVS VM: README)

disk-check: ## Stop at once, saying what frees space, when the filesystems a run writes to have under 15 GB free (SWITCHYARD_MIN_FREE_GB)
	@./scripts/disk-check.sh "make $(or $(firstword $(MAKECMDGOALS)),test)"

unit: ## All tests (the lab suites need root; with SWITCHYARD_K8S_BIN also the cluster suites, against a bare API server it starts, and the real-cluster suite); leaves no labs or temporary files behind, also on failure or Ctrl-C (scripts/scoped-run.sh)
	@echo "unit: the IPVS suite installs missing apt packages and downloads a Debian kernel into ~/.cache/switchyard (README; SWITCHYARD_SKIP_VM=1 skips it)"
	./scripts/scoped-run.sh ./scripts/with-control-plane.sh $(CARGO) test --workspace --all-targets --locked

lint: ## rustfmt, clippy (warnings are errors) and no module cycles inside any crate (scripts/module-cycles.py)
	$(CARGO) fmt --all --check
	python3 scripts/module-cycles.py --self-test
	python3 scripts/module-cycles.py $(sort $(dir $(wildcard */src/lib.rs */src/main.rs)))
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

fmt: ## Format the code
	$(CARGO) fmt --all

generate: ## Regenerate the CRD YAML from the Rust types (crds/ and config/crd/)
	$(CARGO) run -q -p switchyard-api --example crdgen -- crds config/crd

verify-generated: generate ## Fail when the committed CRD YAML differs from the types
	@git diff --exit-code -- crds config/crd || { echo "generated files are stale: run 'make generate' and commit"; exit 1; }

demo: ## The example cluster in the network-namespace lab: plans, agents, their status in `kubectl get nfp` columns (files; no API server), traffic checks (root; DEMO_FLAGS=--keep leaves it up)
	@./e2e/demo-deps.sh
	@echo "demo: building the three binaries into target/debug/ (a first build takes several minutes; cargo shows its progress)"
	$(CARGO) build --bins
	./target/debug/switchyard-lab demo --cluster $(CLUSTER) --config $(CONFIG) $(DEMO_FLAGS)

demo-cluster: ## The demo through the API server KUBECONFIG names (a cluster without Switchyard, or a bare kube-apiserver): CRDs, controller, agents, `kubectl get nfp`, checks, a change, all removed after (root)
	@test -n "$$KUBECONFIG" || { echo "demo-cluster: set KUBECONFIG to the API server to use"; exit 2; }
	@./e2e/demo-deps.sh
	@echo "demo-cluster: building the three binaries into target/debug/ (a first build takes several minutes; cargo shows its progress)"
	$(CARGO) build --bins
	./target/debug/switchyard-lab demo-cluster --cluster $(CLUSTER) --config $(CONFIG) --kubeconfig "$$KUBECONFIG"

plan: ## Plan the example cluster offline: per node its backend, zone, Services, endpoints, overrides, Local entries and both revisions (docs/reference.md "Plan offline"); reuses make build's binaries
	$(CARGO) build -q --bins
	./target/debug/switchyard-controller plan -f $(CLUSTER) --config $(CONFIG) -o table

bench: disk-check ## All benchmarks (release build) and one summary table against the targets (agent, latency: root; SWITCHYARD_BENCH_SMOKE=1: tiny); run scoped like make unit
	@./scripts/scoped-run.sh $(MAKE) --no-print-directory bench-all

bench-all:
	@summary=$$(mktemp); trap 'rm -f "$$summary"' EXIT; \
	export SWITCHYARD_BENCH_SUMMARY="$$summary"; status=0; \
	bench() { \
	  echo "== $(CARGO) bench -p $$1 --bench $$2"; \
	  $(CARGO) bench -p $$1 --bench $$2 || { \
	    status=1; echo "SUMMARY|$$2 benchmark|exited with an error|-|FAILED" >> "$$summary"; }; \
	}; \
	bench switchyard-controller planner; \
	bench switchyard-controller churn; \
	if [ "$$(id -u)" = 0 ]; then \
	  bench switchyard-agent iptables_sync; \
	  bench switchyard-agent nftables_sync; \
	  bench switchyard-agent conntrack_clear; \
	  bench switchyard-agent traffic_counters; \
	  bench switchyard-e2e latency; \
	  echo "== watch_fanout: against a scratch API server (scripts/with-control-plane.sh; needs SWITCHYARD_K8S_BIN or KUBECONFIG)"; \
	  ./scripts/with-control-plane.sh $(CARGO) bench -p switchyard-e2e --bench watch_fanout || { \
	    status=1; echo "SUMMARY|watch_fanout benchmark|exited with an error|-|FAILED" >> "$$summary"; }; \
	else \
	  echo "bench: skipping iptables_sync, nftables_sync, conntrack_clear, traffic_counters and latency: they need root (network namespaces); run 'sudo make bench'"; \
	  for b in iptables_sync nftables_sync conntrack_clear traffic_counters latency watch_fanout; do \
	    echo "SUMMARY|$$b benchmark|skipped: needs root|-|-" >> "$$summary"; \
	  done; \
	fi; \
	./scripts/bench-summary.sh "$$summary"; \
	exit $$status

fuzz: ## Fuzz the parsers for a bounded time (FUZZ_SECONDS=60 each): plan files, plan cache, IPVS netlink replies, controller config, cluster dumps (fuzz/README.md)
	SWITCHYARD_FUZZ_SECONDS=$(or $(FUZZ_SECONDS),60) $(CARGO) test --locked -p switchyard-agent --test fuzz -- --nocapture --test-threads=1
	SWITCHYARD_FUZZ_SECONDS=$(or $(FUZZ_SECONDS),60) $(CARGO) test --locked -p switchyard-controller --test fuzz -- --nocapture --test-threads=1

e2e: disk-check ## The network-namespace lab suites (root)
	./scripts/scoped-run.sh $(CARGO) test -p switchyard-e2e --tests

e2e-cluster: disk-check ## The cluster suites against the API server KUBECONFIG names, or a bare API server started from SWITCHYARD_K8S_BIN (root)
	@test -n "$$KUBECONFIG$$SWITCHYARD_K8S_BIN" || { echo "e2e-cluster: set KUBECONFIG to a real API server, or SWITCHYARD_K8S_BIN to a folder of Kubernetes binaries (docs/reference.md, \"The Kubernetes binaries\", says which)"; exit 2; }
	./scripts/scoped-run.sh ./scripts/with-control-plane.sh $(CARGO) test -p switchyard-e2e --test cluster_controller --test cluster_agent --test cluster_demo

e2e-kube: disk-check ## The real-cluster suite: images, two kubelet nodes with containerd, install with kubectl apply -k, traffic, life cycle, bad input, back to kube-proxy (root; SWITCHYARD_K8S_BIN; ~15 min)
	@test -n "$$SWITCHYARD_K8S_BIN" || { echo "e2e-kube: set SWITCHYARD_K8S_BIN to a folder of Kubernetes v1.36 binaries (docs/reference.md, \"The Kubernetes binaries\", says which)"; exit 2; }
	./scripts/scoped-run.sh $(CARGO) test -p switchyard-e2e --test kube_cluster -- --nocapture

kube-up: ## A real two-node cluster in the lab, left up (no proxy; the images of `make image IMAGE_COMPONENTS="agent controller pause agnhost"` imported); `switchyard-lab kube down ID` removes it (root; SWITCHYARD_K8S_BIN)
	@test -n "$$SWITCHYARD_K8S_BIN" || { echo "kube-up: set SWITCHYARD_K8S_BIN to a folder of Kubernetes v1.36 binaries (docs/reference.md, \"The Kubernetes binaries\", says which)"; exit 2; }
	$(CARGO) build -q -p switchyard-e2e --bin switchyard-lab
	./target/debug/switchyard-lab kube up --keep

IMAGE_COMPONENTS ?= agent controller

image: ## OCI archives target/images/switchyard-{agent,controller}.tar without a daemon (mmdebstrap + umoci; Debian: apt-get install mmdebstrap umoci); prints digest and size
	./scripts/image/build.sh --tag $(IMAGE_TAG) --registry $(IMAGE_REGISTRY) $(IMAGE_COMPONENTS)

image-docker: ## The same images with Docker/BuildKit or podman (CONTAINER_ENGINE; skipped without a running engine)
	@if ! $(CONTAINER_ENGINE) info >/dev/null 2>&1; then \
	  echo "image: no container engine is running here ($(CONTAINER_ENGINE) info failed); skipping"; \
	  exit 0; \
	fi; \
	set -e; \
	for component in controller agent; do \
	  echo "building $(IMAGE_REGISTRY)/switchyard-$$component:$(IMAGE_TAG)"; \
	  $(CONTAINER_ENGINE) build -f Dockerfile.$$component \
	    --build-arg VERSION=$(IMAGE_TAG) --build-arg REVISION=$(IMAGE_REVISION) \
	    -t $(IMAGE_REGISTRY)/switchyard-$$component:$(IMAGE_TAG) . ; \
	done

clean: ## Remove every build output: target/ (debug, release, the install and image builds, the image archives)
	@before=$$(df -Pk . | awk 'NR==2 {print $$4}'); \
	$(CARGO) clean; \
	after=$$(df -Pk . | awk 'NR==2 {print $$4}'); \
	echo "clean: freed $$(( (after - before) / 1024 )) MiB"

clean-labs: ## Remove what killed runs left: labs and clusters whose run is gone (never one whose processes still run), old logs of failed labs, scratch folders (switchyard-lab gc)
	$(CARGO) build -q --locked -p switchyard-e2e --bin switchyard-lab
	./target/debug/switchyard-lab gc

clean-caches: clean-labs ## clean-labs, then clean, then the caches too: the IPVS VM's kernel and the image bases (~/.cache/switchyard), the unpacked Kubernetes binaries (/var/cache/switchyard-k8s); says how much it freed
	@before=$$(df -Pk . | awk 'NR==2 {print $$4}'); \
	$(CARGO) clean; \
	rm -rf --one-file-system "$${XDG_CACHE_HOME:-$$HOME/.cache}/switchyard" /var/cache/switchyard-k8s; \
	after=$$(df -Pk . | awk 'NR==2 {print $$4}'); \
	echo "clean-caches: freed $$(( (after - before) / 1024 )) MiB (build output, VM kernel, image bases, Kubernetes binaries)"
