# gpushare — the first two commands on a fresh Linux machine (as root):
#   make demo   the seed walkthrough on a throwaway containerd with simulated GPUs
#   make test   unit, property and integration tests, then the real-containerd e2e suite
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release/gpushare

.PHONY: all build demo test unit e2e lint bench bench-throttle deps

all: build

build:
	$(CARGO) build --release --locked

deps:
	@bash tests/e2e/deps.sh

demo: deps build
	bash tests/e2e/demo.sh

unit:
	$(CARGO) test --locked

# The e2e suite needs root (containerd, runc, mknod). In CI (CI=true) it always runs and
# fails if it cannot; elsewhere a non-root run skips it and says why.
e2e: build
	@if [[ $$EUID -ne 0 && "$${CI:-}" != "true" ]]; then \
		echo "SKIP e2e: needs root (containerd, runc, device nodes); run 'sudo make e2e'"; \
	else \
		bash tests/e2e/deps.sh && bash tests/e2e/run.sh; \
	fi

test: unit e2e

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets --locked -- -D warnings

bench: build
	$(CARGO) bench --bench create_container
	bash bench/crictl_overhead.sh

# Compute-quota accuracy (THROTTLE.md) on the sim backend: needs root, cgroup v1, a quiet
# machine; writes target/bench/throttle.json and target/bench/throttle.png.
bench-throttle:
	$(CARGO) bench --bench throttle
	python3 -m venv target/bench/venv
	target/bench/venv/bin/pip -q install matplotlib
	target/bench/venv/bin/python bench/plot_throttle.py
