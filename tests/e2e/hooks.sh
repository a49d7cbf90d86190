#!/usr/bin/env bash
# End-to-end test of gpushare's runtime-level modes outside containerd, with simulated GPUs:
# podman (Debian 12's 4.3) through the OCI hooks of install/hooks.d (precreate, poststart,
# poststop), and runc run by hand on an OCI bundle through the runtime wrapper
# (gpushare-runtime). The agent runs without NRI and serves its local API. Needs root.
# Usage: tests/e2e/hooks.sh
# Ends with "N passed, M failed"; exits non-zero on any failure.
set -euo pipefail

# shellcheck source=tests/e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN=$E2E_BIN WRAPPER_BIN=$E2E_WRAPPER_BIN
[[ -x $BIN ]] || { echo "e2e-hooks: $BIN not built (cargo build --release)" >&2; exit 1; }
((EUID == 0)) || { echo "e2e-hooks: needs root (podman, runc, device nodes)" >&2; exit 1; }
command -v podman >/dev/null || { echo "e2e-hooks: podman missing (tests/e2e/deps.sh)" >&2; exit 1; }
RUNC=$(command -v runc) || { echo "e2e-hooks: runc missing (tests/e2e/deps.sh)" >&2; exit 1; }
PORT=${GPUSHARE_E2E_HOOKS_PORT:-19460}
REL=$(dirname "$BIN")

ROOT=$(mktemp -d /tmp/gpushare-e2e-hooks.XXXXXX)
E2E_ROOT=$ROOT # where e2e_agent_launch puts the agent's files (no containerd here)
SOCK=$ROOT/runtime.sock
# Every container's cgroup below this one (podman's and the bundle's), removed at the end.
CGROUP_PARENT=/gpushare-e2e-hooks-${ROOT##*.}
AGENT_PID=
DRIVER_DIR=$(e2e_gpu_fakes "$REL")

# podman in throwaway roots (storage, state, runc's root, cgroups), without network, with the
# shipped hooks.d files pointed at this build. runc's root is set by a runtime script: the
# `podman container cleanup` conmon runs when a container exits gets podman's --runtime but
# not its --runtime-flag.
PODMAN=(podman --root "$ROOT/storage" --runroot "$ROOT/run" --tmpdir "$ROOT/libpod"
    --storage-driver vfs --cgroup-manager cgroupfs --events-backend file
    --hooks-dir "$ROOT/hooks.d" --runtime "$ROOT/bin/runc")
# podman's default rlimits (1048576 files and processes) need CAP_SYS_RESOURCE, which
# sandboxed CI hosts may lack.
RUN=(run --network none --cgroup-parent "$CGROUP_PARENT" --ulimit nofile=1024:1024
    --ulimit nproc=4096:4096)
IMAGE=$E2E_BUSYBOX_IMAGE

pm() { "${PODMAN[@]}" "$@"; }

cleanup() {
    local r id
    kill_agent
    timeout 60 "${PODMAN[@]}" rm -af -t 0 >/dev/null 2>&1 || true
    for r in "$ROOT/runc" "$ROOT/runc-bundle"; do
        for id in $("$RUNC" --root "$r" list -q 2>/dev/null); do
            "$RUNC" --root "$r" delete --force "$id" >/dev/null 2>&1 || true
        done
    done
    e2e_unmount_below "$ROOT"
    for r in /sys/fs/cgroup/*"$CGROUP_PARENT" /sys/fs/cgroup"$CGROUP_PARENT"; do
        if [[ -d $r ]]; then find "$r" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
    done
    rm -rf --one-file-system "$ROOT" "$DRIVER_DIR" 2>/dev/null || true
}
trap cleanup EXIT

status() { e2e_agent_status "$PORT" "$1"; }

# The agent as on a node without NRI: the local API on its socket, the registry rebuilt from
# podman's runc root at start; a container the precreate hook got admitted is looked for in
# runc's state after 1 s without starting (60 s by default).
start_agent() {
    printf '[runtime_api]\nhook_grace_ms = 1000\n' >"$ROOT/node.toml"
    e2e_agent_launch "$BIN" "$PORT" "$DRIVER_DIR" --config "$ROOT/node.toml" --no-nri \
        --runtime-socket "$SOCK" --runc-root "$ROOT/runc"
    AGENT_PID=$E2E_AGENT_PID
    e2e_agent_wait_healthy "$PORT"
}

kill_agent() {
    kill -9 "$AGENT_PID" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
    AGENT_PID=
}

gpu_uuid() { status inventory | jq -r ".inventory.gpus[] | select(.index == $1) | .uuid"; }

# gpu_flags GPU MEMORY_MIB CORE GRANT_MEM GRANT_CORE: sets FLAGS to the --annotation options
# of a GPU container ("" leaves one out; GPU "" leaves the assignment out). podman reads
# --annotation as a CSV list: the assignment's JSON goes in one quoted field, quotes doubled.
gpu_flags() {
    local a
    FLAGS=()
    if [[ -n $1 ]]; then
        a=$(e2e_assignment "$1" "$2" "$3")
        FLAGS+=(--annotation "\"gpushare.io/assignment=${a//\"/\"\"}\"")
    fi
    if [[ -n $4 ]]; then FLAGS+=(--annotation "gpushare.io/granted-mem=$4"); fi
    if [[ -n $5 ]]; then FLAGS+=(--annotation "gpushare.io/granted-core=$5"); fi
}

# The environment of a container's main process, read on the host (`podman exec` gets the
# spec podman stored, before the hook's adjustment).
init_env() {
    local pid
    pid=$(pm inspect -f '{{.State.Pid}}' "$1") || return 1
    tr '\0' '\n' <"/proc/$pid/environ"
}

env_is() { # NAME VAR VALUE
    local got
    got=$(init_env "$1" | sed -n "s/^$2=//p" || true)
    echo "$2='$got' want '$3'"
    [[ $got == "$3" ]]
}

only_gpu_node() { # NAME WANT: the container's /dev/nvidiaN list is exactly WANT
    local got
    got=$(pm exec "$1" ls /dev | grep -E '^nvidia[0-9]+$' | tr '\n' ' ' | sed 's/ $//' || true)
    echo "devices: '$got' want: '$2'"
    [[ $got == "$2" ]]
}

# The precreate hook's handle on a container: an annotation of the spec podman wrote.
handle_of() {
    local spec
    spec=$(pm inspect -f '{{.OCIConfigPath}}' "$1" 2>/dev/null) || return 1
    jq -r '.annotations["gpushare.io/handle"] // empty' "$spec"
}

in_registry() { # ID [STATE]
    status registry | jq -e --arg id "$1" --arg st "${2:-}" \
        'any(.[]; .id == $id and ($st == "" or .state == $st))' >/dev/null
}

gone_from_registry() { # ID: within 10 s
    local i
    for ((i = 0; i < 100; i++)); do
        in_registry "$1" || return 0
        sleep 0.1
    done
    status registry
    return 1
}

registry_empty() { status registry | tee /dev/stderr | jq -e 'length == 0' >/dev/null; }

# A container podman fails to create after the hook admitted it gets no poststop hook: the
# agent releases it once the grace period has passed and runc does not have it.
released_unstarted() { # FLAGS...
    local out rc=0 i
    out=$(pm "${RUN[@]}" --rm "$@" "$IMAGE" /no/such/command 2>&1) || rc=$?
    echo "$out"
    ((rc != 0)) || return 1
    for ((i = 0; i < 50; i++)); do
        registry_empty 2>/dev/null && break
        sleep 0.1
    done
    registry_empty && grep 'never created by the runtime: released' "$ROOT/agent.log"
}

# podman_refused NAME PATTERN FLAGS...: `podman run` fails with PATTERN in its error (podman
# prints what the hook says), and leaves nothing behind: no container, nothing on the agent's
# books (when it runs).
podman_refused() {
    local name=$1 pattern=$2 out rc=0
    out=$(pm "${RUN[@]}" --rm --name "$name" "${@:3}" "$IMAGE" true 2>&1) || rc=$?
    echo "$out"
    ((rc != 0)) && grep -qF -- "$pattern" <<<"$out" && ! pm container exists "$name" &&
        { [[ -z $AGENT_PID ]] || registry_empty; }
}

cgroup_is_podmans() { # NAME HANDLE: the registry's cgroup is the one podman made
    local id
    id=$(pm inspect -f '{{.Id}}' "$1") || return 1
    status registry | jq -e --arg h "$2" --arg id "$id" \
        'any(.[]; .id == $h and (.cgroups_path | endswith($id)))'
}

stops_and_leaves() { # NAME HANDLE
    pm stop -t 1 "$1" && gone_from_registry "$2"
}

# The /dev/nvidiaN nodes and GPUSHARE_GPU_* variables a --rm container's main process sees, on
# one line.
rm_container_sees() { # FLAGS...
    pm "${RUN[@]}" --rm "$@" "$IMAGE" sh -c \
        'ls /dev | grep -E "^nvidia[0-9]+$"; tr "\0" "\n" </proc/1/environ | grep -E "^GPUSHARE_GPU_(MEMORY_MIB|CORE_PERCENT)="' |
        paste -sd' '
}

no_handle() { [[ -z $(handle_of "$1") ]]; }
no_gpu_devices() { ! pm exec "$1" ls /dev | grep nvidia; }
no_gpu_env() { ! init_env "$1" | grep -E '^(NVIDIA_|GPUSHARE_|ALIYUN_COM_GPU)'; }

load_image() { e2e_build_images && pm load -i "$E2E_BUSYBOX_TAR"; }

# ------------------------------------------------------------- setup ----
mkdir -p "$ROOT/hooks.d" "$ROOT/bin"
printf '#!/bin/sh\nexec "%s" --root "%s" "$@"\n' "$RUNC" "$ROOT/runc" >"$ROOT/bin/runc"
chmod +x "$ROOT/bin/runc"
printf 'runtime = "%s"\nsocket = "%s"\n' "$RUNC" "$SOCK" >"$ROOT/runtime.toml"
for f in "$E2E_REPO"/install/hooks.d/*.json; do
    jq --arg bin "$BIN" --arg cfg "$ROOT/runtime.toml" \
        '.hook.path = $bin | .hook.env = ["GPUSHARE_RUNTIME_CONFIG=" + $cfg]' "$f" \
        >"$ROOT/hooks.d/${f##*/}"
done
e2e_require "podman $(podman --version | awk '{print $3}') loads the busybox image" load_image
e2e_require "agent serves the runtime API on $SOCK" start_agent

# ------------------------------------------------------------ podman ----
echo "=== podman through install/hooks.d ==="
gpu_flags 1 2048 30 2 30
e2e_check "podman: GPU container runs" pm "${RUN[@]}" -d --name gpu1 "${FLAGS[@]}" "$IMAGE" sleep 3600
H1=$(handle_of gpu1 || true)
e2e_check "podman: its spec carries the precreate hook's handle ($H1)" \
    e2e_grep_out '^hook-[0-9a-f]\{32\}$' echo "$H1"
e2e_check "podman: it sees /dev/nvidia1 and no other GPU" only_gpu_node gpu1 nvidia1
e2e_check "podman: it has /dev/nvidiactl and /dev/nvidia-uvm" \
    pm exec gpu1 ls /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools
e2e_check "podman: NVIDIA_VISIBLE_DEVICES is GPU 1's UUID" env_is gpu1 NVIDIA_VISIBLE_DEVICES "$(gpu_uuid 1)"
e2e_check "podman: GPUSHARE_GPU_MEMORY_MIB=2048" env_is gpu1 GPUSHARE_GPU_MEMORY_MIB 2048
e2e_check "podman: GPUSHARE_GPU_CORE_PERCENT=30" env_is gpu1 GPUSHARE_GPU_CORE_PERCENT 30
e2e_check "podman: the limiter is preloaded" \
    e2e_grep_out /usr/lib/gpushare/libgpushare_limiter.so pm exec gpu1 cat /etc/ld.so.preload
e2e_check "podman: the registry lists it under its handle, running (poststart)" in_registry "$H1" running
e2e_check "podman: … with podman's cgroup" cgroup_is_podmans gpu1 "$H1"
e2e_check "podman: stopped → off the registry (poststop)" stops_and_leaves gpu1 "$H1"
e2e_check "podman: … and its limiter files are removed" test ! -e "$ROOT/state/limiter/$H1"

gpu_flags 2 1024 10 1 10
e2e_check "podman: a --rm GPU container sees /dev/nvidia2 and its env" e2e_grep_out \
    '^nvidia2 GPUSHARE_GPU_MEMORY_MIB=1024 GPUSHARE_GPU_CORE_PERCENT=10$' rm_container_sees "${FLAGS[@]}"
e2e_check "podman: … and is off the registry once it exited" registry_empty

gpu_flags 1 2048 33 2 33
e2e_check "podman: core 33 refused with the NRI path's message" podman_refused bad-core33 \
    "aliyun.com/gpu-core.percentage 33 is not a multiple of 5" "${FLAGS[@]}"
gpu_flags 7 2048 30 2 30
e2e_check "podman: GPU index 7 refused on a 4-GPU node" podman_refused bad-gpu7 \
    "gpuIndex 7 does not exist on this node (4 GPUs: 0-3)" "${FLAGS[@]}"
gpu_flags "" "" "" 2 30
e2e_check "podman: granted gpu-mem without an assignment refused" podman_refused bad-missing \
    "has no gpushare.io/assignment annotation" "${FLAGS[@]}"

gpu_flags 1 2048 30 2 30
e2e_check "podman: a GPU container runc fails to create is released after the grace period" \
    released_unstarted "${FLAGS[@]}"

e2e_check "podman: a container without annotations runs" pm "${RUN[@]}" -d --name plain "$IMAGE" sleep 3600
e2e_check "podman: … untouched: no handle" no_handle plain
e2e_check "podman: … no /dev/nvidia*" no_gpu_devices plain
e2e_check "podman: … no GPU env" no_gpu_env plain
e2e_check "podman: … and nothing on the agent's books" registry_empty
pm rm -f -t 0 plain >/dev/null 2>&1 || true

gpu_flags 3 4096 50 4 50
e2e_check "podman: GPU container on GPU 3 runs" pm "${RUN[@]}" -d --name gpu3 "${FLAGS[@]}" "$IMAGE" sleep 3600
H3=$(handle_of gpu3 || true)
kill_agent
e2e_require "podman: agent restarted" start_agent
e2e_check "podman: the registry rebuilt from runc's state lists it under its handle" in_registry "$H3" running
kill_agent
gpu_flags 1 1024 10 1 10
e2e_check "podman: agent down → a GPU container is refused with the reason" podman_refused down-gpu \
    "gpushare: GPU containers are refused while the gpushare node agent is not reachable on $SOCK" "${FLAGS[@]}"
e2e_check "podman: agent down → a container without annotations runs" pm "${RUN[@]}" --rm "$IMAGE" true
e2e_check "podman: agent down → a GPU container still stops (poststop never fails)" pm stop -t 1 gpu3
e2e_require "podman: agent started again" start_agent
e2e_check "podman: … and its rebuilt registry is empty" registry_empty
pm rm -af -t 0 >/dev/null 2>&1 || true

# ------------------------------------------- runc on a bundle, wrapped ----
echo "=== runc on a bundle through gpushare-runtime ==="
WRAPPER=$ROOT/bin/gpushare-runtime
ln -sf "$WRAPPER_BIN" "$WRAPPER"
BUNDLE=$ROOT/bundle
# The busybox image's rootfs, unpacked from its OCI layout (one uncompressed layer).
unpack_busybox() {
    local oci=$ROOT/oci manifest layer
    mkdir -p "$oci" "$BUNDLE/rootfs"
    tar -xf "$E2E_BUSYBOX_TAR" -C "$oci"
    manifest=$(jq -r '.manifests[0].digest | sub("sha256:"; "")' "$oci/index.json")
    layer=$(jq -r '.layers[0].digest | sub("sha256:"; "")' "$oci/blobs/sha256/$manifest")
    tar -xf "$oci/blobs/sha256/$layer" -C "$BUNDLE/rootfs"
    "$RUNC" spec --bundle "$BUNDLE"
    jq --arg a "$(e2e_assignment 2 3072 20)" --arg cg "$CGROUP_PARENT/bundle1" '
        .process.terminal = false
        | .process.args = ["/bin/sh", "-c", "ls /dev | grep -E \"^nvidia[0-9]+$\"; tr \"\\0\" \"\\n\" </proc/1/environ; sleep 2"]
        | .annotations = {"gpushare.io/assignment": $a, "gpushare.io/granted-mem": "3",
                          "gpushare.io/granted-core": "20"}
        | .linux.cgroupsPath = $cg' "$BUNDLE/config.json" >"$BUNDLE/config.json.new"
    mv "$BUNDLE/config.json.new" "$BUNDLE/config.json"
}
wrapped() { GPUSHARE_RUNTIME_CONFIG=$ROOT/runtime.toml "$WRAPPER" --root "$ROOT/runc-bundle" "$@"; }

bundle_runs() {
    local i
    # runc create hands its stdio to the container: its output lands in bundle1.out.
    wrapped create --bundle "$BUNDLE" bundle1 >"$ROOT/bundle1.out" 2>&1 </dev/null || {
        cat "$ROOT/bundle1.out"
        return 1
    }
    in_registry bundle1 created || { echo "not on the books after create"; return 1; }
    wrapped start bundle1
    for ((i = 0; i < 100; i++)); do
        [[ $("$RUNC" --root "$ROOT/runc-bundle" state bundle1 | jq -r .status) == stopped ]] && break
        sleep 0.1
    done
    cat "$ROOT/bundle1.out"
}
e2e_require "bundle: busybox rootfs and config.json with the annotations" unpack_busybox
e2e_check "bundle: gpushare-runtime create + start" bundle_runs
bundle_saw() { # LINE...: each is a line of what the bundle's process printed
    local l
    for l in "$@"; do grep -qxF -- "$l" "$ROOT/bundle1.out" || { echo "no line '$l'"; return 1; }; done
}
bundle_devices_are() { [[ $(grep -E '^nvidia[0-9]+$' "$ROOT/bundle1.out" | paste -sd' ') == "$1" ]]; }
e2e_check "bundle: it saw /dev/nvidia2 and no other GPU" bundle_devices_are nvidia2
e2e_check "bundle: NVIDIA_VISIBLE_DEVICES is GPU 2's UUID" bundle_saw "NVIDIA_VISIBLE_DEVICES=$(gpu_uuid 2)"
e2e_check "bundle: GPUSHARE_GPU_MEMORY_MIB=3072, GPUSHARE_GPU_CORE_PERCENT=20" \
    bundle_saw GPUSHARE_GPU_MEMORY_MIB=3072 GPUSHARE_GPU_CORE_PERCENT=20
e2e_check "bundle: the registry lists it, started" in_registry bundle1 running
bundle_deleted() { wrapped delete bundle1 && registry_empty; }
e2e_check "bundle: gpushare-runtime delete → off the registry" bundle_deleted

e2e_summary
