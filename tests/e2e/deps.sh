#!/usr/bin/env bash
# Installs what the e2e tests and the demo need from Debian's packages when it is missing:
# runc (containerd's runtime), busybox-static (the local images), jq and curl.
# containerd and crictl are built from the Go module proxy by lib.sh (e2e_build_peers).
set -euo pipefail
need=()
command -v runc >/dev/null || need+=(runc)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v jq >/dev/null || need+=(jq)
command -v curl >/dev/null || need+=(curl)
command -v go >/dev/null || need+=(golang-go)
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
fi
