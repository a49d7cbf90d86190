#!/usr/bin/env bash
# Installs the gpushare node agent on one node, as root.
#   install/bootstrap-node.sh [--preinstalled] [BINARY]
# Default: external NRI plugin run by systemd (survives containerd restarts by reconnecting).
# --preinstalled: copy the binary to /opt/nri/plugins/10-gpushare and the config to
# /etc/nri/conf.d/10-gpushare.conf; containerd launches it (restart containerd afterwards).
# Both install the in-container limiter at /usr/lib/gpushare/libgpushare_limiter.so.
# NRI must be enabled in containerd 1.7 (see install/containerd/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=external
if [[ ${1:-} == --preinstalled ]]; then mode=preinstalled; shift; fi
bin=${1:-$here/../target/release/gpushare}
lib=$(dirname "$bin")/libgpushare_limiter.so
[[ -x $bin ]] || { echo "bootstrap: binary $bin not found (make build)" >&2; exit 1; }
[[ -f $lib ]] || { echo "bootstrap: limiter library $lib not found (make build)" >&2; exit 1; }
((EUID == 0)) || { echo "bootstrap: run as root" >&2; exit 1; }
# The in-container limiter, where [limiter] library points by default.
install -D -m 0644 "$lib" /usr/lib/gpushare/libgpushare_limiter.so

if [[ $mode == preinstalled ]]; then
    install -D -m 0755 "$bin" /opt/nri/plugins/10-gpushare
    [[ -e /etc/nri/conf.d/10-gpushare.conf ]] ||
        install -D -m 0644 "$here/node.toml" /etc/nri/conf.d/10-gpushare.conf
    echo "installed /opt/nri/plugins/10-gpushare; restart containerd to launch it"
else
    install -D -m 0755 "$bin" /usr/local/bin/gpushare
    # The runtime wrapper for runtimes without NRI (install/containerd/wrapper-containerd-1.6.toml).
    if [[ -x ${bin%/*}/gpushare-runtime ]]; then
        install -D -m 0755 "${bin%/*}/gpushare-runtime" /usr/local/bin/gpushare-runtime
    fi
    [[ -e /etc/gpushare/node.toml ]] || install -D -m 0644 "$here/node.toml" /etc/gpushare/node.toml
    install -D -m 0644 "$here/systemd/gpushare-node.service" /etc/systemd/system/gpushare-node.service
    systemctl daemon-reload
    systemctl enable --now gpushare-node.service
    echo "gpushare-node.service running; config /etc/gpushare/node.toml"
fi
