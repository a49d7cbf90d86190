#!/bin/sh
# The agent pod's `nri` init container (gpushare chart): is NRI on in the host's containerd?
#
# Environment: NRI_SOCKET (the socket, a host path mounted at the same path),
# CONTAINERD_CONFIG (containerd's config as mounted in this container), ENABLE_NRI (true:
# containerd 1.7 with NRI off gets it turned on and is restarted), RESTART_COMMAND (run in
# the host's namespaces through HOST_EXEC, default `nsenter -t 1 -m -u -i -n -p --`),
# WAIT_SECONDS (for the socket).
#
# containerd 2.x (config `version = 3`) has NRI on unless disabled: checked only. A config
# of version 2 or older (containerd 1.7; off by default) is changed only when ENABLE_NRI is
# true and NRI is off: `[plugins."io.containerd.nri.v1.nri"] disable = false` and
# `socket_path`, then containerd is restarted, once (never when nothing changed).
set -eu
sock=${NRI_SOCKET:?}
cfg=${CONTAINERD_CONFIG:-}
wait_s=${WAIT_SECONDS:-60}
host_exec=${HOST_EXEC-nsenter -t 1 -m -u -i -n -p --}

log() { echo "gpushare nri: $*" >&2; }

wait_socket() { # SECONDS
    i=0
    while [ ! -S "$sock" ]; do
        [ "$i" -lt "$1" ] || return 1
        i=$((i + 1))
        sleep 1
    done
}

# NRI's state in the config: absent (no section), on, off, default (section, no `disable`).
nri_state() {
    awk '
        /^[[:space:]]*\[/ {
            sec = ($0 ~ /^[[:space:]]*\[plugins\."io\.containerd\.nri\.v1\.nri"\][[:space:]]*(#.*)?$/)
            if (sec) found = 1
            next
        }
        sec && /^[[:space:]]*disable[[:space:]]*=/ {
            v = $0; sub(/^[^=]*=[[:space:]]*/, "", v); sub(/[[:space:]]*(#.*)?$/, "", v); disable = v
        }
        END {
            if (!found) print "absent"
            else if (disable == "false") print "on"
            else if (disable == "") print "default"
            else print "off"
        }' "$1"
}

config_version() {
    sed -n 's/^[[:space:]]*version[[:space:]]*=[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$1" | head -n 1
}

if [ -S "$sock" ]; then
    log "NRI socket $sock is there: NRI is on"
    exit 0
fi
if [ -z "$cfg" ] || [ ! -f "$cfg" ]; then
    log "waiting ${wait_s}s for the NRI socket $sock (no containerd config at '${cfg:-}')"
    wait_socket "$wait_s" && { log "NRI socket $sock is there"; exit 0; }
    log "no NRI socket $sock: is NRI on in containerd, with socket_path $sock? (agent.nriSocket)"
    exit 1
fi
version=$(config_version "$cfg")
state=$(nri_state "$cfg")
log "containerd config $cfg: version ${version:-1}, NRI section: $state"
if [ "${version:-1}" -ge 3 ] || [ "$state" = on ]; then
    # containerd 2.x (on unless disabled), or NRI already enabled: wait for containerd.
    if [ "${version:-1}" -ge 3 ] && [ "$state" = off ]; then
        log "NRI is disabled in $cfg ([plugins.\"io.containerd.nri.v1.nri\"] disable = true);" \
            "containerd 2.x: set disable = false and restart containerd"
        exit 1
    fi
    wait_socket "$wait_s" && { log "NRI socket $sock is there"; exit 0; }
    log "NRI should be on, but $sock did not appear in ${wait_s}s: is containerd's NRI" \
        "socket_path $sock (agent.nriSocket)? is containerd running?"
    exit 1
fi
# containerd 1.7 (config version 2 or older) with NRI off.
if [ "${ENABLE_NRI:-false}" != true ]; then
    log "NRI is off in $cfg (containerd 1.7: off by default). Merge" \
        "[plugins.\"io.containerd.nri.v1.nri\"] disable = false, socket_path = \"$sock\" into it" \
        "and restart containerd, or let the chart do it: --set agent.containerd.enableNri=true"
    exit 1
fi
tmp=$cfg.gpushare-new.$$
awk -v sock="$sock" '
    function emit_keys() { print "  disable = false"; if (!have_sock) print "  socket_path = \"" sock "\"" }
    /^[[:space:]]*\[/ {
        if (sec && !done) { emit_keys(); done = 1 }
        sec = ($0 ~ /^[[:space:]]*\[plugins\."io\.containerd\.nri\.v1\.nri"\][[:space:]]*(#.*)?$/)
        print
        if (sec) found = 1
        next
    }
    sec && /^[[:space:]]*disable[[:space:]]*=/ { next }
    sec && /^[[:space:]]*socket_path[[:space:]]*=/ { have_sock = 1 }
    { print }
    END {
        if (sec && !done) { emit_keys(); done = 1 }
        if (!found) {
            print ""
            print "# added by the gpushare chart (agent.containerd.enableNri)"
            print "[plugins.\"io.containerd.nri.v1.nri\"]"
            emit_keys()
        }
    }' "$cfg" >"$tmp"
# The file keeps its inode (containerd's config may be a bind mount or a link target).
cat "$tmp" >"$cfg"
rm -f "$tmp"
log "NRI turned on in $cfg; restarting containerd: $RESTART_COMMAND"
# shellcheck disable=SC2086 # HOST_EXEC is a command prefix
$host_exec sh -c "$RESTART_COMMAND"
wait_socket "$wait_s" && { log "NRI socket $sock is there"; exit 0; }
log "containerd restarted but $sock did not appear in ${wait_s}s"
exit 1
