#!/usr/bin/env bash
# End-to-end test of `gpushare node` against real containerd (2.x and 1.7.x over NRI; Debian's
# 1.6, which has no NRI, through the runtime wrapper `gpushare-runtime`), crictl and runc, with
# simulated GPUs: the same checks, the same messages, for every mode. Needs root.
# Usage: tests/e2e/run.sh [VERSION...] (default: 2 1.7 1.6)
# Ends with "N passed, M failed"; exits non-zero on any failure.
set -euo pipefail

# shellcheck source=tests/e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN=$E2E_BIN WRAPPER_BIN=$E2E_WRAPPER_BIN
[[ -x $BIN ]] || { echo "e2e: $BIN not built (cargo build --release)" >&2; exit 1; }
VERSIONS=("$@")
((${#VERSIONS[@]})) || VERSIONS=(2 1.7 1.6)
PORT=${GPUSHARE_E2E_PORT:-19402}
AGENT_PID=

DRIVER_DIR=
cleanup() {
    [[ -n $AGENT_PID ]] && kill -9 "$AGENT_PID" 2>/dev/null || true
    e2e_stop_containerd || true
    [[ -n $DRIVER_DIR ]] && rm -rf "$DRIVER_DIR"
}
trap cleanup EXIT

status() { e2e_agent_status "$PORT" "$1"; }
status_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "127.0.0.1:$PORT/$1"; }
tcp_keeps_details() { [[ $(status_code registry) == 403 && $(status_code inventory) == 403 ]]; }
socket_serves_details() {
    status registry >/dev/null && status inventory >/dev/null &&
        [[ $(stat -c %a "$E2E_ROOT/status.sock") == 600 ]]
}

wait_healthy() { e2e_agent_wait_healthy "$PORT"; }

# The in-container limiter and, standing in for the NVIDIA driver, the fake libcuda.so.1 /
# libnvidia-ml.so.1 the agent mounts into GPU containers as the toolkit mounts the real ones;
# the probe reaches them as CUDA software does (built by `make build`).
REL=$(dirname "$BIN")
LIMITER=$REL/libgpushare_limiter.so
DRIVER_DIR=$(e2e_gpu_fakes "$REL")

start_agent() {
    # gpu-system: the namespace of GPU software that needs whole GPUs (a DCGM exporter, say).
    local link=(--passthrough-namespace gpu-system)
    if [[ $V == 1.6 ]]; then
        # No NRI: the wrapper reaches the agent on its local socket, and the registry is
        # rebuilt from runc's state at start.
        link+=(--no-nri --runtime-socket "$E2E_ROOT/runtime.sock" --runc-root "$E2E_ROOT/runc/k8s.io")
    fi
    e2e_agent_launch "$BIN" "$PORT" "$DRIVER_DIR" "${link[@]}"
    AGENT_PID=$E2E_AGENT_PID
    wait_healthy
}

kill_agent() {
    kill -9 "$AGENT_PID" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
    AGENT_PID=
}

PROBE_MOUNTS=$(e2e_probe_mounts "$REL")

probe_says() { # CID EXPECTED-LINE ARGS...: one output line of `gpu-probe ARGS` is EXPECTED
    local out
    out=$(in_ctr "$1" "${@:3}" 2>&1)
    echo "$out" | tr '\n' '|'
    grep -qxF -- "$2" <<<"$out"
}

read_only_in() { # CID PATH: the container cannot write PATH
    ! in_ctr "$1" sh -c "echo widened >>$2" 2>/dev/null
}

# The in-container view of a 2 GiB quota (issue 10): total 2048 MiB through CUDA (three ways)
# and NVML, 1.5 GiB allocates and 1 GiB more is refused, a second process sees the first's
# usage, and the limits cannot be changed from inside.
limiter_checks() {
    local cid
    e2e_write_pod lim "$(e2e_assignment 2 2048 30)" 2 30 "" "$PROBE_MOUNTS"
    cid=$(run_pod lim) || { e2e_check "$V: limiter pod starts" false; return; }
    LIM_POD=$(e2e_last_pod_id)
    e2e_check "$V: limiter: /etc/ld.so.preload names the library" probe_says "$cid" \
        /usr/lib/gpushare/libgpushare_limiter.so cat /etc/ld.so.preload
    e2e_check "$V: limiter: nvidia-smi view is 2048 MiB total" probe_says "$cid" \
        "2048 MiB, 0 MiB" /usr/local/bin/gpu-probe nvml smi
    e2e_check "$V: limiter: cuMemGetInfo (dlopen) says 2048 MiB" probe_says "$cid" \
        "info rc=0 free_mib=2048 total_mib=2048" /usr/local/bin/gpu-probe dlopen init info
    e2e_check "$V: limiter: cuMemGetInfo (cuGetProcAddress) says 2048 MiB" probe_says "$cid" \
        "info rc=0 free_mib=2048 total_mib=2048" /usr/local/bin/gpu-probe procaddr init info
    e2e_check "$V: limiter: cuMemGetInfo (linked) says 2048 MiB" probe_says "$cid" \
        "info rc=0 free_mib=2048 total_mib=2048" /usr/local/bin/gpu-probe-linked init info
    e2e_check "$V: limiter: 1.5 GiB allocates" probe_says "$cid" \
        "alloc rc=0 id=0" /usr/local/bin/gpu-probe dlopen init alloc:1536 alloc:1024
    e2e_check "$V: limiter: 1 GiB more is out of memory (2)" probe_says "$cid" \
        "alloc rc=2" /usr/local/bin/gpu-probe dlopen init alloc:1536 alloc:1024
    e2e_check "$V: limiter: a second process sees the first's 1 GiB" probe_says "$cid" \
        "info rc=0 free_mib=1024 total_mib=2048" \
        sh -c "/usr/local/bin/gpu-probe dlopen init alloc:1024 sleep:6000 >/dev/null & sleep 2; /usr/local/bin/gpu-probe dlopen init info"
    e2e_check "$V: limiter: the limits file is read-only to the container" read_only_in "$cid" /etc/gpushare/limits.json
    e2e_check "$V: limiter: /etc/ld.so.preload is read-only to the container" read_only_in "$cid" /etc/ld.so.preload
    e2e_crictl rmp -f "$LIM_POD" >/dev/null
    e2e_check "$V: limiter: the container's limiter files are removed with it" \
        test ! -e "$E2E_ROOT/state/limiter/$cid"
}

# The GPU pod checks and their helpers live in lib.sh (shared with crio.sh).
run_pod() { e2e_run_pod "$1"; }
in_ctr() { e2e_in_ctr "$@"; }
check_gpu_pod() { e2e_check_gpu_pod "$V" "$PORT" "$@"; } # NAME GPU MEM_MIB CORE
# Refusals, with the 1.6 wrapper's decision at `crictl start` (E2E_REFUSED_AT_START).
create_refused() { e2e_create_refused "$PORT" "$@"; } # NAME PATTERN
bad_inputs() { e2e_bad_inputs "$V" "$PORT"; }

cleared_env() { # CID NAME...: each variable is unset or empty in the container (NRI cannot
    # remove a variable from the spec, only set it)
    local env
    env=$(e2e_init_env "$1") || return 1
    for n in "${@:2}"; do
        if grep -q "^$n=." <<<"$env"; then
            echo "$(grep "^$n=" <<<"$env") is still set"
            return 1
        fi
    done
}

NVIDIA_ALL_ENV='{"envs":[{"key":"NVIDIA_VISIBLE_DEVICES","value":"all"},{"key":"NVIDIA_MIG_CONFIG_DEVICES","value":"all"},{"key":"NVIDIA_DRIVER_CAPABILITIES","value":"all"},{"key":"CUDA_MPS_PIPE_DIRECTORY","value":"/tmp/mps"}]}'

# write_in_namespace NAME NAMESPACE EXTRA_JSON: e2e_write_pod of a pod without a GPU whose
# container has EXTRA_JSON, in Kubernetes namespace NAMESPACE.
write_in_namespace() {
    e2e_write_pod "$1" "" "" "" "" "$3"
    jq --arg ns "$2" '.metadata.namespace = $ns | .labels["io.kubernetes.pod.namespace"] = $ns' \
        "$E2E_ROOT/$1.pod.json" >"$E2E_ROOT/$1.pod.json.tmp" && mv "$E2E_ROOT/$1.pod.json.tmp" "$E2E_ROOT/$1.pod.json"
}

# exited_within SECONDS CID: the container has exited (killed) within SECONDS.
exited_within() {
    local i state
    for ((i = 0; i < $1 * 10; i++)); do
        state=$(e2e_crictl inspect -o go-template --template '{{.status.state}}' "$2" 2>/dev/null)
        if [[ $state == CONTAINER_EXITED ]]; then
            echo "$2: $state ($(e2e_crictl inspect -o go-template --template 'exit {{.status.exitCode}} {{.status.reason}}' "$2")) after ~$((i * 100)) ms"
            return 0
        fi
        sleep 0.1
    done
    echo "$2: still ${state:-unknown} after $1 s"
    return 1
}

registry_matches_crictl() {
    local reg run
    reg=$(status registry | jq -r '[.[] | select(.state != "stopped") | .id] | sort | .[]')
    run=$(e2e_crictl ps -q --label gpushare-e2e-gpu=true | sort)
    echo "registry: $(echo $reg) crictl: $(echo $run)"
    [[ -n $reg && $reg == "$run" ]]
}

# The seed's step 3: the same busy-loop workload (E2E_BURN), unconstrained (100 %) on GPU 0 and
# at 30 % on GPU 1 (each simulated GPU is one CPU core).
BURN_PODS=()

progress() { cat "$E2E_ROOT/state/sim/$1/progress"; }

throttle_step3() {
    local c100 c30 a0 b0 a1 b1 ratio
    e2e_write_pod burn100 "$(e2e_assignment 0 1024 100)" 1 100 "$E2E_BURN"
    e2e_write_pod burn30 "$(e2e_assignment 1 1024 30)" 1 30 "$E2E_BURN"
    c100=$(run_pod burn100) && BURN_PODS+=("$(e2e_last_pod_id)") &&
        c30=$(run_pod burn30) && BURN_PODS+=("$(e2e_last_pod_id)") ||
        { e2e_check "$V: burn pods start" false; return; }
    BURN30=$c30
    sleep 3
    echo -n "$V: " && e2e_quota_window_twice "$PORT" "$c30" "$c100" progress
    e2e_check "$V: 30% pod uses 30 ±5 % of its GPU (${SHARE30}‰)" test "$SHARE30" -ge 250 -a "$SHARE30" -le 350
    e2e_check "$V: 30% pod runs at 30 ±5 % of the unconstrained pod's rate per GPU (${RATIO30}‰)" test "$RATIO30" -ge 250 -a "$RATIO30" -le 350
    e2e_check "$V: metrics show both pods' utilization and quota" bash -c "
        m=\$(curl -fsS 127.0.0.1:$PORT/metrics)
        grep -q 'gpushare_container_gpu_utilization_ratio{pod=\"default/burn100\"' <<<\"\$m\" &&
        grep -q 'gpushare_container_gpu_core_quota_ratio{pod=\"default/burn30\".*} 0.30' <<<\"\$m\" &&
        grep -E 'gpushare_container_(gpu_utilization_ratio|throttled_seconds_total)\{pod=\"default/burn' <<<\"\$m\""
}

# After SIGKILL of the agent, the guardian thaws the throttled pod within 1 s.
guardian_thaws() {
    local path state
    path=$(status registry | jq -r --arg id "$BURN30" '.[] | select(.id == $id) | .cgroups_path')
    state=/sys/fs/cgroup/freezer$path/gpushare-throttled/freezer.state
    [[ -f $state ]] || state=/sys/fs/cgroup$path/gpushare-throttled/cgroup.freeze
    kill -9 "$AGENT_PID"
    wait "$AGENT_PID" 2>/dev/null || true
    AGENT_PID=
    sleep 1
    echo "after 1 s: $(cat "$state")"
    grep -qE '^(THAWED|0)$' "$state" && sleep 0.5 && grep -qE '^(THAWED|0)$' "$state"
}

# Debian's containerd 1.6 through the wrapper only: fail closed while the agent is down (a
# GPU container is refused with the reason, one without a GPU still runs), and `runc` run on
# a bundle by hand through the wrapper gets the same decision.
runtime_only_checks() {
    kill_agent
    e2e_write_pod down-gpu "$(e2e_assignment 1 1024 10)" 1 10
    e2e_check "$V: agent down → a GPU container is refused with the reason" create_refused down-gpu \
        "gpushare: GPU containers are refused while the gpushare node agent is not reachable on $E2E_ROOT/runtime.sock"
    e2e_write_pod down-plain "" "" ""
    e2e_check "$V: agent down → a container without a GPU still runs" run_pod down-plain
    e2e_require "$V: agent started again" start_agent
    e2e_check "$V: … and its registry rebuilt from runc's state matches crictl" registry_matches_crictl
}

for V in "${VERSIONS[@]}"; do
    echo "=== containerd $V ==="
    root=$(mktemp -d /tmp/gpushare-e2e.XXXXXX)
    unset E2E_RUNC GPUSHARE_RUNTIME_CONFIG E2E_REFUSED_AT_START
    if [[ $V == 1.6 ]]; then
        # containerd's runc shim runs `gpushare-runtime` (the wrapper's own binary) as its
        # runc; the wrapper's config reaches it through containerd's environment.
        mkdir -p "$root/bin"
        ln -sf "$WRAPPER_BIN" "$root/bin/gpushare-runtime"
        printf 'runtime = "%s"\nsocket = "%s"\npassthrough_namespaces = ["gpu-system"]\n' \
            "$(command -v runc || echo /usr/sbin/runc)" "$root/runtime.sock" >"$root/runtime.toml"
        export E2E_RUNC=$root/bin/gpushare-runtime GPUSHARE_RUNTIME_CONFIG=$root/runtime.toml
    fi
    e2e_require "$V: containerd starts" e2e_start_containerd "$V" "$root"
    if [[ $V == 1.6 ]]; then
        # The runc shim runs the wrapper when the task is created: refusals come at start.
        E2E_REFUSED_AT_START=$E2E_ROOT/runc/k8s.io
        e2e_require "$V: agent serves the runtime wrapper on $E2E_ROOT/runtime.sock" start_agent
        e2e_check "$V: the runtime socket is root's only (0600)" \
            test "$(stat -c %a "$E2E_ROOT/runtime.sock")" = 600
    else
        e2e_require "$V: agent registers over $E2E_NRI_SOCK" start_agent
    fi
    e2e_check "$V: the status port answers /registry and /inventory 403 (the node's containers are not for whoever reaches it)" \
        tcp_keeps_details
    e2e_check "$V: … the status socket answers them, and is root's only (0600)" socket_serves_details

    # The image (or the pod) asks nvidia-container-runtime for every GPU; gpushare's grant wins.
    e2e_write_pod gpu1 "$(e2e_assignment 1 2048 30)" 2 30 "" "$NVIDIA_ALL_ENV"
    check_gpu_pod gpu1 1 2048 30
    e2e_check "$V: gpu1's own NVIDIA_MIG_CONFIG_DEVICES/CUDA_MPS_* are cleared" cleared_env "$(e2e_crictl ps -q --label gpushare-e2e=gpu1 | head -1)" \
        NVIDIA_MIG_CONFIG_DEVICES CUDA_MPS_PIPE_DIRECTORY

    e2e_write_pod plain "" "" ""
    if cid=$(run_pod plain); then
        e2e_check "$V: pod without GPU requests sees no /dev/nvidia*" e2e_no_gpu_devices "$cid"
        e2e_check "$V: pod without GPU requests gets no GPU env" e2e_no_gpu_env "$cid"
    else
        e2e_check "$V: pod without GPU requests created" false
    fi
    # A sidecar without a GPU whose image says NVIDIA_VISIBLE_DEVICES=all (issue 11.3).
    e2e_write_pod sidecar "" "" "" "" "$NVIDIA_ALL_ENV"
    if cid=$(run_pod sidecar); then
        e2e_check "$V: no-GPU container with NVIDIA_VISIBLE_DEVICES=all gets void" e2e_env_is "$cid" NVIDIA_VISIBLE_DEVICES void
        e2e_check "$V: … and its other NVIDIA_*/CUDA_MPS_* variables are cleared" cleared_env "$cid" \
            NVIDIA_MIG_CONFIG_DEVICES NVIDIA_DRIVER_CAPABILITIES CUDA_MPS_PIPE_DIRECTORY
        e2e_check "$V: … and it sees no /dev/nvidia*" e2e_no_gpu_devices "$cid"
    else
        e2e_check "$V: no-GPU container with NVIDIA_VISIBLE_DEVICES=all created" false
    fi
    # The same in a passthrough namespace (the GPU software that needs whole GPUs) is left as
    # created.
    write_in_namespace exempt gpu-system "$NVIDIA_ALL_ENV"
    if cid=$(run_pod exempt); then
        e2e_check "$V: in a passthrough namespace a no-GPU container keeps NVIDIA_VISIBLE_DEVICES=all" \
            e2e_env_is "$cid" NVIDIA_VISIBLE_DEVICES all
    else
        e2e_check "$V: no-GPU container in a passthrough namespace created" false
    fi
    # The same variable twice (kubelet never repeats one; an image's config or a CRI client
    # can). NRI adjusts the first copy only and the second would override it, so the NRI
    # plugin refuses the container rather than let it run with NVIDIA_VISIBLE_DEVICES=all;
    # the wrapper writes the spec itself and replaces every copy.
    e2e_write_pod twice "" "" "" "" '{"envs":[{"key":"NVIDIA_VISIBLE_DEVICES","value":"all"},{"key":"NVIDIA_VISIBLE_DEVICES","value":"all"}]}'
    if [[ -z ${E2E_REFUSED_AT_START:-} ]]; then
        e2e_check "$V: a container repeating NVIDIA_VISIBLE_DEVICES is refused" \
            create_refused twice "sets NVIDIA_VISIBLE_DEVICES 2 times"
    elif cid=$(run_pod twice); then
        e2e_check "$V: a container repeating NVIDIA_VISIBLE_DEVICES=all gets one NVIDIA_VISIBLE_DEVICES=void" \
            e2e_env_is "$cid" NVIDIA_VISIBLE_DEVICES void
    else
        e2e_check "$V: a container repeating NVIDIA_VISIBLE_DEVICES created through the wrapper" false
    fi

    bad_inputs
    limiter_checks

    e2e_write_pod gpu2 "$(e2e_assignment 3 4096 50)" 4 50
    e2e_check "$V: second GPU pod on GPU 3" run_pod gpu2
    e2e_check "$V: registry matches crictl" registry_matches_crictl

    throttle_step3
    e2e_check "$V: agent SIGKILLed while throttling: the guardian thaws within 1 s" guardian_thaws
    # Created while no agent runs: containerd skips the missing NRI plugin (the wrapper of 1.6
    # neutralizes the environment itself).
    write_in_namespace down-cuda default "$NVIDIA_ALL_ENV"
    write_in_namespace down-exempt gpu-system "$NVIDIA_ALL_ENV"
    down_cuda=$(run_pod down-cuda) || down_cuda=
    down_exempt=$(run_pod down-exempt) || down_exempt=
    # … and one only created, not started (containerd makes its task at the start).
    write_in_namespace down-created default "$NVIDIA_ALL_ENV"
    down_created=$(e2e_crictl create "$(e2e_crictl runp "$E2E_ROOT/down-created.pod.json")" \
        "$E2E_ROOT/down-created.ctr.json" "$E2E_ROOT/down-created.pod.json") || down_created=
    e2e_require "$V: agent restarted while containers run" start_agent
    e2e_crictl start "$down_created" >/dev/null 2>&1 || echo "start of the container created while the agent was down: refused"
    if [[ $V == 1.6 ]]; then
        e2e_check "$V: a no-GPU container created through the wrapper while the agent was down got NVIDIA_VISIBLE_DEVICES=void" \
            e2e_env_is "$down_cuda" NVIDIA_VISIBLE_DEVICES void
    else
        e2e_check "$V: a no-GPU container created with NVIDIA_VISIBLE_DEVICES=all while the agent was down is killed at its resync" \
            exited_within 5 "$down_cuda"
        e2e_check "$V: … and the agent logs why" \
            grep -qF 'granted no GPU, its NVIDIA_VISIBLE_DEVICES "all" and not void' "$E2E_ROOT/agent.log"
        e2e_check "$V: … one created (not started) while the agent was down is killed at its start" \
            exited_within 5 "$down_created"
        echo "    created while the agent was down, killed at its start: $(e2e_crictl inspect -o go-template \
            --template '{{.status.state}} exit {{.status.exitCode}} {{.status.reason}}' "$down_created" 2>&1)"
    fi
    e2e_check "$V: … one in a passthrough namespace keeps running with NVIDIA_VISIBLE_DEVICES=all" \
        e2e_env_is "$down_exempt" NVIDIA_VISIBLE_DEVICES all
    e2e_check "$V: after agent restart the registry matches crictl" registry_matches_crictl
    for p in "${BURN_PODS[@]}"; do e2e_crictl rmp -f "$p" >/dev/null; done
    BURN_PODS=()
    e2e_check "$V: removed pods leave the registry" registry_matches_crictl

    e2e_restart_containerd
    e2e_check "$V: agent reconnects after containerd restart" wait_healthy
    if [[ $V != 1.6 ]]; then
        e2e_check "$V: agent registered twice (log)" bash -c "(( \$(grep -c 'registered with the runtime' '$E2E_ROOT/agent.log') >= 2 ))"
    fi
    e2e_write_pod gpu3 "$(e2e_assignment 2 1024 10)" 1 10
    check_gpu_pod gpu3 2 1024 10
    e2e_check "$V: after containerd restart the registry matches crictl" registry_matches_crictl
    if [[ $V == 1.6 ]]; then
        runtime_only_checks
        e2e_stop_containerd
        rm -f "$E2E_ROOT/agent.log" 2>/dev/null || true
        continue
    fi

    # The same agent as a pre-installed plugin, launched by containerd itself.
    kill_agent
    cp "$BIN" "$E2E_NRI_PLUGIN_DIR/10-gpushare"
    cat >"$E2E_NRI_CONF_DIR/10-gpushare.conf" <<EOF
gpu_backend = "sim"
node_name = "e2e-node"
dev_root = "$E2E_ROOT/simdev"
status_listen = "127.0.0.1:$PORT"
status_socket = "$E2E_ROOT/status.sock"
[log]
file = "$E2E_ROOT/agent.log"
[limiter]
library = "$LIMITER"
driver_dir = "$DRIVER_DIR"
[throttle]
state_dir = "$E2E_ROOT/state"
EOF
    e2e_restart_containerd
    e2e_check "$V: pre-installed plugin launched and registered" wait_healthy
    e2e_check "$V: pre-installed plugin rebuilt the registry" registry_matches_crictl
    e2e_write_pod gpu4 "$(e2e_assignment 0 3072 20)" 3 20
    check_gpu_pod gpu4 0 3072 20
    e2e_write_pod bad-pre "$(e2e_assignment 1 2048 33)" 2 33
    e2e_check "$V: pre-installed plugin refuses core 33" create_refused bad-pre "33 is not a multiple of 5"

    # Fail closed: quotas configured but the controller cannot start (no cgroupfs at its root):
    # GPU containers are refused with the reason, others still run.
    echo "cgroup_root = \"$E2E_ROOT/no-cgroupfs\"" >>"$E2E_NRI_CONF_DIR/10-gpushare.conf"
    e2e_restart_containerd
    e2e_check "$V: pre-installed plugin without a working controller registered" wait_healthy
    e2e_write_pod gpu5 "$(e2e_assignment 2 1024 10)" 1 10
    e2e_check "$V: no controller → GPU container refused with the reason" create_refused gpu5 \
        "GPU containers are refused on this node until its quotas can be enforced: the throttling controller cannot start"
    e2e_write_pod plain2 "" "" ""
    e2e_check "$V: no controller → a container without a GPU still runs" run_pod plain2

    e2e_stop_containerd
    rm -f "$E2E_ROOT/agent.log" 2>/dev/null || true
done

e2e_summary
