# gpushare — the first two commands on a fresh Linux machine (as root):
#   make demo   the seed walkthrough on a throwaway containerd with simulated GPUs
#   make test   unit, property and integration tests, then the real-containerd e2e suite
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release/gpushare
comma := ,

.PHONY: all build demo test unit fuzz e2e e2e-runtime e2e-chaos e2e-hooks e2e-crio e2e-bootstrap e2e-k8s e2e-install conformance lint bench bench-throttle bench-pack bench-extender bench-cluster deps gpu-check dashboard-png

all: build

# The runtime wrapper gpushare-runtime is exec'ed twice per container start (create, start),
# so it is linked statically (static-pie: no loader, no shared-library relocations, ASLR kept):
# ~0.4 ms less per exec than linked dynamically on the 2-vCPU VM (BENCHMARKS.md, "Sixth round").
# The limiter library is built with cargo-zigbuild against glibc $(LIMITER_GLIBC) (it is loaded
# into users' CUDA images, some with old glibc) and checked to need at most GLIBC_2.31; it
# lands beside the binary, where the harnesses and install/bootstrap-node.sh take it.
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
LIMITER_GLIBC := 2.17
build: deps
	$(CARGO) build --release --locked -p gpushare -p gpushare-fake-cuda -p gpushare-fake-nvml -p gpushare-gpu-probe
	$(CARGO) rustc --release --locked -p gpushare --bin gpushare-runtime -- -C target-feature=+crt-static
	@if readelf -d $(TARGET_DIR)/release/gpushare-runtime | grep -q NEEDED; then \
		echo "gpushare-runtime is linked dynamically; expected static-pie" >&2; exit 1; fi
	$(CARGO) zigbuild --release --locked -p gpushare-limiter --target x86_64-unknown-linux-gnu.$(LIMITER_GLIBC)
	install -m 0644 $(TARGET_DIR)/x86_64-unknown-linux-gnu/release/libgpushare_limiter.so $(TARGET_DIR)/release/
	bash tests/glibc_baseline.sh $(TARGET_DIR)/release/libgpushare_limiter.so 2.31

deps:
	@bash tests/e2e/deps.sh

demo: deps build
	bash tests/e2e/demo.sh

# Includes the short fuzz run (tests/fuzz.rs: a few thousand inputs per target) and the replay
# of tests/fuzz-corpus/.
unit:
	$(CARGO) test --workspace --locked

# Fuzzing every parser of outside input (tests/fuzz.rs: the assignment and node annotations, the
# grant and limits, the limits file, the extender's bodies, the NRI frame decoder) with
# FUZZ_CASES generated inputs per target, on a new seed each run (GPUSHARE_FUZZ_SEED=N repeats
# one), inputs up to 3 MiB (past the extender's 2 MiB body limit). Cargo profile `fuzz`:
# optimized like release (the 100 ms-per-input bound is about what ships) with overflow checks
# and debug assertions on; its first build takes a while. One line per target; a failing input
# is kept in tests/fuzz-corpus/<target>/ and replayed by `make unit` from then on.
# Log: $(TARGET_DIR)/fuzz.log.
FUZZ_CASES ?= 1000000
FUZZ_THREADS ?= 2
fuzz:
	@mkdir -p $(TARGET_DIR); set -o pipefail; seed=$${GPUSHARE_FUZZ_SEED:-$$(date +%s)}; \
	echo "fuzz: $(FUZZ_CASES) inputs per target, seed $$seed"; \
	GPUSHARE_FUZZ_CASES=$(FUZZ_CASES) GPUSHARE_FUZZ_SEED=$$seed GPUSHARE_FUZZ_MAX_INPUT=$$((3 << 20)) \
		$(CARGO) test --locked --profile fuzz --test fuzz -- --nocapture --test-threads=$(FUZZ_THREADS) \
		> $(TARGET_DIR)/fuzz.log 2>&1; rc=$$?; \
	grep -o 'target [a-z_]*: [0-9]* inputs.*' $(TARGET_DIR)/fuzz.log; \
	if ((rc != 0)); then tail -40 $(TARGET_DIR)/fuzz.log; fi; exit $$rc

# The e2e suite needs root (containerd, runc, mknod). In CI (CI=true) it always runs and
# fails if it cannot; elsewhere a non-root run skips it and says why.
e2e: build
	@if [[ $$EUID -ne 0 && "$${CI:-}" != "true" ]]; then \
		echo "SKIP e2e: needs root (containerd, runc, device nodes); run 'sudo make e2e'"; \
	else \
		bash tests/e2e/deps.sh && bash tests/e2e/run.sh 2 1.7; \
	fi

# The runtime-level modes, for runtimes without NRI: the same e2e suite on Debian's
# containerd 1.6 through the runtime wrapper gpushare-runtime (tests/e2e/run.sh 1.6, ~3 min).
# Root only, like e2e.
e2e-runtime: build
	@if [[ $$EUID -ne 0 && "$${CI:-}" != "true" ]]; then \
		echo "SKIP e2e-runtime: needs root (containerd, runc, device nodes); run 'sudo make e2e-runtime'"; \
	else \
		bash tests/e2e/deps.sh && bash tests/e2e/run.sh 1.6; \
	fi

# Chaos on containerd 2 (tests/e2e/chaos.sh, ~4 min): the agent SIGKILLed at random points
# among 50 throttled containers, with its guardian, containerd restarted, 200 concurrent GPU
# container creations beyond capacity, frozen containers stopped. Root only, like e2e.
e2e-chaos: build
	@if [[ $$EUID -ne 0 && "$${CI:-}" != "true" ]]; then \
		echo "SKIP e2e-chaos: needs root (containerd, runc, cgroups); run 'sudo make e2e-chaos'"; \
	else \
		bash tests/e2e/deps.sh && bash tests/e2e/chaos.sh; \
	fi

# cri-tools' validation suite, critest 1.37.0 (tests/e2e/conformance.sh, ~3 min), against
# containerd 2 without and then with the agent attached: every test that passes without it
# must pass with it. critest, ginkgo and the image registry are built from Go modules into
# target/peers the first time. Logs: target/e2e-conformance/. Root only, like e2e.
conformance: build
	@if [[ $$EUID -ne 0 && "$${CI:-}" != "true" ]]; then \
		echo "SKIP conformance: needs root (containerd, runc, CNI); run 'sudo make conformance'"; \
	else \
		bash tests/e2e/deps.sh && bash tests/e2e/conformance.sh; \
	fi

# The runtime-level modes outside containerd (tests/e2e/hooks.sh, ~10 s): podman 4.3 through
# the OCI hooks of install/hooks.d, runc on a bundle through gpushare-runtime. Root only, like e2e.
e2e-hooks: build
	@if [[ $$EUID -ne 0 && "$${CI:-}" != "true" ]]; then \
		echo "SKIP e2e-hooks: needs root (podman, runc, device nodes); run 'sudo make e2e-hooks'"; \
	else \
		bash tests/e2e/deps.sh && bash tests/e2e/hooks.sh; \
	fi

# CRI-O 1.34.0 (tests/e2e/crio.sh, ~10 s; its first build from the Go module ~3 min), over NRI
# and through the runtime wrapper as its runc handler's runtime_path; CRI-O refuses the
# precreate hook of install/hooks.d. Root only, like e2e.
e2e-crio: build
	@if [[ $$EUID -ne 0 && "$${CI:-}" != "true" ]]; then \
		echo "SKIP e2e-crio: needs root (CRI-O, runc, device nodes); run 'sudo make e2e-crio'"; \
	else \
		bash tests/e2e/deps.sh && bash tests/e2e/crio.sh; \
	fi

# install/bootstrap-node.sh on real containerd 1.7.35 and 2.4.2 (tests/e2e/bootstrap.sh, ~1 min):
# --preinstalled install, a second run that changes nothing, --uninstall restoring containerd's
# config byte for byte and removing every file it added; bad input and a failing run change
# nothing. Root only, like e2e.
e2e-bootstrap: build
	@if [[ $$EUID -ne 0 && "$${CI:-}" != "true" ]]; then \
		echo "SKIP e2e-bootstrap: needs root (containerd, runc, device nodes); run 'sudo make e2e-bootstrap'"; \
	else \
		bash tests/e2e/deps.sh && bash tests/e2e/bootstrap.sh; \
	fi

# The seed walkthrough on a real one-node Kubernetes 1.36.3 cluster (built from Go modules into
# target/peers; the first build takes ~10 min, later runs reuse it). Root only, like e2e.
e2e-k8s: build
	@if [[ $$EUID -ne 0 && "$${CI:-}" != "true" ]]; then \
		echo "SKIP e2e-k8s: needs root (kubelet, containerd, runc, CNI); run 'sudo make e2e-k8s'"; \
	else \
		bash tests/e2e/deps.sh && bash tests/e2e-k8s/run.sh && bash tests/e2e-k8s/admission_check.sh; \
	fi

# The Helm chart (install/helm/gpushare) on the same one-node cluster (tests/e2e-k8s/install.sh):
# the gpushare image built without an engine (install/image/build.sh), helm 3.22.0 built into
# target/peers the first time; install, the seed's Job through the chart's kube-scheduler and
# extender, upgrade, uninstall leaving nothing behind (~3 min). Root only, like e2e.
e2e-install: build
	@if [[ $$EUID -ne 0 && "$${CI:-}" != "true" ]]; then \
		echo "SKIP e2e-install: needs root (kubelet, containerd, runc, CNI); run 'sudo make e2e-install'"; \
	else \
		bash tests/e2e/deps.sh && bash tests/e2e-k8s/install.sh; \
	fi

test: unit e2e e2e-runtime e2e-hooks e2e-crio e2e-bootstrap e2e-chaos e2e-k8s e2e-install conformance

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

bench: build
	$(CARGO) bench --bench create_container
	bash bench/crictl_overhead.sh

# Compute-quota accuracy (THROTTLE.md) on the sim backend: needs root, cgroup v1, a quiet
# machine; writes target/bench/throttle.json and target/bench/throttle.png.
# Scheduler extender on a synthetic 5,000-node × 8-GPU cache: filter+prioritize latency over
# HTTP and binds per second; writes target/bench/extender.json.
bench-extender:
	$(CARGO) bench --bench extender

bench-throttle:
	$(CARGO) bench --bench throttle
	python3 -m venv target/bench/venv
	target/bench/venv/bin/pip -q install matplotlib
	target/bench/venv/bin/python bench/plot_throttle.py

# Packing quality (PACKING.md): every policy over the openb traces, 10 seeds; prints the tables,
# writes target/bench/pack/<trace>.json and target/bench/pack/pack.png. Then gpushare and fgd
# over every trace's stress variants (`simulate --variant`), seeds 42–46 and 100–104, into
# target/bench/pack-variants{,-100}/; then the same over 20 seeds (42–61) compared seed by seed
# (bench/pack_paired.py: mean paired difference and its 95 % interval per cell) into
# target/bench/pack-variants-20/ and target/bench/pack-paired.json.
OPENB ?= $(firstword $(wildcard ../shared/traces/openb /work/shared/traces/openb))
PACK_TRACES := default gpushare40 gpushare60 gpushare80 gpushare100
PACK_VARIANT_TRACES := default gpushare20 gpushare40 gpushare60 gpushare80 gpushare100
PACK_VARIANTS := none model:0.3 multigpu:0.3 cpuheavy:0.3 model:0.3,multigpu:0.3,cpuheavy:0.3
bench-pack: build
	@test -n "$(OPENB)" || { echo "bench-pack: openb trace not found; make bench-pack OPENB=DIR"; exit 1; }
	$(BIN) simulate --nodes $(OPENB)/openb_node_list_gpu_node.csv \
		--pods $(subst $(eval) ,$(comma),$(foreach t,$(PACK_TRACES),$(OPENB)/openb_pod_list_$(t).csv)) \
		--policy gpushare,fgd,bestfit,binpack,spread --seeds 10 --out target/bench/pack
	for base in 42 100; do \
		$(BIN) simulate --nodes $(OPENB)/openb_node_list_gpu_node.csv \
			--pods $(subst $(eval) ,$(comma),$(foreach t,$(PACK_VARIANT_TRACES),$(OPENB)/openb_pod_list_$(t).csv)) \
			$(foreach v,$(PACK_VARIANTS),--variant $(v)) \
			--policy gpushare,fgd --seeds 5 --seed-base $$base \
			--out target/bench/pack-variants$$( [ $$base = 42 ] || echo -$$base ) || exit 1; \
	done
	$(BIN) simulate --nodes $(OPENB)/openb_node_list_gpu_node.csv \
		--pods $(subst $(eval) ,$(comma),$(foreach t,$(PACK_VARIANT_TRACES),$(OPENB)/openb_pod_list_$(t).csv)) \
		$(foreach v,$(PACK_VARIANTS),--variant $(v)) \
		--policy gpushare,fgd --seeds 20 --seed-base 42 --out target/bench/pack-variants-20
	python3 bench/pack_paired.py --json target/bench/pack-paired.json target/bench/pack-variants-20

# The extender end to end at cluster scale (bench/cluster.sh): etcd, kube-apiserver and
# kube-scheduler with `gpushare scheduler` as its extender, the openb cluster's 1,213 GPU nodes
# as KWOK fake nodes (peers built into target/peers from the Go module proxy). (a) pods bound
# per second with the extender vs kube-scheduler alone and over-committed GPUs; (b) an openb
# trace replayed in one simulate seed's order vs `gpushare simulate`. Needs root, go, python3,
# jq; writes target/bench/cluster/. Never part of make test.
bench-cluster: build
	@test -n "$(OPENB)" || { echo "bench-cluster: openb trace not found; make bench-cluster OPENB=DIR"; exit 1; }
	BENCH_TRACE_DIR=$(OPENB) GPUSHARE_BIN=$(TARGET_DIR)/release/gpushare bash bench/cluster.sh

# The device check (issue 10): on a machine with an NVIDIA GPU, its driver and PyTorch, with
# binaries built beforehand (make build); writes target/gpu-check/gpu-check.{json,log}. Never
# part of make test.
gpu-check:
	bash bench/gpu_check.sh

# The Grafana dashboard as a picture (target/bench/dashboard.png) from the scrapes the last
# make e2e-k8s saved (target/e2e-k8s/scrapes), through a real Prometheus (Debian's; apt-get
# installs it when missing). Not part of make test.
dashboard-png:
	bash bench/dashboard_png.sh
