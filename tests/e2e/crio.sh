#!/usr/bin/env bash
# End-to-end test of `gpushare node` on CRI-O (1.34.0, built from its Go module into
# target/peers/crio-1.34.0 the first time, ~3 min), with crictl, runc and Debian's conmon, and
# simulated GPUs, in the two modes CRI-O offers gpushare:
#   nri      CRI-O's NRI ([crio.nri]); the agent is an NRI plugin, as on containerd 1.7 / 2.x.
#   wrapper  the runc handler's runtime_path is the runtime wrapper gpushare-runtime; the agent
#            serves it on its local socket (--no-nri), as for containerd 1.6 (run.sh 1.6).
#
# Not the OCI hooks of install/hooks.d, podman's mode (tests/e2e/hooks.sh): CRI-O runs no
# precreate hook, and refuses to start with that file in its hooks_dir (checked below).
# CRI-O 1.34.0 internal/lib/container_server.go, New(): `hooks.New(ctx, config.HooksDir,
# []string{})` asks containers/common's pkg/hooks for no extension stage, so its
# (*Hook).Validate (pkg/hooks/1.0.0/hook.go) fails on "precreate" and crio exits with
# `unknown stage "precreate"`; and server/container_create.go, createSandboxContainer(), only
# calls `s.Hooks.Hooks(specgen.Config, …)`, which puts the OCI stages into the spec for runc —
# CRI-O never calls pkg/hooks/exec.RuntimeConfigFilter, through which podman runs precreate
# hooks. The wrapper needs nothing of CRI-O but the pod's annotations in the container's spec,
# which CRI-O puts there itself (internal/factory/container/container.go, SpecAddAnnotations).
#
# Each mode runs a throwaway CRI-O: its own root, runroot, sockets and state under a mktemp
# dir, storage driver overlay (vfs where overlay does not work), cgroupfs, host-network pods
# (no CNI), the local busybox/pause images copied into its storage with skopeo. Needs root.
# Usage: tests/e2e/crio.sh [MODE...] (default: nri wrapper)
# Ends with "N passed, M failed"; exits non-zero on any failure.
set -euo pipefail

# shellcheck source=tests/e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CRIO_VERSION=1.34.0
CRIO_DIR=$E2E_PEERS_DIR/crio-$CRIO_VERSION
# No gpgme (signature verification in Go), no btrfs/devicemapper headers; seccomp through
# libseccomp (libseccomp-dev), as CRI-O's release builds.
CRIO_TAGS="containers_image_openpgp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper seccomp"

BIN=$E2E_BIN WRAPPER_BIN=$E2E_WRAPPER_BIN
[[ -x $BIN && -x $WRAPPER_BIN ]] || { echo "e2e-crio: $BIN or $WRAPPER_BIN not built (make build)" >&2; exit 1; }
((EUID == 0)) || { echo "e2e-crio: needs root (CRI-O, runc, device nodes)" >&2; exit 1; }
RUNC=$(command -v runc) || { echo "e2e-crio: runc missing (tests/e2e/deps.sh)" >&2; exit 1; }
CONMON=$(command -v conmon) || { echo "e2e-crio: conmon missing (tests/e2e/deps.sh)" >&2; exit 1; }
command -v skopeo >/dev/null || { echo "e2e-crio: skopeo missing (tests/e2e/deps.sh)" >&2; exit 1; }
MODES=("$@")
((${#MODES[@]})) || MODES=(nri wrapper)
PORT=${GPUSHARE_E2E_CRIO_PORT:-19480}
CONFIRM_GRACE_MS=3000
REL=$(dirname "$BIN")
# Every pod's command: sleeps, and exits on SIGTERM (a shell as PID 1 ignores it otherwise,
# and CRI-O waits its stop timeout before it kills).
SLEEP='trap "exit 0" TERM; sleep 3600 & wait'
# kubelet's labels and namespace options on every container (lib.sh, e2e_write_pod).
export E2E_KUBELET_CTR=1

AGENT_PID='' CRIO_PID='' DRIVER_DIR=''
cleanup() {
    stop_crio
    [[ -z $DRIVER_DIR ]] || rm -rf "$DRIVER_DIR"
}
trap cleanup EXIT

# build_crio: crio and pinns into CRIO_DIR when missing. `go install …@v1.34.0` does not work
# here: it reads the module's version list (for deprecations), which the proxy refuses (403);
# the source copy `go mod download` fetches builds with its own go.mod and go.sum (it has no
# replace directive), as lib.sh builds critest. pinns is C, in the same source.
build_crio() {
    local mod t0=$SECONDS
    [[ -x $CRIO_DIR/crio && -x $CRIO_DIR/pinns ]] && return 0
    e2e_log "building CRI-O $CRIO_VERSION into $CRIO_DIR"
    mod=$(cd "$E2E_REPO" && go mod download -json "github.com/cri-o/cri-o@v$CRIO_VERSION" |
        jq -r '.Dir // empty') || mod=
    [[ -d $mod ]] || { e2e_log "cannot download github.com/cri-o/cri-o@v$CRIO_VERSION"; return 1; }
    mkdir -p "$CRIO_DIR"
    if ! (cd "$mod" && CGO_ENABLED=1 GOFLAGS=-mod=readonly go build -trimpath -buildvcs=false \
        -tags "$CRIO_TAGS" -o "$CRIO_DIR/crio.tmp" ./cmd/crio) ||
        ! gcc -std=c99 -Os -Wall -Werror -Wextra -static -o "$CRIO_DIR/pinns.tmp" "$mod"/pinns/src/*.c; then
        rm -f "$CRIO_DIR"/*.tmp
        return 1
    fi
    mv -f "$CRIO_DIR/pinns.tmp" "$CRIO_DIR/pinns"
    mv -f "$CRIO_DIR/crio.tmp" "$CRIO_DIR/crio"
    e2e_log "built CRI-O $CRIO_VERSION in $((SECONDS - t0)) s"
}

status() { e2e_agent_status "$PORT" "$1"; }

# ------------------------------------------------------------- CRI-O ----
# CRIO_ENV: the environment CRI-O and skopeo share (containers/storage's and containers/image's
# config files under ROOT instead of the host's /etc/containers); CRIO_ARGS: CRI-O's options,
# ROOT's config and nothing of /etc/crio. Both set by prepare_crio.
CRIO_ENV=() CRIO_ARGS=()

# write_storage DRIVER: ROOT/storage.conf.
write_storage() {
    printf '[storage]\ndriver = "%s"\ngraphroot = "%s"\nrunroot = "%s"\n' \
        "$1" "$E2E_ROOT/storage" "$E2E_ROOT/run" >"$E2E_ROOT/storage.conf"
    STORAGE_DRIVER=$1
}

# import_images: the pause and busybox images (OCI archives, lib.sh) into CRI-O's storage,
# with overlay, or with vfs when overlay fails here (e.g. /tmp on overlayfs).
import_images() {
    local driver tar name ok
    e2e_build_images || return 1
    for driver in overlay vfs; do
        write_storage "$driver"
        ok=1
        for tar in "$E2E_PAUSE_TAR:$E2E_PAUSE_IMAGE" "$E2E_BUSYBOX_TAR:$E2E_BUSYBOX_IMAGE"; do
            name=${tar#*:} tar=${tar%%:*}
            env "${CRIO_ENV[@]}" skopeo --insecure-policy copy -q "oci-archive:$tar" \
                "containers-storage:[$driver@$E2E_ROOT/storage+$E2E_ROOT/run]$name" || { ok=0; break; }
        done
        ((ok)) && return 0
        e2e_log "storage driver $driver does not work here"
        e2e_unmount_below "$E2E_ROOT/storage"
        rm -rf --one-file-system "$E2E_ROOT/storage" "$E2E_ROOT/run"
    done
    return 1
}

# write_crio_config MODE: ROOT/crio.conf. Every path CRI-O writes is under ROOT.
write_crio_config() {
    local mode=$1 runtime=$RUNC nri=true env=""
    if [[ $mode == wrapper ]]; then
        runtime=$E2E_ROOT/bin/gpushare-runtime nri=false
        # conmon runs the runtime's create with the environment monitor_env gives it; CRI-O
        # runs its start, state, kill and delete itself, with its own.
        env=", \"GPUSHARE_RUNTIME_CONFIG=$E2E_ROOT/runtime.toml\""
    fi
    cat >"$E2E_ROOT/crio.conf" <<EOF
# generated by tests/e2e/crio.sh (CRI-O $CRIO_VERSION, mode $mode)
[crio]
root = "$E2E_ROOT/storage"
runroot = "$E2E_ROOT/run"
storage_driver = "$STORAGE_DRIVER"
log_dir = "$E2E_ROOT/logs"
version_file = "$E2E_ROOT/crio/version"
version_file_persist = "$E2E_ROOT/crio/version-persist"
clean_shutdown_file = "$E2E_ROOT/crio/clean.shutdown"

[crio.api]
listen = "$E2E_CONTAINERD_SOCK"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
log_level = "info"
pinns_path = "$CRIO_DIR/pinns"
namespaces_dir = "$E2E_ROOT/ns"
container_exits_dir = "$E2E_ROOT/exits"
container_attach_socket_dir = "$E2E_ROOT/attach"
hooks_dir = ["$E2E_ROOT/hooks.d"]
irqbalance_config_file = "$E2E_ROOT/irqbalance"
irqbalance_config_restore_file = "$E2E_ROOT/irqbalance-restore"

[crio.runtime.runtimes.runc]
runtime_path = "$runtime"
runtime_type = "oci"
runtime_root = "$E2E_ROOT/runc"
monitor_path = "$CONMON"
monitor_cgroup = "pod"
monitor_env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"$env]

[crio.image]
pause_image = "$E2E_PAUSE_IMAGE"
signature_policy = "$E2E_ROOT/policy.json"

[crio.network]
network_dir = "$E2E_ROOT/cni/net.d"
plugin_dirs = ["$E2E_ROOT/cni/bin"]

[crio.nri]
enable_nri = $nri
nri_listen = "$E2E_ROOT/nri/nri.sock"
nri_plugin_dir = "$E2E_ROOT/nri/plugins"
nri_plugin_config_dir = "$E2E_ROOT/nri/conf.d"
EOF
}

# prepare_crio MODE ROOT: ROOT for a new CRI-O (see the top): its configuration, the images
# in its storage. Sets the E2E_* variables lib.sh's crictl, pod and agent helpers use
# (E2E_CONTAINERD_SOCK is the CRI socket, here CRI-O's); for the wrapper,
# GPUSHARE_RUNTIME_CONFIG, which CRI-O passes on to it.
prepare_crio() {
    local mode=$1
    export E2E_ROOT=$2
    export E2E_CONTAINERD_SOCK=$E2E_ROOT/crio.sock E2E_LOG_DIR=$E2E_ROOT/logs
    export E2E_CGROUP_BASE=/gpushare-e2e/${E2E_ROOT##*/}
    mkdir -p "$E2E_ROOT"/{logs,crio,ns,exits,attach,runc,hooks.d,crio.conf.d,cni/net.d,cni/bin} \
        "$E2E_ROOT"/{nri/plugins,nri/conf.d,bin}
    CRIO_ENV=("CONTAINERS_STORAGE_CONF=$E2E_ROOT/storage.conf"
        "CONTAINERS_REGISTRIES_CONF=$E2E_ROOT/registries.conf" "PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin")
    CRIO_ARGS=(--config "$E2E_ROOT/crio.conf" --config-dir "$E2E_ROOT/crio.conf.d")
    printf 'timeout: 20\n' >"$E2E_ROOT/crictl.yaml"
    echo '{"default": [{"type": "insecureAcceptAnything"}]}' >"$E2E_ROOT/policy.json"
    : >"$E2E_ROOT/registries.conf"
    unset GPUSHARE_RUNTIME_CONFIG E2E_NRI_SOCK
    if [[ $mode == nri ]]; then
        export E2E_NRI_SOCK=$E2E_ROOT/nri/nri.sock
    else
        ln -sf "$WRAPPER_BIN" "$E2E_ROOT/bin/gpushare-runtime"
        printf 'runtime = "%s"\nsocket = "%s"\n' "$RUNC" "$E2E_ROOT/runtime.sock" >"$E2E_ROOT/runtime.toml"
        export GPUSHARE_RUNTIME_CONFIG=$E2E_ROOT/runtime.toml
    fi
    import_images || return 1
    write_crio_config "$mode"
}

# launch_crio: CRI-O on ROOT, up when `crictl info` answers (log ROOT/crio.log).
launch_crio() {
    local i
    # A simple command, so that $! is crio itself (env execs it).
    env "${CRIO_ENV[@]}" "$CRIO_DIR/crio" "${CRIO_ARGS[@]}" </dev/null >>"$E2E_ROOT/crio.log" 2>&1 &
    CRIO_PID=$!
    for ((i = 0; i < 300; i++)); do
        if ! _e2e_alive "$CRIO_PID"; then
            wait "$CRIO_PID" 2>/dev/null || true
            CRIO_PID=
            tail -20 "$E2E_ROOT/crio.log"
            return 1
        fi
        E2E_CRICTL_TIMEOUT=2s e2e_crictl info >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "CRI-O not ready after 30 s"
    tail -20 "$E2E_ROOT/crio.log"
    return 1
}

# stop_crio: pods removed, the agent and CRI-O stopped, leftover conmon and runc containers of
# ROOT killed, everything mounted under ROOT unmounted, the pods' cgroups and ROOT removed.
# Safe to call twice and from the EXIT trap.
stop_crio() {
    local root=${E2E_ROOT:-} p cmd id f
    [[ -n $root && -d $root && $root == /tmp/gpushare-crio.* ]] || return 0
    if [[ -n $CRIO_PID ]] && _e2e_alive "$CRIO_PID"; then
        timeout 60 "$E2E_CRICTL" --runtime-endpoint "unix://$E2E_CONTAINERD_SOCK" --timeout 20s \
            rmp -fa >/dev/null 2>&1 || true
    fi
    kill_agent
    if [[ -n $CRIO_PID ]]; then
        kill -TERM "$CRIO_PID" 2>/dev/null || true
        for ((p = 0; p < 200; p++)); do _e2e_alive "$CRIO_PID" || break; sleep 0.1; done
        kill -KILL "$CRIO_PID" 2>/dev/null || true
        wait "$CRIO_PID" 2>/dev/null || true
        CRIO_PID=
    fi
    # Whatever else of ROOT still runs: a CRI-O that is not our child, conmon.
    for p in /proc/[0-9]*; do
        cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
        if [[ $cmd == *"crio --config $root/crio.conf "* || $cmd == *conmon*" $root/"* ]]; then
            kill -KILL "${p#/proc/}" 2>/dev/null || true
        fi
    done
    for id in $("$RUNC" --root "$root/runc" list -q 2>/dev/null); do
        "$RUNC" --root "$root/runc" delete --force "$id" >/dev/null 2>&1 || true
    done
    e2e_unmount_below "$root"
    # Nothing left frozen (the agent's throttling) before the cgroups go.
    f=/sys/fs/cgroup/freezer${E2E_CGROUP_BASE:-/none}
    if [[ -d $f ]]; then
        find "$f" -name freezer.state -exec sh -c 'echo THAWED >"$1"' _ {} \; 2>/dev/null || true
    fi
    e2e_remove_cgroups "${E2E_CGROUP_BASE:-}"
    rm -rf --one-file-system "$root" 2>/dev/null || e2e_log "warning: could not fully remove $root"
    E2E_ROOT=
}

# hooks_refused: CRI-O (before launch_crio) with install/hooks.d in its hooks_dir (the hooks
# pointed at this build, as hooks.sh installs them for podman) refuses to start: unknown
# stage "precreate".
hooks_refused() {
    local f rc=0
    for f in "$E2E_REPO"/install/hooks.d/*.json; do
        jq --arg bin "$BIN" '.hook.path = $bin' "$f" >"$E2E_ROOT/hooks.d/${f##*/}"
    done
    env "${CRIO_ENV[@]}" timeout 20 "$CRIO_DIR/crio" "${CRIO_ARGS[@]}" \
        >"$E2E_ROOT/crio-hooks.log" 2>&1 </dev/null || rc=$?
    rm -f "$E2E_ROOT"/hooks.d/*.json
    grep -v 'level=info' "$E2E_ROOT/crio-hooks.log" | tail -3
    ((rc != 0 && rc != 124)) && grep -qF 'unknown stage \"precreate\"' "$E2E_ROOT/crio-hooks.log"
}

# -------------------------------------------------------------- agent ----
start_agent() { # MODE
    local link=()
    if [[ $1 == nri ]]; then
        # A short confirmation grace, for unconfirmed_released.
        printf 'nri_confirm_grace_ms = %s\n' "$CONFIRM_GRACE_MS" >"$E2E_ROOT/node.toml"
        link=(--config "$E2E_ROOT/node.toml")
    fi
    if [[ $1 == wrapper ]]; then
        # The wrapper reaches the agent on its local socket; the registry is rebuilt from runc's
        # state at start.
        link=(--no-nri --runtime-socket "$E2E_ROOT/runtime.sock" --runc-root "$E2E_ROOT/runc")
    fi
    e2e_agent_launch "$BIN" "$PORT" "$DRIVER_DIR" "${link[@]}"
    AGENT_PID=$E2E_AGENT_PID
    e2e_agent_wait_healthy "$PORT"
}

kill_agent() {
    [[ -n $AGENT_PID ]] || return 0
    kill -9 "$AGENT_PID" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
    AGENT_PID=
}

# ------------------------------------------------------------- checks ----
in_registry() { # ID STATE
    status registry | jq -e --arg id "$1" --arg st "$2" 'any(.[]; .id == $id and .state == $st)' >/dev/null
}

# The registry's cgroup for the container is the one CRI-O made (its main process is in it, or
# in the child the agent keeps a container with a quota in).
cgroup_is_crios() { # CID
    local path pid
    path=$(status registry | jq -r --arg id "$1" '.[] | select(.id == $id) | .cgroups_path')
    pid=$(e2e_crictl inspect -o go-template --template '{{.info.pid}}' "$1")
    echo "cgroup '$path', pid $pid"
    [[ -n $path ]] || return 1
    [[ ! -d /sys/fs/cgroup/freezer ]] || path=freezer$path
    # The agent keeps the processes of a container with a quota in a child it can freeze.
    cat "/sys/fs/cgroup/$path/cgroup.procs" "/sys/fs/cgroup/$path/gpushare-throttled/cgroup.procs" \
        2>/dev/null | grep -qx "$pid"
}

only_in_registry() { # CID: the registry has this container and nothing else
    status registry | jq -e --arg id "$1" '[.[].id] == [$id]'
}

gone_from_registry() { # CID: within 5 s
    local i
    for ((i = 0; i < 50; i++)); do
        status registry | jq -e --arg id "$1" 'all(.[]; .id != $id)' >/dev/null && return 0
        sleep 0.1
    done
    status registry
    return 1
}

# CRI-O sends no NRI event when the OCI runtime's create fails after NRI admitted the
# container; here its command is not in the image (runc's create looks it up). The agent has
# it on its books right after the failure, and releases it once nri_confirm_grace_ms has
# passed, since it has no cgroup.
unconfirmed_released() {
    local pod err i rc=1
    e2e_write_pod nocmd "$(e2e_assignment 0 2048 30)" 2 30 "" '{"command": ["/no/such/binary"]}'
    pod=$(e2e_crictl runp "$E2E_ROOT/nocmd.pod.json") || return 1
    if err=$(e2e_crictl create "$pod" "$E2E_ROOT/nocmd.ctr.json" "$E2E_ROOT/nocmd.pod.json" 2>&1); then
        echo "create succeeded: $err"
    elif ! status registry | jq -e 'any(.[]; .pod_name == "nocmd")' >/dev/null; then
        echo "create failed (${err##*$'\n'}) but the container was not on the books (nothing to show)"
    else
        echo "create failed: ${err: -160}"
        for ((i = 0; i < 100; i++)); do
            if status registry | jq -e 'all(.[]; .pod_name != "nocmd")' >/dev/null; then
                echo "released $((i / 10)).$((i % 10)) s after the failure"
                grep -q 'never created by the runtime (no event, no cgroup): released' "$E2E_ROOT/agent.log" && rc=0
                break
            fi
            sleep 0.1
        done
        ((rc == 0)) || status registry
    fi
    e2e_crictl rmp -f "$pod" >/dev/null
    return $rc
}

# A GPU container created and not started is confirmed by NRI PostCreateContainer: it stays
# on the books past nri_confirm_grace_ms.
created_kept() {
    local pod cid rc=0
    e2e_write_pod idle "$(e2e_assignment 0 2048 30)" 2 30 "$SLEEP"
    pod=$(e2e_crictl runp "$E2E_ROOT/idle.pod.json") || return 1
    cid=$(e2e_crictl create "$pod" "$E2E_ROOT/idle.ctr.json" "$E2E_ROOT/idle.pod.json") || rc=1
    sleep $((CONFIRM_GRACE_MS / 1000 + 2))
    if ((rc == 0)) && ! status registry | jq -e --arg id "$cid" 'any(.[]; .id == $id)' >/dev/null; then
        echo "container $cid; registry:"
        status registry | jq -c '.[] | {id, state}'
        rc=1
    fi
    e2e_crictl rmp -f "$pod" >/dev/null
    return $rc
}

ctr_of() { e2e_crictl ps -q --label "gpushare-e2e=$1" | head -1 || true; } # NAME

DRIVER_DIR=$(e2e_gpu_fakes "$REL")
e2e_require "CRI-O $CRIO_VERSION built (target/peers/crio-$CRIO_VERSION)" build_crio
e2e_require "crictl $E2E_CRICTL_VERSION built" e2e_build_crictl

for MODE in "${MODES[@]}"; do
    case $MODE in
    nri) L="crio nri" ;;
    wrapper) L="crio wrapper" ;;
    *) echo "e2e-crio: unknown mode '$MODE' (want nri or wrapper)" >&2; exit 2 ;;
    esac
    echo "=== CRI-O $CRIO_VERSION, $MODE ==="
    e2e_require "$L: CRI-O's root, config and images" prepare_crio "$MODE" "$(mktemp -d /tmp/gpushare-crio.XXXXXX)"
    echo "$L: storage driver $STORAGE_DRIVER"
    if [[ $MODE == wrapper ]]; then
        e2e_check "$L: CRI-O refuses install/hooks.d: unknown stage \"precreate\"" hooks_refused
    fi
    e2e_require "$L: CRI-O starts" launch_crio
    if [[ $MODE == nri ]]; then
        e2e_require "$L: agent registers over $E2E_NRI_SOCK" start_agent "$MODE"
        e2e_check "$L: the agent names the runtime cri-o $CRIO_VERSION (log)" \
            grep -q "runtime=cri-o version=$CRIO_VERSION" "$E2E_ROOT/agent.log"
    else
        e2e_require "$L: agent serves the runtime wrapper on $E2E_ROOT/runtime.sock" start_agent "$MODE"
    fi

    e2e_write_pod gpu1 "$(e2e_assignment 1 2048 30)" 2 30 "$SLEEP"
    e2e_check_gpu_pod "$L" "$PORT" gpu1 1 2048 30
    GPU1=$(ctr_of gpu1)
    GPU1_POD=$(e2e_last_pod_id 2>/dev/null || true)
    e2e_check "$L: gpu1 has the limiter preloaded" \
        e2e_grep_out '^/usr/lib/gpushare/libgpushare_limiter.so$' e2e_in_ctr "$GPU1" cat /etc/ld.so.preload
    e2e_check "$L: the registry lists gpu1, running" in_registry "$GPU1" running
    e2e_check "$L: … with the cgroup CRI-O made" cgroup_is_crios "$GPU1"

    e2e_write_pod plain "" "" "" "$SLEEP"
    if cid=$(e2e_run_pod plain); then
        e2e_check "$L: pod without GPU requests sees no /dev/nvidia*" e2e_no_gpu_devices "$cid"
        e2e_check "$L: pod without GPU requests gets no GPU env" e2e_no_gpu_env "$cid"
        e2e_check "$L: … and is not on the agent's books" only_in_registry "$GPU1"
    else
        e2e_check "$L: pod without GPU requests created" false
    fi

    e2e_bad_inputs "$L" "$PORT"
    if [[ $MODE == nri ]]; then
        e2e_check "$L: created, not started: kept past the ${CONFIRM_GRACE_MS} ms grace" created_kept
        e2e_check "$L: runtime create failed after NRI admitted it: released after the grace" unconfirmed_released
    fi

    e2e_check "$L: crictl rmp -f gpu1" e2e_crictl rmp -f "$GPU1_POD"
    e2e_check "$L: … drops it from the registry" gone_from_registry "$GPU1"
    e2e_check "$L: … and its limiter files" test ! -e "$E2E_ROOT/state/limiter/$GPU1"

    stop_crio
done

e2e_summary
