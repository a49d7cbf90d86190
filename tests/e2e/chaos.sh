#!/usr/bin/env bash
# Chaos test of `gpushare node` against real containerd 2, crictl and runc, with simulated GPUs.
# 50 throttled busy containers (4 sim GPUs × 12-13, each 5 % and 512 MiB), then:
#   1. the agent SIGKILLed 10 times at random points, some while a container creation is in
#      flight: what was frozen at the kill is thawed within 1 s (the guardian), the
#      restarted agent's registry matches crictl, no container loses its GPU or quota, a creation cut short leaves a
#      running container the agent adjusted and registered, one the runtime created without
#      the agent that the restarted agent killed at its resync, or none;
#   2. the agent and its guardian SIGKILLed together (the agent stopped first, so that it
#      cannot start its guardian again): what was frozen stays so until the next agent
#      start, which thaws at once;
#   3. containerd restarted: the agent re-registers and its registry matches within 2 s;
#   4. 200 concurrent GPU container creations beyond capacity: no NRI timeout, no GPU
#      over-committed;
#   5. frozen containers stop within the grace period (SIGTERM handled, and SIGTERM ignored).
# Needs root; about 4 minutes on 2 CPUs. Usage: tests/e2e/chaos.sh (CHAOS_SEED=N to replay
# the same random kill points). Ends with "N passed, M failed"; exits non-zero on any failure.
# The agent's and containerd's logs are kept in target/e2e-chaos/.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/e2e/lib.sh
source "$here/lib.sh"

BIN=${GPUSHARE_BIN:-$repo/target/release/gpushare}
[[ -x $BIN ]] || { echo "e2e: $BIN not built (make build)" >&2; exit 1; }
REL=$(dirname "$BIN")
PORT=${GPUSHARE_E2E_CHAOS_PORT:-19403}
KILLS=10
THROTTLED=50 # busy containers under their quota during the kills
T_CORE=5     # their compute quota, % (the least a quota may be)
STORM=200    # concurrent GPU container creations
SEED=${CHAOS_SEED:-$$}
RANDOM=$SEED
LOGS=$repo/target/e2e-chaos
GPU_MIB=15360 # memory of each sim GPU

AGENT_PID=
AGENT_T0=0
DRIVER_DIR=

cleanup() {
    local p
    if [[ -n $AGENT_PID ]]; then
        kill -9 "$AGENT_PID" 2>/dev/null || true
        wait "$AGENT_PID" 2>/dev/null || true
        sleep 0.3 # its guardian thaws, so that the pods can be stopped
    fi
    # Creations still running in the background (this shell's jobs only).
    for p in $(jobs -pr); do kill "$p" 2>/dev/null || true; done
    if [[ -n ${E2E_ROOT:-} && -d $E2E_ROOT ]]; then
        mkdir -p "$LOGS"
        cp -f "$E2E_ROOT/agent.log" "$E2E_ROOT/containerd.log" "$LOGS/" 2>/dev/null || true
    fi
    e2e_stop_containerd || true
    [[ -z $DRIVER_DIR ]] || rm -rf "$DRIVER_DIR"
}
trap cleanup EXIT

now_ms() { # milliseconds since the epoch, in NOW_MS (no subshell: used in polling loops)
    local t=${EPOCHREALTIME//[!0-9]/}
    NOW_MS=$((t / 1000))
}

ms_sleep() { sleep "$(($1 / 1000)).$(printf %03d $(($1 % 1000)))"; }

status() { e2e_agent_status "$PORT" "$1"; }

wait_healthy() { e2e_agent_wait_healthy "$PORT" 15; }

# gpu-mem is counted in MiB on this node (kubelet grants 512 for 512 MiB), so that 512 MiB
# shares can be granted.
launch_agent() { # start the agent in the background; AGENT_T0 is when (ms)
    [[ -f $E2E_ROOT/agent.toml ]] || printf '[resources]\nmemory_unit = "MiB"\n' >"$E2E_ROOT/agent.toml"
    now_ms
    AGENT_T0=$NOW_MS
    e2e_agent_launch "$BIN" "$PORT" "$DRIVER_DIR" --config "$E2E_ROOT/agent.toml"
    AGENT_PID=$E2E_AGENT_PID
}

start_agent() { launch_agent && wait_healthy; }

# The registry's running GPU containers are crictl's, within 1 s (a container killed at a
# resync is stopped on the books at once, and reported exited by the runtime a moment later).
registry_matches_crictl() {
    local reg run i
    for ((i = 0; i < 20; i++)); do
        reg=$(status registry | jq -r '[.[] | select(.state != "stopped") | .id] | sort | .[]')
        run=$(e2e_crictl ps -q --label gpushare-e2e-gpu=true | sort)
        [[ -n $reg && $reg == "$run" ]] && break
        sleep 0.05
    done
    echo "registry: $(wc -w <<<"$reg") running, crictl: $(wc -w <<<"$run") running"
    if [[ $reg != "$run" ]]; then
        echo "only in the registry: $(comm -23 <(echo "$reg") <(echo "$run") | tr '\n' ' ')"
        echo "only in crictl: $(comm -13 <(echo "$reg") <(echo "$run") | tr '\n' ' ')"
    fi
    [[ -n $reg && $reg == "$run" ]]
}

# Every registry entry still has one GPU, the one its pod name says (…-gN…), its core
# ($T_CORE % for the throttled t-… pods, 10 % for the others) and its memory (1024 MiB for
# the storm's s-… pods, 512 MiB for the others).
quota_intact() {
    local reg bad
    reg=$(status registry) || return 1
    bad=$(jq -r '.[] | (.pod_name | capture("-g(?<g>[0-9]+)").g | tonumber) as $g
        | (if (.pod_name | startswith("s-")) then 1024 else 512 end) as $m
        | (if (.pod_name | startswith("t-")) then $tcore else 10 end) as $c
        | select((.gpus | length) != 1 or .gpus[0].index != $g or .gpus[0].core_percent != $c
                 or .gpus[0].memory_mib != $m)
        | "\(.pod_name) \(.id[0:12]): \(.gpus | tojson)"' --argjson tcore "$T_CORE" <<<"$reg")
    echo "$(jq length <<<"$reg") registry entries; lost their GPU or quota: ${bad:-none}"
    [[ -z $bad ]]
}

# The freezer.state files of the throttled children of every container in the registry
# (FZ_FILES, with the container ids in FZ_IDS).
FZ_FILES=()
FZ_IDS=()
refresh_freezers() {
    local id path
    FZ_FILES=()
    FZ_IDS=()
    while read -r id path; do
        FZ_IDS+=("$id")
        FZ_FILES+=("/sys/fs/cgroup/freezer$path/gpushare-throttled/freezer.state")
    done < <(status registry | jq -r '.[] | "\(.id) \(.cgroups_path)"')
}

# FROZEN_N: how many of FZ_FILES are not THAWED (FROZEN or FREEZING); FROZEN_LIST names them.
# A missing file (no throttled child yet, or the container is gone) counts as thawed.
count_frozen() {
    local i s
    FROZEN_N=0
    FROZEN_LIST=
    for i in "${!FZ_FILES[@]}"; do
        s=THAWED
        if [[ -e ${FZ_FILES[i]} ]]; then { read -r s <"${FZ_FILES[i]}"; } 2>/dev/null || s=THAWED; fi
        if [[ $s != THAWED ]]; then
            FROZEN_N=$((FROZEN_N + 1))
            FROZEN_LIST+=" ${FZ_IDS[i]:0:12}=$s"
        fi
    done
}

# Polls count_frozen until nothing is frozen or DEADLINE_MS (epoch ms) passes; ALL_THAWED_MS is
# when (epoch ms), or empty.
poll_all_thawed() { # DEADLINE_MS
    ALL_THAWED_MS=
    while :; do
        count_frozen
        now_ms
        if ((FROZEN_N == 0)); then
            ALL_THAWED_MS=$NOW_MS
            return 0
        fi
        ((NOW_MS < $1)) || return 1
        sleep 0.01
    done
}

freezer_of() { # CID → its throttled child's freezer.state
    local path
    path=$(status registry | jq -r --arg id "$1" '.[] | select(.id == $id) | .cgroups_path')
    [[ -n $path ]] && echo "/sys/fs/cgroup/freezer$path/gpushare-throttled/freezer.state"
}

wait_frozen() { # FREEZER_STATE_FILE: until it reads FROZEN (up to 5 s)
    local i s
    for ((i = 0; i < 500; i++)); do
        s=
        { read -r s <"$1"; } 2>/dev/null || true
        [[ $s == FROZEN ]] && return 0
        sleep 0.01
    done
    return 1
}

run_pod() { # NAME → "POD_ID CONTAINER_ID"
    local pod ctr
    pod=$(e2e_crictl runp "$E2E_ROOT/$1.pod.json") || return 1
    ctr=$(e2e_crictl create "$pod" "$E2E_ROOT/$1.ctr.json" "$E2E_ROOT/$1.pod.json") || return 1
    e2e_crictl start "$ctr" >/dev/null || return 1
    echo "$pod $ctr"
}

ctr_of() { # POD_NAME → its container id (running or not)
    e2e_crictl ps -a -q --label "gpushare-e2e=$1" | head -1
}

# A busy container that exits on SIGTERM (the usual workload), and one that ignores it.
BURN_TERM="trap 'exit 0' TERM; $E2E_BURN"
BURN_NOTERM="trap '' TERM; $E2E_BURN"

T_START=$SECONDS
echo "=== chaos: containerd 2, seed $SEED ==="
root=$(mktemp -d /tmp/gpushare-chaos.XXXXXX)
e2e_require "containerd 2 starts" e2e_start_containerd 2 "$root"
DRIVER_DIR=$(e2e_gpu_fakes "$REL")
e2e_require "agent registers over $E2E_NRI_SOCK" start_agent

# ------------------------------------------ 1. THROTTLED throttled busy containers ----
# t-gG-K on sim GPU G = K mod 4, each busy at T_CORE % and 512 MiB: 13, 13, 12 and 12 per GPU,
# half of each GPU's time in all (the sim GPUs share this machine's cores).
create_gpu_set() { # GPU: its t-gGPU-K, one after the other
    local k name
    for ((k = $1; k < THROTTLED; k += 4)); do
        name=t-g$1-$k
        run_pod "$name" >"$E2E_ROOT/$name.ids" 2>"$E2E_ROOT/$name.err" || return 1
    done
}
t0=$SECONDS
for ((k = 0; k < THROTTLED; k++)); do
    g=$((k % 4))
    e2e_write_pod "t-g$g-$k" "$(e2e_assignment "$g" 512 "$T_CORE")" 512 "$T_CORE" "$BURN_TERM"
done
pids=()
for g in 0 1 2 3; do
    create_gpu_set "$g" &
    pids+=("$!")
done
set_fail=0
for p in "${pids[@]}"; do wait "$p" || set_fail=1; done
((set_fail == 0)) || cat "$E2E_ROOT"/t-g*.err >&2 || true

throttled_running() {
    local n
    n=$(e2e_crictl ps -o json | jq '[.containers[] | select(.labels["gpushare-e2e"] | startswith("t-"))] | length')
    echo "$n throttled containers running"
    ((n == THROTTLED))
}
e2e_require "$THROTTLED throttled GPU containers (4 sim GPUs, $T_CORE % and 512 MiB each, busy) created and running ($((SECONDS - t0)) s)" throttled_running
e2e_check "registry matches crictl with $THROTTLED GPU containers" registry_matches_crictl
e2e_check "every registry entry has its GPU, 512 MiB and core $T_CORE %" quota_intact

# They really get frozen: at some moment most are (at most one per GPU runs in its window).
max_frozen_at_once() {
    local i best=0 want=$((THROTTLED * 3 / 4))
    refresh_freezers
    for ((i = 0; i < 200; i++)); do
        count_frozen
        if ((FROZEN_N > best)); then best=$FROZEN_N; fi
        if ((best >= want)); then break; fi
        sleep 0.05
    done
    echo "at most $best of ${#FZ_FILES[@]} frozen at once"
    ((best >= want))
}
e2e_check "the throttled containers really get frozen (≥ 3/4 of $THROTTLED at once)" max_frozen_at_once

# ------------------------------------------------ 2. the agent SIGKILLed 10 times ----
SURVIVED=0
LEFT_FROZEN=0
INFLIGHT=0
FROZEN_AT_KILLS=0
INFLIGHT_OUTCOMES=()
KILLED_UNADJUSTED=0

# What a creation cut short by the kill left, one of:
#   - a running container adjusted by the agent (its /dev/nvidiaN) that the registry knows
#     with its GPU and quota;
#   - a container the runtime created while the agent was gone (it skips a plugin that is
#     not there, even mid-creation: no device node, no limiter): the restarted agent killed
#     it at its resync (SIGKILL, exit 137; kubelet would create it again, through the agent),
#     or at its start if it had not started (its start fails: exit 128, StartError);
#   - no container at all.
# A container running without the agent's adjustment fails. The pod is removed afterwards.
creation_outcome() { # NAME POD_ID GPU
    local name=$1 pod=$2 g=$3 ctrs state cid code i ok=1
    ctrs=$(e2e_crictl ps -a -q --pod "$pod")
    if [[ -z $ctrs ]]; then
        OUTCOME="no container"
        echo "$OUTCOME"
        e2e_crictl rmp -f "$pod" >/dev/null
        return 0
    fi
    cid=$(head -1 <<<"$ctrs")
    state=$(e2e_crictl inspect -o go-template --template '{{.status.state}}' "$cid")
    if [[ $state == CONTAINER_RUNNING ]] &&
        ! e2e_crictl exec "$cid" ls /dev 2>/dev/null | grep -qx "nvidia$g"; then
        # The kill at the resync has been sent; the exit takes a moment to be reported.
        for ((i = 0; i < 40; i++)); do
            state=$(e2e_crictl inspect -o go-template --template '{{.status.state}}' "$cid")
            [[ $state == CONTAINER_RUNNING ]] || break
            sleep 0.05
        done
    fi
    OUTCOME="container ${cid:0:12} $state"
    if [[ $state == CONTAINER_RUNNING ]]; then
        if e2e_crictl exec "$cid" ls /dev 2>/dev/null | grep -qx "nvidia$g"; then
            OUTCOME+=" (adjusted by the agent: /dev/nvidia$g)"
            status registry | jq -e --arg id "$cid" 'any(.[]; .id == $id and .state == "running"
                and (.gpus | length) == 1 and .gpus[0].core_percent == 10 and .gpus[0].memory_mib == 512)' >/dev/null || ok=0
        else
            OUTCOME+=" (running without the agent's adjustment: no /dev/nvidia$g)"
            ok=0
        fi
    elif [[ $state == CONTAINER_EXITED ]]; then
        code=$(e2e_crictl inspect -o go-template --template '{{.status.exitCode}}' "$cid")
        if [[ $code == 137 ]] && grep "created without this agent's adjustment: killed" "$E2E_ROOT/agent.log" | grep -q "$cid"; then
            OUTCOME+=" (created while the agent was gone: killed at the resync, exit 137)"
            KILLED_UNADJUSTED=$((KILLED_UNADJUSTED + 1))
        elif [[ $code == 128 ]] && grep "created without this agent's adjustment: killed" "$E2E_ROOT/agent.log" | grep -q "$cid"; then
            # Not started at the resync: killed at its start, which then fails (StartError).
            OUTCOME+=" (created while the agent was gone: killed at its start, exit 128)"
            KILLED_UNADJUSTED=$((KILLED_UNADJUSTED + 1))
        else
            OUTCOME+=" (exit $code, not killed by the agent)"
            ok=0
        fi
    else
        ok=0
    fi
    echo "$OUTCOME; registry: $(status registry | jq -c --arg id "$cid" '.[] | select(.id == $id) | {state, gpus}')"
    if [[ $state != CONTAINER_RUNNING ]]; then e2e_crictl rmp -f "$pod" >/dev/null; fi
    [[ $(wc -l <<<"$ctrs") -eq 1 ]] && ((ok == 1))
}

none_frozen() { # after count_frozen
    echo "frozen:${FROZEN_LIST:- none}"
    ((FROZEN_N == 0))
}

for ((k = 1; k <= KILLS; k++)); do
    failed0=$E2E_FAILED
    refresh_freezers
    delay=$((RANDOM % 1501))
    ms_sleep "$delay"
    job='' inflight='' name='' pod=''
    # Even kills, and the second half's while fewer than 2 hit a creation, start one first.
    if ((k % 2 == 0 || (k > KILLS / 2 && INFLIGHT < 2))); then
        g=$((k % 4))
        name=k$k-g$g
        e2e_write_pod "$name" "$(e2e_assignment "$g" 512 10)" 512 10
        pod=$(e2e_crictl runp "$E2E_ROOT/$name.pod.json")
        now_ms
        c0=$NOW_MS
        (
            rc=0
            cid=$(e2e_crictl create "$pod" "$E2E_ROOT/$name.ctr.json" "$E2E_ROOT/$name.pod.json") &&
                e2e_crictl start "$cid" || rc=$?
            now_ms
            echo "$NOW_MS"
            exit "$rc"
        ) >"$E2E_ROOT/$name.create.log" 2>&1 &
        job=$!
        ms_sleep $((RANDOM % 400)) # create + start take 0.5-1 s here
    fi
    if [[ -n $job ]] && _e2e_alive "$job"; then inflight=1; fi
    count_frozen
    n0=$FROZEN_N
    FROZEN_AT_KILLS=$((FROZEN_AT_KILLS + n0))
    kill -9 "$AGENT_PID" 2>/dev/null || echo "kill $k: the agent was already gone" >&2
    now_ms
    t_kill=$NOW_MS
    wait "$AGENT_PID" 2>/dev/null || true
    AGENT_PID=
    poll_all_thawed $((t_kill + 1000)) || true
    thaw_ms=${ALL_THAWED_MS:+$((ALL_THAWED_MS - t_kill)) ms}
    now_ms
    ((NOW_MS >= t_kill + 1000)) || ms_sleep $((t_kill + 1000 - NOW_MS))
    count_frozen
    n1=$FROZEN_N
    LEFT_FROZEN=$((LEFT_FROZEN + n1))
    what="kill $k/$KILLS (${delay} ms after healthy${inflight:+, during a creation})"
    e2e_check "$what: 1 s later no container is frozen ($n1 of ${#FZ_FILES[@]} frozen, $n0 at the kill; all thawed after ${thaw_ms:-more than 1 s})" \
        none_frozen
    if [[ -n $job ]]; then
        rc=0
        wait "$job" || rc=$?
        c1=$(tail -1 "$E2E_ROOT/$name.create.log")
        [[ $c1 =~ ^[0-9]+$ ]] || c1=$c0
        echo "    creation ${name}: exit $rc after $((c1 - c0)) ms, killed at $((t_kill - c0)) ms${inflight:+ (in flight)}: $(tail -2 "$E2E_ROOT/$name.create.log" | head -1)"
        if [[ -n $inflight ]]; then INFLIGHT=$((INFLIGHT + 1)); fi
    fi
    e2e_require "$what: agent restarted and healthy" start_agent
    e2e_check "$what: registry matches crictl's GPU containers" registry_matches_crictl
    e2e_check "$what: every registry entry keeps its GPU, memory and core 10 %" quota_intact
    if [[ -n $job ]]; then
        OUTCOME='?'
        e2e_check "$what: the creation left a running registered container with its quota, or none" \
            creation_outcome "$name" "$pod" "$g"
        INFLIGHT_OUTCOMES+=("$name${inflight:+ (in flight)}: $OUTCOME")
    fi
    if ((E2E_FAILED == failed0)); then SURVIVED=$((SURVIVED + 1)); fi
done
e2e_check "at least 2 of the kills hit a container creation in flight ($INFLIGHT)" test "$INFLIGHT" -ge 2
e2e_check "the kills found containers frozen, for the guardian to thaw ($FROZEN_AT_KILLS over $KILLS kills)" \
    test "$FROZEN_AT_KILLS" -ge "$KILLS"
echo "FIGURES kills survived: $SURVIVED/$KILLS, containers left frozen: $LEFT_FROZEN (frozen at the kills: $FROZEN_AT_KILLS)"
printf '    creation cut short: %s\n' "${INFLIGHT_OUTCOMES[@]}"
echo "FIGURES creations cut short: $INFLIGHT in flight at the kill; $KILLED_UNADJUSTED created without the agent and killed at the resync"

# ------------------------------------------ 3. the agent and its guardian SIGKILLed ----
refresh_freezers
# The agent restarted by the last kill may not have frozen anything yet (its first periods
# after a start): wait for the controller to hold some frozen, so that what is left frozen
# below is what the dead pair left, not what nobody had frozen.
some_frozen() { # DEADLINE_MS
    while :; do
        count_frozen
        now_ms
        ((FROZEN_N == 0)) || return 0
        ((NOW_MS < $1)) || return 1
        sleep 0.02
    done
}
now_ms
t_wait=$NOW_MS
some_frozen $((t_wait + 10000)) || true
now_ms
e2e_check "before the kill the controller holds containers frozen ($FROZEN_N of ${#FZ_FILES[@]}, $((NOW_MS - t_wait)) ms waited, $((NOW_MS - AGENT_T0)) ms after the agent started)" \
    test "$FROZEN_N" -gt 0
gpid=$(pgrep -P "$AGENT_PID" -f 'gpushare guardian' | head -1 || true)
e2e_check "the agent's guardian runs beside it (pid ${gpid:-none})" test -n "$gpid"
regs_thaw=$(grep -c 'thawed cgroups an earlier agent left frozen' "$E2E_ROOT/agent.log" || true)
regs_respawn=$(grep -c 'starting it again' "$E2E_ROOT/agent.log" || true)
# The guardian first: killed second, it could still thaw on the agent's death. The agent is
# stopped before: its controller starts a dead guardian again, and a new one started between
# the two kills (this shell preempted by the busy containers) would thaw everything.
{
    kill -STOP "$AGENT_PID"
    kill -9 ${gpid:+"$gpid"}
    kill -9 "$AGENT_PID"
    wait "$AGENT_PID" || true
    sleep 0.5
} 2>/dev/null
e2e_check "the killed agent started no guardian again (restarts logged: $regs_respawn before, $(grep -c 'starting it again' "$E2E_ROOT/agent.log" || true) after)" \
    test "$(grep -c 'starting it again' "$E2E_ROOT/agent.log" || true)" -eq "$regs_respawn"
AGENT_PID=
count_frozen
n_left=$FROZEN_N
echo "FIGURES guardian killed with the agent: $n_left of ${#FZ_FILES[@]} containers left frozen"
e2e_check "with the guardian killed too, containers stay frozen ($n_left of ${#FZ_FILES[@]})" test "$n_left" -gt 0
launch_agent
poll_all_thawed $((AGENT_T0 + 2000)) || true
start_thaw_ms=${ALL_THAWED_MS:+$((ALL_THAWED_MS - AGENT_T0))}
e2e_check "the next agent start thaws everything at once: nothing frozen ${start_thaw_ms:-(still $FROZEN_N frozen at 2 s)} ms after it started" \
    test -n "$start_thaw_ms"
e2e_require "the agent restarted after losing its guardian is healthy" wait_healthy
thawed_logged() {
    local line
    line=$(grep 'thawed cgroups an earlier agent left frozen' "$E2E_ROOT/agent.log" | tail -n +$((regs_thaw + 1)) | tail -1)
    echo "log: ${line:-nothing}"
    [[ $line =~ thawed=([0-9]+) ]] && ((BASH_REMATCH[1] >= n_left))
}
e2e_check "the agent logs that it thawed what the dead pair left frozen" thawed_logged
e2e_check "… and its registry matches crictl" registry_matches_crictl

# -------------------------------------------------------- 4. containerd restarted ----
regs0=$(grep -c 'registered with the runtime' "$E2E_ROOT/agent.log" || true)
npods=$(e2e_crictl pods -q | wc -l)
now_ms
down=$NOW_MS
e2e_require "containerd restarted with $npods pods running" e2e_restart_containerd
now_ms
back=$NOW_MS
reregistered() {
    local regs
    regs=$(grep -c 'registered with the runtime' "$E2E_ROOT/agent.log" || true)
    ((regs > regs0)) && status healthz >/dev/null 2>&1 && registry_matches_crictl >/dev/null 2>&1
}
rereg_ms=
for ((i = 0; i < 400; i++)); do
    if reregistered; then
        now_ms
        rereg_ms=$((NOW_MS - back))
        break
    fi
    sleep 0.05
done
echo "FIGURES containerd restart took $((back - down)) ms; re-registered with a matching registry ${rereg_ms:-(not within 20 s)} ms after containerd was back"
e2e_check "after the containerd restart the agent re-registers and the registry matches crictl within 2 s (${rereg_ms:-> 20000} ms)" \
    test -n "$rereg_ms" -a "${rereg_ms:-99999}" -le 2000
e2e_check "… registry matches crictl" registry_matches_crictl

# A busy 10 % container that ignores SIGTERM, for step 6 (created now, while there is room).
e2e_write_pod ign-g3 "$(e2e_assignment 3 512 10)" 512 10 "$BURN_NOTERM"
e2e_check "a 10 % busy container ignoring SIGTERM starts" run_pod ign-g3

# ------------------------------------- 5. STORM concurrent GPU container creations ----
# The pods' sandboxes first (25 at a time: RunPodSandbox does not reach the plugin), then every
# pod's GPU container created and started at once — STORM CreateContainer calls through the
# plugin together, asking far more than is left.
storm_sandbox() { # NAME [DEADLINE] → NAME.sandbox: the pod id, or the error
    # Sandbox latency is not what this step measures, and 25 RunPodSandbox calls at once on
    # 2 vCPUs can queue past crictl's 20 s default (one CI run saw 24 of 200 miss it): the same
    # 120 s deadline as the creations below.
    E2E_CRICTL_TIMEOUT=${2:-120s} e2e_crictl runp "$E2E_ROOT/$1.pod.json" >"$E2E_ROOT/$1.sandbox" 2>&1 ||
        echo "runp failed" >>"$E2E_ROOT/$1.sandbox"
}
storm_one() { # NAME: create + start in its sandbox; prints created | refused | error, then the message
    local name=$1 pod out cid
    pod=$(head -1 "$E2E_ROOT/$name.sandbox")
    # crictl's own deadline (20 s elsewhere) is not what this measures: with 200 creations at
    # once on 2 vCPUs containerd queues them for longer than that before it reaches NRI (its
    # CreateContainer calls one plugin request at a time). The NRI deadline (2 s per request,
    # containerd drops a plugin that misses it) is checked below, from containerd's log.
    if ! out=$(E2E_CRICTL_TIMEOUT=120s e2e_crictl create "$pod" "$E2E_ROOT/$name.ctr.json" "$E2E_ROOT/$name.pod.json" 2>&1); then
        if grep -q 'would be over-committed' <<<"$out"; then
            printf 'refused\n%s\n' "$out"
        else
            printf 'error\ncreate: %s\n' "$out"
        fi
        return
    fi
    cid=$out
    if ! out=$(e2e_crictl start "$cid" 2>&1); then
        printf 'error\nstart: %s\n' "$out"
        return
    fi
    printf 'created\n%s\n' "$cid"
}
regs_storm=$(grep -c 'registered with the runtime' "$E2E_ROOT/agent.log" || true)
used_core=$(status registry | jq '[.[] | select(.state != "stopped") | .gpus[].core_percent] | add')
for ((i = 0; i < STORM; i++)); do
    e2e_write_pod "s-g$((i % 4))-$i" "$(e2e_assignment $((i % 4)) 1024 10)" 1024 10
done
now_ms
s0=$NOW_MS
for ((i = 0; i < STORM; i += 25)); do
    pids=()
    for ((j = i; j < i + 25 && j < STORM; j++)); do
        # E2E_STORM_RUNP_DEADLINE: the first pass's deadline (a short one exercises the
        # recovery below, which always allows 120 s).
        storm_sandbox "s-g$((j % 4))-$j" "${E2E_STORM_RUNP_DEADLINE:-120s}" &
        pids+=("$!")
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
done
now_ms
sandbox_s=$(((NOW_MS - s0) / 100))
# A runp that missed crictl's deadline may still finish inside containerd (the sandbox's name
# stays reserved until it does): wait up to 120 s for those to turn ready, then create the
# rest again, removing any half-made one first. Sandboxes are this step's setup, not what it
# measures (RunPodSandbox does not reach the plugin); how many needed this is printed. One CI
# run on a 2-vCPU VM took 362 s for the 200 and left 24 past the deadline; another, 53 s.
storm_missing() { # the storm pods whose sandbox is not (yet) there
    local f
    for f in "$E2E_ROOT"/s-g*.sandbox; do
        if grep -q 'runp failed' "$f" 2>/dev/null; then basename "$f" .sandbox; fi
    done
}
storm_ready_id() { # NAME → the id of its Ready sandbox, if any
    e2e_crictl pods -q --state ready --label "io.kubernetes.pod.name=$1" 2>/dev/null | head -1 || true
}
missed=$(storm_missing | wc -l)
if ((missed > 0)); then
    for ((t = 0; t < 60; t++)); do
        for name in $(storm_missing); do
            id=$(storm_ready_id "$name")
            if [[ -n $id ]]; then echo "$id" >"$E2E_ROOT/$name.sandbox"; fi
        done
        if [[ -z $(storm_missing) ]]; then break; fi
        sleep 2
    done
    pids=()
    for name in $(storm_missing); do
        while read -r id; do
            e2e_crictl rmp -f "$id" >/dev/null 2>&1 || true
        done < <(e2e_crictl pods -q --label "io.kubernetes.pod.name=$name" 2>/dev/null || true)
        storm_sandbox "$name" &
        pids+=("$!")
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
fi
sandboxes_ok() {
    local missing bad first
    missing=$(storm_missing)
    bad=$(grep -c . <<<"$missing" || true)
    echo "$((STORM - bad)) of $STORM sandboxes in $((sandbox_s / 10)).$((sandbox_s % 10)) s"
    first=$(head -1 <<<"$missing")
    [[ -z $first ]] || echo "first failure ($first): $(head -c 600 "$E2E_ROOT/$first.sandbox")"
    ((bad == 0))
}
e2e_require "storm: $STORM pod sandboxes ready" sandboxes_ok
echo "FIGURES storm: $(sandboxes_ok | head -1) (25 at a time; crictl's deadline 120 s each; $missed past it, waited for or created again)"
now_ms
s0=$NOW_MS
pids=()
for ((i = 0; i < STORM; i++)); do
    storm_one "s-g$((i % 4))-$i" >"$E2E_ROOT/s-$i.storm" 2>&1 &
    pids+=("$!")
done
for p in "${pids[@]}"; do wait "$p" || true; done
now_ms
storm_s=$(((NOW_MS - s0) / 100))
created=0 refused=0 errors=0 timeouts=0
for ((i = 0; i < STORM; i++)); do
    case $(head -1 "$E2E_ROOT/s-$i.storm") in
    created) created=$((created + 1)) ;;
    refused) refused=$((refused + 1)) ;;
    *) errors=$((errors + 1)) ;;
    esac
    if tail -n +2 "$E2E_ROOT/s-$i.storm" | grep -qiE 'timeout|deadline'; then timeouts=$((timeouts + 1)); fi
done
echo "FIGURES storm: $STORM concurrent creations (asking $((STORM * 10)) % on top of ${used_core} % held of 400 %) in $((storm_s / 10)).$((storm_s % 10)) s: created $created, refused $refused, other errors $errors"
show_storm() { # PATTERN: the messages of the creations whose result (line 1) matches
    local f
    for f in "$E2E_ROOT"/s-*.storm; do
        if head -1 "$f" | grep -qE "$1"; then echo "${f##*/}: $(tail -n +2 "$f" | tr '\n' ' ')"; fi
    done
}
no_storm_timeouts() {
    local f
    for f in "$E2E_ROOT"/s-*.storm; do
        if tail -n +2 "$f" | grep -qiE 'timeout|deadline'; then echo "${f##*/}: $(tail -n +2 "$f" | tr '\n' ' ')"; fi
    done
    ((timeouts == 0))
}
e2e_check "storm: no NRI timeout (no crictl error mentions timeout/deadline: $timeouts)" no_storm_timeouts
nri_timeouts_logged() {
    local lines
    lines=$(grep -E 'level=(error|warning)' "$E2E_ROOT/containerd.log" | grep -iE 'nri|plugin' |
        grep -iE 'timeout|deadline|timed out' || true)
    echo "${lines:-none}" | tail -5
    [[ -z $lines ]]
}
e2e_check "storm: containerd logged no NRI plugin timeout" nri_timeouts_logged
stayed_registered() {
    local regs
    regs=$(grep -c 'registered with the runtime' "$E2E_ROOT/agent.log" || true)
    echo "registrations: $regs_storm before the storm, $regs after"
    ((regs == regs_storm)) && status healthz >/dev/null
}
e2e_check "storm: the agent stayed connected (containerd did not drop the plugin)" stayed_registered
all_ran_or_refused() {
    show_storm '^error'
    ((created + refused == STORM))
}
e2e_check "storm: every creation ran or was refused for capacity ($created + $refused of $STORM)" all_ran_or_refused
e2e_check "storm: some creations refused (the ask exceeds capacity: $refused)" test "$refused" -gt 0
per_gpu() {
    local sums over
    sums=$(status registry | jq -r '[.[] | select(.state != "stopped") | .gpus[]] | group_by(.index)
        | .[] | "\(.[0].index) \(map(.core_percent // 0) | add) \(map(.memory_mib) | add) \(length)"')
    over=0
    while read -r g c m n; do
        echo "GPU $g: $n containers, core $c %, memory $m MiB"
        ((c <= 100 && m <= GPU_MIB)) || over=$((over + 1))
    done <<<"$sums"
    echo "$over over-committed GPUs"
    ((over == 0))
}
per_gpu | sed 's/^/    /' || true
e2e_check "storm: per GPU the registry's core ≤ 100 % and memory ≤ $GPU_MIB MiB (0 over-committed)" per_gpu
e2e_check "storm: registry matches crictl" registry_matches_crictl

# ---------------------------------------------------- 6. stopping frozen containers ----
stop_frozen() { # CID WANT_EXIT: stop it while frozen (--timeout 10); STOP_MS is how long it took
    local cid=$1 f code
    STOP_MS=
    f=$(freezer_of "$cid") || { echo "not in the registry"; return 1; }
    wait_frozen "$f" || { echo "never seen frozen"; return 1; }
    now_ms
    local t=$NOW_MS
    e2e_crictl stop --timeout 10 "$cid" >/dev/null || { echo "crictl stop failed"; return 1; }
    now_ms
    STOP_MS=$((NOW_MS - t))
    code=$(e2e_crictl inspect -o go-template --template '{{.status.exitCode}}' "$cid")
    echo "stopped in $STOP_MS ms, exit code $code (want $2)"
    ((STOP_MS <= 11000)) && [[ $code == "$2" ]]
}
cid_term=$(ctr_of t-g1-1)
e2e_check "a frozen busy container ($T_CORE %) stops on SIGTERM within 11 s (crictl stop --timeout 10)" \
    stop_frozen "$cid_term" 0
stop_term_ms=${STOP_MS:-?}
cid_ign=$(ctr_of ign-g3)
e2e_check "a frozen container ignoring SIGTERM is SIGKILLed at the grace deadline, stop returns within 11 s" \
    stop_frozen "$cid_ign" 137
stop_ign_ms=${STOP_MS:-?}
echo "FIGURES stop times: SIGTERM handled $stop_term_ms ms, SIGTERM ignored $stop_ign_ms ms"
waited_grace() { [[ $stop_ign_ms =~ ^[0-9]+$ ]] && ((stop_ign_ms >= 9000)); }
e2e_check "the ignoring container waited out the grace period (≥ 9 s: $stop_ign_ms ms)" waited_grace

echo "=== figures (seed $SEED, $((SECONDS - T_START)) s) ==="
echo "kills survived: $SURVIVED/$KILLS, containers left frozen: $LEFT_FROZEN"
echo "guardian killed with the agent: $n_left left frozen, all thawed ${start_thaw_ms:-?} ms after the next start"
echo "re-register after containerd restart: ${rereg_ms:-?} ms (restart took $((back - down)) ms)"
echo "storm: $STORM concurrent creations: created $created, refused $refused, errors $errors"
echo "creations cut short by a kill: $INFLIGHT; created without the agent and killed at the resync: $KILLED_UNADJUSTED"
echo "stop: SIGTERM handled $stop_term_ms ms, SIGTERM ignored $stop_ign_ms ms"
e2e_summary
