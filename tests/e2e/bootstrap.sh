#!/usr/bin/env bash
# End-to-end test of install/bootstrap-node.sh on real containerd (1.7.35, where NRI is off by
# default, and 2.4.2), crictl and runc, with simulated GPUs. Needs root. `make e2e-bootstrap`.
# Usage: tests/e2e/bootstrap.sh [VERSION...] (default: 1.7 2)
#
# Each containerd runs from a config the test owns (the harness's, with the NRI table's
# `disable` line taken out: off in 1.7, on in 2.x) in a throwaway root. bootstrap runs in
# --preinstalled mode with every path under a throwaway --root, containerd's config and socket
# given, and --restart-cmd the harness's restart (counted). Checked: bad input and refusals
# change nothing; a run whose agent cannot start is undone (config bytes, files, restart);
# the install enables NRI with a one-line edit (1.7) or leaves the config alone (2.x),
# restarts containerd once, and the plugin registers (/healthz) and gives a GPU container its
# device, environment and limiter; a second run changes nothing and restarts nothing;
# --uninstall puts the config back byte for byte (sha256), removes every file and directory it
# added, restarts containerd, leaves no gpushare process; a second --uninstall is a no-op.
#
# Not tested for real: the --systemd mode needs systemd as PID 1, which the test machines do
# not have; only its refusal without systemd is checked (and skipped where systemd runs).
# Ends with "N passed, M failed"; exits non-zero on any failure.
set -euo pipefail

# shellcheck source=tests/e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BS=$E2E_REPO/install/bootstrap-node.sh
BIN=$E2E_BIN
REL=$(dirname "$BIN")
[[ -x $BIN ]] || { echo "e2e: $BIN not built (make build)" >&2; exit 1; }
VERSIONS=("$@")
((${#VERSIONS[@]})) || VERSIONS=(1.7 2)
PORT=${GPUSHARE_E2E_PORT:-19432}
T=$(mktemp -d /tmp/gpushare-bs.XXXXXX)
DRIVER_DIR=$(e2e_gpu_fakes "$REL")
HOST='' V=''
T0=$SECONDS

# The harness's restart as a command for --restart-cmd: containerd is started again from the
# same config and root (by this child shell; the main shell picks up the new pid after), and
# each restart is counted in $T/restarts.
cat >"$T/restart.sh" <<EOF
#!/usr/bin/env bash
set -euo pipefail
source "$E2E_LIB_DIR/lib.sh"
E2E_CONTAINERD_PID=
echo restart >>"$T/restarts"
e2e_restart_containerd
EOF

refresh_pid() {
    if [[ -n ${E2E_ROOT:-} && -r $E2E_ROOT/containerd.pid ]]; then
        E2E_CONTAINERD_PID=$(<"$E2E_ROOT/containerd.pid")
    fi
}

# gpushare processes of this test: started from a file under $T or the plugin directory
# (their exe reads "… (deleted)" once the file is gone).
our_agents() {
    local p exe
    for p in /proc/[0-9]*; do
        exe=$(readlink "$p/exe" 2>/dev/null) || continue
        case $exe in
        "$T"/* | "${E2E_NRI_PLUGIN_DIR:-/nonexistent}"/*) echo "${p#/proc/} $exe" ;;
        esac
    done
}

cleanup() {
    set +e
    refresh_pid
    if [[ -n $HOST && -f $HOST/var/lib/gpushare/bootstrap/manifest ]]; then
        bs --uninstall --force >/dev/null 2>&1
        refresh_pid
    fi
    local pid _
    while read -r pid _; do [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null; done < <(our_agents)
    e2e_stop_containerd
    rm -rf "$T" "$DRIVER_DIR"
}
trap cleanup EXIT

# bootstrap against this instance: every path under $HOST, containerd's config, binary and
# socket, the counted restart.
bs() {
    bash "$BS" --bin "$BIN" --root "$HOST" --containerd-bin "$E2E_CONTAINERD_DIR/containerd" \
        --containerd-config "$E2E_ROOT/config.toml" --containerd-socket "$E2E_CONTAINERD_SOCK" \
        --restart-cmd "bash $T/restart.sh" --timeout 30 "$@"
}

# bs ARGS… with its output in $T/out (printed), its exit status in BS_RC; the main shell
# follows containerd's new pid.
run_bs() {
    BS_RC=0
    bs "$@" >"$T/out" 2>&1 || BS_RC=$?
    refresh_pid
    sed 's/^/    > /' "$T/out"
}

restarts() { if [[ -f $T/restarts ]]; then wc -l <"$T/restarts"; else echo 0; fi; }

# What bootstrap may touch, listed: the --root tree, the NRI directories (not the socket:
# containerd's), files beside containerd's config named by bootstrap.
listing() {
    {
        find "$HOST" "$E2E_ROOT/nri" ! -type s -printf '%p %y %m %s\n'
        find "$E2E_ROOT" -maxdepth 1 -name '*gpushare*' -printf '%p %y\n'
    } | sort
}

# --- check helpers ---
bs_ok() { # PATTERN ARGS…: bootstrap succeeds and says PATTERN
    local pat=$1
    shift
    run_bs "$@"
    ((BS_RC == 0)) && grep -qF -- "$pat" "$T/out"
}
bs_fails() { # PATTERN ARGS…: bootstrap fails and says PATTERN
    local pat=$1
    shift
    run_bs "$@"
    ((BS_RC != 0)) && grep -qF -- "$pat" "$T/out"
}
same_as_before() { # nothing changed since the snapshot
    local now
    now=$(sha256sum <"$E2E_ROOT/config.toml" | cut -d' ' -f1)
    echo "config sha256 $now (before: $SHA0); restarts $(restarts) (before: $RESTARTS0)"
    diff <(echo "$LISTING0") <(listing) && [[ $now == "$SHA0" && $(restarts) == "$RESTARTS0" ]]
}
restarted_once_more() { # N_BEFORE PID_BEFORE
    echo "restarts $(restarts) (before $1), containerd pid $E2E_CONTAINERD_PID (before $2)"
    [[ $(restarts) == $(($1 + 1)) && $E2E_CONTAINERD_PID != "$2" ]] && _e2e_alive "$E2E_CONTAINERD_PID"
}
no_agent_left() {
    local i left
    for ((i = 0; i < 50; i++)); do
        left=$(our_agents)
        [[ -z $left ]] && return 0
        sleep 0.2
    done
    echo "still running: $left"
    return 1
}
nri_state() { # on | off: NRI in the running containerd, from its log since its last start
    # (a disabled NRI plugin still loads, `ctr plugins ls` says ok) and its socket
    local since got=on
    since=$(awk '/^===== e2e: starting/ { s = "" } { s = s $0 "\n" } END { printf "%s", s }' "$E2E_CONTAINERD_LOG")
    if grep -q "NRI interface is disabled by configuration" <<<"$since"; then got=off; fi
    if [[ $got == on && ! -S $E2E_NRI_SOCK ]]; then got="on in the log, but no $E2E_NRI_SOCK"; fi
    echo "NRI: $got, want $1"
    [[ $got == "$1" ]]
}
only_nri_enabled() { # the config differs from the original by the one line `disable = false`
    local d
    d=$(diff "$T/orig.toml" "$E2E_ROOT/config.toml" || true)
    echo "$d"
    [[ $(grep -c '^[<>]' <<<"$d") == 1 ]] && grep -qxF '>   disable = false' <<<"$d" &&
        awk '/^\[plugins\."io\.containerd\.nri\.v1\.nri"\]/ { t = 1; next } /^\[/ { t = 0 }
             t && /^  disable = false$/ { f = 1 } END { exit !f }' "$E2E_ROOT/config.toml"
}
listing_is() { diff <(echo "$1") <(listing); }
# Without --restart-cmd (systemctl by default) and no systemd: refused before any change.
no_restart_cmd_refused() {
    local out rc=0
    out=$(bash "$BS" --preinstalled --bin "$BIN" --root "$HOST" --containerd-bin "$E2E_CONTAINERD_DIR/containerd" \
        --containerd-config "$E2E_ROOT/config.toml" --config "$CONF" "${PORT_ARGS[@]}" 2>&1) || rc=$?
    echo "$out"
    ((rc != 0)) && grep -qF "but systemd is not running (PID 1 is" <<<"$out" &&
        grep -qF "pass --restart-cmd CMD; nothing was changed" <<<"$out"
}
launched_by_containerd() { # a process of the plugin's file is containerd's child (the other
    # one is its guardian, the agent's child)
    local pid exe ppid found=0
    while read -r pid exe; do
        [[ $exe == "$E2E_NRI_PLUGIN_DIR/10-gpushare" ]] || continue
        ppid=$(awk '{ print $4 }' "/proc/$pid/stat")
        echo "plugin process $pid, parent $ppid (containerd: $E2E_CONTAINERD_PID)"
        [[ $ppid == "$E2E_CONTAINERD_PID" ]] && found=1
    done < <(our_agents)
    ((found))
}
healthz_ok() { [[ $(e2e_agent_status "$PORT" healthz) == ok ]]; }

# The GPU container checks of tests/e2e/run.sh (check_gpu_pod), for one pod.
in_ctr() { e2e_crictl exec "$1" "${@:2}"; }
only_gpu_node() { # CID WANT
    local got
    got=$(in_ctr "$1" ls /dev | grep -E '^nvidia[0-9]+$' | tr '\n' ' ' | sed 's/ $//' || true)
    echo "devices: '$got' want: '$2'"
    [[ $got == "$2" ]]
}
says() { # CID EXPECTED ARGS…
    local out
    out=$(in_ctr "$1" "${@:3}" 2>&1)
    echo "$out"
    grep -qxF -- "$2" <<<"$out"
}
gpu_checks() {
    local cid uuid pods=()
    e2e_write_pod gpu1 "$(e2e_assignment 1 2048 30)" 2 30
    if cid=$(e2e_run_pod_with_container "$E2E_ROOT/gpu1.pod.json" "$E2E_ROOT/gpu1.ctr.json"); then
        pods+=("$(e2e_last_pod_id)")
        uuid=$(e2e_agent_status "$PORT" inventory | jq -r '.inventory.gpus[] | select(.index == 1) | .uuid')
        e2e_check "$V: GPU pod sees /dev/nvidia1 and no other GPU" only_gpu_node "$cid" nvidia1
        e2e_check "$V: GPU pod NVIDIA_VISIBLE_DEVICES is GPU 1's UUID" e2e_env_is "$cid" NVIDIA_VISIBLE_DEVICES "$uuid"
        e2e_check "$V: GPU pod GPUSHARE_GPU_MEMORY_MIB=2048" e2e_env_is "$cid" GPUSHARE_GPU_MEMORY_MIB 2048
        e2e_check "$V: GPU pod GPUSHARE_GPU_CORE_PERCENT=30" e2e_env_is "$cid" GPUSHARE_GPU_CORE_PERCENT 30
        e2e_check "$V: GPU pod gets the installed limiter (/etc/ld.so.preload)" says "$cid" \
            /usr/lib/gpushare/libgpushare_limiter.so cat /etc/ld.so.preload
    else
        e2e_check "$V: GPU pod created" false
    fi
    e2e_write_pod plain "" "" "" "" '{"envs":[{"key":"NVIDIA_VISIBLE_DEVICES","value":"all"}]}'
    if cid=$(e2e_run_pod_with_container "$E2E_ROOT/plain.pod.json" "$E2E_ROOT/plain.ctr.json"); then
        pods+=("$(e2e_last_pod_id)")
        e2e_check "$V: pod without a GPU gets NVIDIA_VISIBLE_DEVICES=void" e2e_env_is "$cid" NVIDIA_VISIBLE_DEVICES void
    else
        e2e_check "$V: pod without a GPU created" false
    fi
    e2e_write_pod bad "$(e2e_assignment 1 2048 33)" 2 33
    local pod
    pod=$(e2e_crictl runp "$E2E_ROOT/bad.pod.json")
    pods+=("$pod")
    e2e_check "$V: core 33 refused by the installed plugin" create_refused "$pod" bad "33 is not a multiple of 5"
    for pod in "${pods[@]}"; do e2e_crictl rmp -f "$pod" >/dev/null 2>&1 || true; done
}
create_refused() { # POD NAME PATTERN
    local out
    if out=$(e2e_crictl create "$1" "$E2E_ROOT/$2.ctr.json" "$E2E_ROOT/$2.pod.json" 2>&1); then
        echo "created: $out"
        return 1
    fi
    echo "$out"
    grep -qF -- "$3" <<<"$out"
}

# The agent's config: sim GPUs, everything under the instance's root, the limiter where
# bootstrap installs it.
write_node_config() { # FILE LIBRARY [STATUS_LISTEN]
    {
        echo 'gpu_backend = "sim"'
        echo 'node_name = "e2e-node"'
        echo "dev_root = \"$E2E_ROOT/simdev\""
        echo "status_socket = \"$E2E_ROOT/status.sock\""
        [[ -z ${3:-} ]] || echo "status_listen = \"$3\""
        cat <<EOF
[log]
file = "$E2E_ROOT/agent.log"
[limiter]
library = "$2"
driver_dir = "$DRIVER_DIR"
[throttle]
state_dir = "$E2E_ROOT/state"
EOF
    } >"$1"
}

for V in "${VERSIONS[@]}"; do
    echo "=== containerd $V ==="
    rm -f "$T/restarts"
    root=$T/c${V%%.*}
    HOST=$T/host
    e2e_require "$V: containerd starts" e2e_start_containerd "$V" "$root"
    # The test's own config: the harness's without the NRI table's disable line (and a comment
    # and no final newline, bytes a careless edit would lose); NRI is then off in 1.7 and on
    # in 2.x, as by default.
    sed -i '/^\[plugins\."io\.containerd\.nri\.v1\.nri"\]/,/^\[/{/^  disable = false$/d}' "$E2E_ROOT/config.toml"
    printf '# the end: no newline after this line' >>"$E2E_ROOT/config.toml"
    rm -f "$E2E_NRI_SOCK"
    e2e_require "$V: containerd restarted on the test's config" e2e_restart_containerd
    mkdir -p "$HOST"
    cp -p "$E2E_ROOT/config.toml" "$T/orig.toml"
    SHA0=$(sha256sum <"$E2E_ROOT/config.toml" | cut -d' ' -f1)
    LISTING0=$(listing)
    RESTARTS0=$(restarts)
    echo "config sha256 before bootstrap: $SHA0"
    if [[ $V == 1.7* ]]; then
        e2e_check "$V: NRI is off before bootstrap" nri_state off
    else
        e2e_check "$V: NRI is on before bootstrap (2.x default)" nri_state on
    fi

    LIB=$HOST/usr/lib/gpushare/libgpushare_limiter.so
    CONF=$T/node.toml
    if [[ $V == 1.7* ]]; then
        write_node_config "$CONF" "$LIB" "127.0.0.1:$PORT"
        PORT_ARGS=()
    else
        # No status_listen: bootstrap adds it to the installed copy, on --status-port.
        write_node_config "$CONF" "$LIB"
        PORT_ARGS=(--status-port "$PORT")
    fi

    # Bad input and refusals: a clear message, nothing changed.
    e2e_check "$V: --status-port 0 refused by name" bs_fails "--status-port '0': not a port number" --preinstalled --config "$CONF" --status-port 0
    e2e_check "$V: a relative --containerd-config refused" bs_fails "--containerd-config 'etc/config.toml': must be an absolute path" --preinstalled --config "$CONF" --containerd-config etc/config.toml
    e2e_check "$V: a missing --bin refused" bs_fails "--bin '$T/none': not an executable file" --preinstalled --config "$CONF" --bin "$T/none"
    e2e_check "$V: a missing --config refused" bs_fails "--config '$T/none.toml': not a readable file" --preinstalled --config "$T/none.toml"
    e2e_check "$V: containerd 1.6 refused (no NRI)" bs_fails "containerd 1.6.20 (--containerd-version) has no NRI" --preinstalled --config "$CONF" --containerd-version 1.6.20
    if [[ $V == 1.7* ]]; then
        e2e_check "$V: --status-port disagreeing with status_listen refused" bs_fails "--status-port '$((PORT + 1))': $CONF says status_listen = \"127.0.0.1:$PORT\"" \
            --preinstalled --config "$CONF" --status-port $((PORT + 1))
    fi
    if [[ -d /run/systemd/system ]]; then
        echo "SKIP $V: systemd runs here (PID 1 $(cat /proc/1/comm)): its refusal path is not reached"
    else
        e2e_check "$V: default (systemd) mode refused without systemd, naming --preinstalled" \
            bs_fails "systemd is not running here (PID 1 is $(cat /proc/1/comm)), so the default --systemd mode cannot run the agent: use --preinstalled" --config "$CONF"
        e2e_check "$V: --systemd refused without systemd" bs_fails "--systemd: systemd is not running here" --systemd --config "$CONF"
        e2e_check "$V: a needed restart without --restart-cmd refused before any change" no_restart_cmd_refused
    fi
    e2e_check "$V: --dry-run changes nothing" bs_ok "dry run: nothing changed" --preinstalled --dry-run --config "$CONF" "${PORT_ARGS[@]}"
    e2e_check "$V: … after the refusals, nothing changed" same_as_before

    # A run whose agent cannot start (its limiter library is missing) is undone.
    write_node_config "$T/bad.toml" "$T/no-such-limiter.so" "127.0.0.1:$PORT"
    n=$(restarts)
    e2e_check "$V: an agent that does not register fails the run, naming its log" bs_fails \
        "the agent did not register within 6 s" --preinstalled --config "$T/bad.toml" --timeout 6
    e2e_check "$V: … the failure names the log" grep -qF "its log: $E2E_ROOT/agent.log" "$T/out"
    e2e_check "$V: … and the run was undone (files)" listing_is "$LISTING0"
    e2e_check "$V: … config sha256 as before" test "$(sha256sum <"$E2E_ROOT/config.toml" | cut -d' ' -f1)" = "$SHA0"
    e2e_check "$V: … containerd restarted twice (install, undo)" test "$(restarts)" = $((n + 2))
    e2e_check "$V: … no gpushare process left" no_agent_left
    RESTARTS0=$(restarts)

    # The install.
    n=$(restarts) pid=$E2E_CONTAINERD_PID
    t=$SECONDS
    e2e_check "$V: bootstrap --preinstalled installs" bs_ok "bootstrap: installed (preinstalled mode)" --preinstalled --config "$CONF" "${PORT_ARGS[@]}"
    echo "    (install took $((SECONDS - t)) s)"
    e2e_check "$V: containerd restarted once (pid changed)" restarted_once_more "$n" "$pid"
    if [[ $V == 1.7* ]]; then
        e2e_check "$V: NRI enabled in the config: one line added, every other byte kept" only_nri_enabled
    else
        e2e_check "$V: the config is unchanged (NRI on by default)" test "$(sha256sum <"$E2E_ROOT/config.toml" | cut -d' ' -f1)" = "$SHA0"
    fi
    e2e_check "$V: NRI is on" nri_state on
    e2e_check "$V: the plugin is in containerd's plugin_path" test -x "$E2E_NRI_PLUGIN_DIR/10-gpushare"
    e2e_check "$V: its config is in plugin_config_path" test -f "$E2E_NRI_CONF_DIR/10-gpushare.conf"
    e2e_check "$V: binary and limiter installed under --root" test -x "$HOST/usr/local/bin/gpushare" -a -f "$LIB"
    if ((${#PORT_ARGS[@]})); then
        e2e_check "$V: status_listen added to the installed config" grep -qx "status_listen = \"127.0.0.1:$PORT\" .*" "$E2E_NRI_CONF_DIR/10-gpushare.conf"
    fi
    e2e_check "$V: the plugin registered (/healthz ok)" healthz_ok
    e2e_check "$V: launched by containerd (its parent)" launched_by_containerd
    gpu_checks
    SHA1=$(sha256sum <"$E2E_ROOT/config.toml" | cut -d' ' -f1)
    LISTING1=$(listing)

    # Twice: nothing changes, no restart.
    n=$(restarts) pid=$E2E_CONTAINERD_PID
    e2e_check "$V: a second run is a no-op" bs_ok "bootstrap: already installed: nothing changed" --preinstalled --config "$CONF" "${PORT_ARGS[@]}"
    e2e_check "$V: … it says no restart was needed" grep -qF "containerd: no restart needed" "$T/out"
    e2e_check "$V: … containerd not restarted" test "$(restarts):$E2E_CONTAINERD_PID" = "$n:$pid"
    e2e_check "$V: … config unchanged" test "$(sha256sum <"$E2E_ROOT/config.toml" | cut -d' ' -f1)" = "$SHA1"
    e2e_check "$V: … files unchanged" listing_is "$LISTING1"
    e2e_check "$V: … the plugin still registered" healthz_ok

    # Uninstall, twice.
    n=$(restarts) pid=$E2E_CONTAINERD_PID
    e2e_check "$V: --uninstall" bs_ok "bootstrap: uninstalled" --uninstall
    e2e_check "$V: … containerd restarted once" restarted_once_more "$n" "$pid"
    e2e_check "$V: … config sha256 restored exactly" test "$(sha256sum <"$E2E_ROOT/config.toml" | cut -d' ' -f1)" = "$SHA0"
    e2e_check "$V: … config bytes identical to the original" cmp "$T/orig.toml" "$E2E_ROOT/config.toml"
    e2e_check "$V: … every file and directory it added removed, nothing else" listing_is "$LISTING0"
    e2e_check "$V: … no gpushare process left" no_agent_left
    e2e_check_fail "$V: … /healthz no longer answers" healthz_ok
    if [[ $V == 1.7* ]]; then e2e_check "$V: … NRI off again" nri_state off; fi
    e2e_check "$V: a second --uninstall is a no-op" bs_ok "bootstrap: nothing to uninstall" --uninstall
    e2e_check "$V: … containerd not restarted" test "$(restarts)" = $((n + 1))

    e2e_stop_containerd
    rm -rf "$HOST" "$T/orig.toml" "$T/out"
    HOST=''
done
echo "bootstrap e2e: $((SECONDS - T0)) s"
e2e_summary
