#!/usr/bin/env bash
# Installs what the e2e tests and the demo need from Debian's packages when it is missing:
# runc (containerd's runtime), busybox-static (the local images), jq and curl, Debian's own
# containerd 1.6 (no NRI: the runtime wrapper's e2e) and podman 4.3 (the OCI hooks' e2e,
# tests/e2e/hooks.sh), and for CRI-O (tests/e2e/crio.sh) conmon, skopeo and what building
# CRI-O (cgo with libseccomp) and its static pinns needs. containerd 2.x and 1.7, crictl and
# CRI-O are built from the Go module proxy by lib.sh (e2e_build_peers) and crio.sh.
set -euo pipefail
need=()
command -v runc >/dev/null || need+=(runc)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v jq >/dev/null || need+=(jq)
command -v curl >/dev/null || need+=(curl)
[[ -x /usr/bin/containerd && -x /usr/bin/containerd-shim-runc-v2 ]] || need+=(containerd)
command -v podman >/dev/null || need+=(podman)
command -v conmon >/dev/null || need+=(conmon)
command -v skopeo >/dev/null || need+=(skopeo)
dpkg -s libseccomp-dev >/dev/null 2>&1 || need+=(libseccomp-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v gcc >/dev/null || need+=(gcc)
dpkg -s libc6-dev >/dev/null 2>&1 || need+=(libc6-dev)
command -v go >/dev/null || need+=(golang-go)
command -v objdump >/dev/null || need+=(binutils)
command -v pip3 >/dev/null || need+=(python3-pip)
# A font for the labels of the PNG plots (`gpushare simulate`).
[[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]] || need+=(fonts-dejavu-core)
if ((${#need[@]})); then
    if ((EUID != 0)); then
        echo "deps: missing ${need[*]}; run as root or install them" >&2
        exit 1
    fi
    echo "deps: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || true
    apt-get install -y -qq "${need[@]}" >/dev/null
    # The package enables its service where systemd runs; the tests start their own.
    if [[ " ${need[*]} " == *" containerd "* ]] && command -v systemctl >/dev/null &&
        systemctl is-active --quiet containerd 2>/dev/null; then
        systemctl disable --now containerd >/dev/null 2>&1 || true
    fi
fi

# The shipped limiter library is linked against an old glibc (it is loaded into the CUDA
# images people run, e.g. Ubuntu 20.04 with glibc 2.31): zig from PyPI as the linker,
# through cargo-zigbuild from crates.io (`make build`).
if ! python3 -c 'import ziglang' 2>/dev/null; then
    echo "deps: installing zig (PyPI ziglang)" >&2
    pip3 install --quiet --break-system-packages ziglang==0.17.1 ||
        { echo "deps: cannot install ziglang from PyPI" >&2; exit 1; }
fi
if ! command -v cargo-zigbuild >/dev/null; then
    echo "deps: installing cargo-zigbuild" >&2
    cargo install --quiet --locked cargo-zigbuild@0.24.1 ||
        { echo "deps: cannot install cargo-zigbuild" >&2; exit 1; }
fi
