#!/bin/sh
# The clean-up DaemonSet's init container (gpushare chart, pre-delete hook): runs on every
# agent node once the agent pods are gone. Thaws whatever the agent's guardian list still
# names (an agent killed without its guardian), removes the agent's leftover device-plugin
# sockets and its host directory (HOST_DIR, mounted through its parent at HOST_PARENT).
set -u
host_dir=${HOST_DIR:?}
parent=${HOST_PARENT:?}
dp=${DEVICE_PLUGIN_DIR:-}
mine=$parent/$(basename "$host_dir")
if [ -f "$mine/guardian.list" ]; then
    gpushare guardian --now --list "$mine/guardian.list" || true
fi
if [ -n "$dp" ] && [ -d "$dp" ]; then
    for s in "$dp"/gpushare-*.sock; do
        [ -e "$s" ] || continue
        rm -f "$s" && echo "gpushare cleanup: removed $s" >&2
    done
fi
if [ -e "$mine" ]; then
    rm -rf "$mine" && echo "gpushare cleanup: removed $host_dir" >&2
fi
[ ! -e "$mine" ]
