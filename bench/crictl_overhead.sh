#!/usr/bin/env bash
# What the gpushare plugin adds to container creation on a real runtime: `crictl create` +
# `crictl start` wall time with and without `gpushare node` connected to containerd 2.x,
# in the same run. Prints numbers; never gates anything. Needs root (like tests/e2e).
#
# Usage: bench/crictl_overhead.sh [ROUNDS] [PODS_PER_ROUND]     (default: 10 10)
#   GPUSHARE_BIN           agent binary (default target/release/gpushare; cargo build --release)
#   GPUSHARE_BENCH_PORT    agent status port (default 19403)
#   GPUSHARE_BENCH_RAW     if set, a file to which the raw samples are written
#   GPUSHARE_BENCH_AGENT_ARGS  extra `gpushare node` arguments (word-split), e.g. --no-throttle
#   GPUSHARE_BENCH_SPECS   if set, a directory to which the checked (untimed) pods' OCI specs
#                          are written, as runc got them
#   GPUSHARE_BENCH_TMPFS   0 to keep containerd's root on the disk under /tmp (default: tmpfs)
#   GPUSHARE_BENCH_POD     gpu (default) or plain: a pod without GPU annotations, which the
#                          plugin passes through (isolates what NRI itself costs)
#   GPUSHARE_BENCH_PATH    nri (default) or wrapper: instead of the NRI plugin on containerd
#                          2.x, the runtime wrapper on Debian's containerd 1.6 — "with" is a
#                          pod of the runtime handler `gpushare` (runc = gpushare-runtime),
#                          "without" one of the plain runc handler, the agent serving the
#                          wrapper throughout.
#   GPUSHARE_BENCH_ORDER   pairs (default) or rounds. pairs: the two modes alternate pod by
#                          pod (ABBA within each round), and the estimate is paired: each
#                          "with" pod against its neighbour "without", so the host's drift,
#                          which on a shared VM is larger than the effect, cancels pair by pair
#                          (bench/paired_stats.py: mean difference with a bootstrap 95 %
#                          interval). On the NRI path that needs two containerd 2.x instances,
#                          A and B, side by side: the agent serves A in the first half of the
#                          rounds and B in the second (crossover), "with" pods go to the
#                          instance it serves and "without" pods to the other, so a difference
#                          between the instances cancels too. rounds: the earlier design below
#                          (one instance, the agent started and killed round by round).
#   GPUSHARE_BENCH_BASELINE  plain (default) or adjusted (GPU pods; on the NRI path in the
#                          paired order): the "without" pod's container config carries,
#                          through CRI, what the wrapper or the plugin adds to the "with" pod's
#                          container (device nodes, env, the limiter's mounts, the CPU pin of
#                          the sim GPU: copied from a probe container each time the agent
#                          starts serving), so the difference is the wrapper or the plugin
#                          itself, not the adjustment that every GPU container pays
#
# Design (for a fair comparison):
#   * One containerd 2.x instance (tests/e2e/lib.sh), one pod and container config for both
#     modes: a host-network GPU pod with the device plugin's assignment annotation and the
#     granted-mem/-core container annotations. Without the plugin containerd just carries
#     the annotations; with it, the plugin admits the container and adjusts it.
#   * (GPUSHARE_BENCH_ORDER=rounds) ROUNDS rounds; each round measures both modes, in ABBA order (even rounds: without,
#     then with; odd rounds: with, then without), so slow drift of the host or of containerd
#     weighs on both modes alike. The mode is switched by starting the agent (waiting until
#     it is registered) or killing it (kill -9, as in tests/e2e/run.sh).
#   * After each switch one untimed warm-up pod checks the mode really is in effect: its
#     container's OCI spec has GPUSHARE_GPU_MEMORY_MIB with the plugin and not without.
#   * Per pod: `crictl runp` (not timed), then `crictl create` + `crictl start` of the
#     container (timed, separately and together), then `crictl rmp -f` (not timed).
#   * Times are wall-clock around the crictl processes, so they include crictl's own start
#     (the same in both modes). The agent logs at info to a file, as deployed, and keeps its
#     state (sim declaration directories, guardian list) under the instance's root.
#   * containerd's root lives on a tmpfs: the e2e setup uses the native snapshotter, which
#     copies the image for every container; on a (shared, throttled) disk that copy makes
#     create times swing between ~40 and ~300 ms in long stretches, far above the plugin's
#     share. On tmpfs the copy is cheap, closer to what overlayfs costs on a real node.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=tests/e2e/lib.sh
source "$repo/tests/e2e/lib.sh"

BIN=$E2E_BIN WRAPPER_BIN=$E2E_WRAPPER_BIN
[[ -x $BIN ]] || { echo "bench: $BIN not built (cargo build --release)" >&2; exit 1; }
ROUNDS=${1:-10}
PODS=${2:-10}
PORT=${GPUSHARE_BENCH_PORT:-19403}
read -r -a AGENT_ARGS <<<"${GPUSHARE_BENCH_AGENT_ARGS:-}"
AGENT_PID=
TMPFS=

cleanup() {
    [[ -z $AGENT_PID ]] || kill -9 "$AGENT_PID" 2>/dev/null || true
    local inst
    for inst in "${!INSTANCES[@]}"; do
        use_instance "$inst"
        e2e_stop_containerd || true
    done
    e2e_stop_containerd || true
    if [[ -n $TMPFS ]]; then
        umount "$TMPFS" 2>/dev/null || umount -l "$TMPFS" 2>/dev/null || true
        rmdir "$TMPFS" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# Two containerd instances in one shell (the NRI path's paired order): lib.sh keeps one
# instance's settings in these variables; save_instance NAME keeps them, use_instance NAME
# brings them back.
INSTANCE_VARS=(E2E_ROOT E2E_CONTAINERD_VERSION E2E_CONTAINERD_DIR E2E_CONTAINERD_SOCK E2E_NRI_SOCK
    E2E_NRI_PLUGIN_DIR E2E_NRI_CONF_DIR E2E_CONTAINERD_PID E2E_CONTAINERD_LOG E2E_LOG_DIR E2E_CGROUP_BASE)
declare -A INSTANCES=()
save_instance() {
    local v saved=
    for v in "${INSTANCE_VARS[@]}"; do saved+="export $v=$(printf '%q' "${!v:-}");"; done
    INSTANCES[$1]=$saved
}
use_instance() { eval "${INSTANCES[$1]}"; }

now_us() { local t=${EPOCHREALTIME//[!0-9]/}; echo "$((10#$t))"; }

BENCH_PATH=${GPUSHARE_BENCH_PATH:-nri}
case $BENCH_PATH in
nri) LINK=() ;;
wrapper) LINK=(--runtime gpushare) ;;
*) echo "bench: GPUSHARE_BENCH_PATH must be nri or wrapper" >&2; exit 2 ;;
esac

start_agent() {
    local link=(--nri-socket "$E2E_NRI_SOCK")
    [[ $BENCH_PATH == nri ]] ||
        link=(--no-nri --runtime-socket "$E2E_ROOT/runtime.sock" --runc-root "$E2E_ROOT/runc/k8s.io")
    "$BIN" node "${link[@]}" --gpu-backend sim --dev-root "$E2E_ROOT/simdev" \
        --node-name bench-node --status-listen "127.0.0.1:$PORT" --status-socket "$E2E_ROOT/status.sock" \
        --log-file "$E2E_ROOT/agent.log" --state-dir "$E2E_ROOT/agent-state" \
        --limiter-library "$(dirname "$BIN")/libgpushare_limiter.so" "${AGENT_ARGS[@]}" &
    AGENT_PID=$!
    local i
    for ((i = 0; i < 100; i++)); do
        curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "bench: agent not registered after 10 s; log tail:" >&2
    tail -20 "$E2E_ROOT/agent.log" >&2 || true
    return 1
}

kill_agent() {
    kill -9 "$AGENT_PID" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
    AGENT_PID=
    sleep 0.5 # let containerd notice the closed plugin connection
}

# The same pod config in both modes; by default a GPU pod (GPU 1, 2 GiB, 30% of its compute).
POD_KIND=${GPUSHARE_BENCH_POD:-gpu}
case $POD_KIND in
gpu)
    POD_ANN='{"gpushare.io/assignment":"{\"version\":1,\"containers\":{\"main\":[{\"gpuIndex\":1,\"memoryMiB\":2048,\"corePercent\":30}]}}"}'
    CTR_ANN='{"gpushare.io/granted-mem":"2","gpushare.io/granted-core":"30"}'
    ;;
plain) POD_ANN='{}' CTR_ANN='{}' ;;
*) echo "bench: GPUSHARE_BENCH_POD must be gpu or plain" >&2; exit 2 ;;
esac

BASELINE=${GPUSHARE_BENCH_BASELINE:-plain}
case $BASELINE in
plain) ;;
adjusted)
    [[ $POD_KIND == gpu && ($BENCH_PATH == wrapper || ${GPUSHARE_BENCH_ORDER:-pairs} == pairs) ]] || {
        echo "bench: GPUSHARE_BENCH_BASELINE=adjusted needs GPU pods, and on the NRI path the paired order" >&2
        exit 2
    }
    ;;
*) echo "bench: GPUSHARE_BENCH_BASELINE must be plain or adjusted" >&2; exit 2 ;;
esac
ORDER=${GPUSHARE_BENCH_ORDER:-pairs}
case $ORDER in
pairs | rounds) ;;
*) echo "bench: GPUSHARE_BENCH_ORDER must be pairs or rounds" >&2; exit 2 ;;
esac
OFF_EXTRA='{}' # the "without" container's extra CRI config (adjusted baseline)

# bundle_spec CTR: the OCI spec runc got for container CTR (after the wrapper, if any).
bundle_spec() { cat "$E2E_ROOT/state/io.containerd.runtime.v2.task/k8s.io/$1/config.json"; }

# adjusted_baseline: runs one container through the wrapper (or on the instance the plugin
# serves) and one through plain runc (or on the other instance), and sets OFF_EXTRA to the CRI
# container config that gives the plain one what the wrapper or plugin added: its devices
# (host nodes of the sim backend), env, mounts (sources copied, since the agent removes them
# with the container) and CPU pin.
adjusted_baseline() {
    local mode pod ctr spec_on spec_off on_root dir=$top/baseline-${ON_INST:-wrapper}
    for mode in on off; do
        if [[ $BENCH_PATH == nri ]]; then
            if [[ $mode == on ]]; then use_instance "$ON_INST"; else use_instance "$OFF_INST"; fi
        fi
        [[ $mode == off ]] || on_root=$E2E_ROOT
        e2e_pod_json "probe-$mode" "uid-probe-$mode" "$POD_ANN" >"$E2E_ROOT/pod.json"
        e2e_ctr_json main "$CTR_ANN" >"$E2E_ROOT/ctr.json"
        local handler=()
        [[ $mode == off ]] || handler=("${LINK[@]}")
        pod=$(e2e_crictl runp "${handler[@]}" "$E2E_ROOT/pod.json")
        ctr=$(e2e_crictl create "$pod" "$E2E_ROOT/ctr.json" "$E2E_ROOT/pod.json")
        e2e_crictl start "$ctr" >/dev/null
        if [[ $mode == on ]]; then spec_on=$(bundle_spec "$ctr"); else spec_off=$(bundle_spec "$ctr"); fi
        [[ $mode == off ]] || {
            mkdir -p "$dir"
            # The added mounts' sources, copied while the container holds them.
            jq -r --arg state "$E2E_ROOT/agent-state" '.mounts[] | select(.source | startswith($state)) | .source' \
                <<<"$spec_on" | while read -r src; do
                mkdir -p "$dir$(dirname "$src")" && cp -a "$src" "$dir$src"
            done
        }
        e2e_crictl rmp -f "$pod" >/dev/null
    done
    OFF_EXTRA=$(jq -c --argjson off "$spec_off" --arg dir "$dir" --arg state "$on_root/agent-state" --arg dev "$on_root/simdev" '
        . as $on
        | ([$off.mounts[].destination]) as $offm
        | ($off.process.env) as $offe
        | {
            envs: [$on.process.env[] | select(. as $e | $offe | index($e) | not)
                   | capture("^(?<key>[^=]*)=(?<value>.*)$")],
            devices: [($on.linux.devices // [])[] | select(. as $d | ($off.linux.devices // []) | index($d) | not)
                      | {container_path: .path, host_path: ($dev + "/" + (.path | ltrimstr("/dev/"))), permissions: "rwm"}],
            mounts: [$on.mounts[] | select(.destination as $d | $offm | index($d) | not)
                     | {container_path: .destination,
                        host_path: (if (.source | startswith($state)) then $dir + .source else .source end),
                        readonly: (.options | index("ro") != null)}],
            linux: {resources: {cpuset_cpus: ($on.linux.resources.cpu.cpus // "")}}
          }' <<<"$spec_on")
    echo "bench: adjusted baseline: $(jq -c '{envs: (.envs | length), devices: (.devices | length), mounts: (.mounts | length), cpuset: .linux.resources.cpuset_cpus}' <<<"$OFF_EXTRA")" >&2
}

# one_pod NAME MODE [CHECK]: runp, then timed create + start, then rmp -f. Prints
# "CREATE_US START_US". CHECK (yes) verifies the plugin's env is in the container's
# environment in MODE on and not in MODE off (for plain pods: never in it).
one_pod() {
    local name=$1 mode=$2 check=${3:-} pod ctr t0 t1 t2 has
    # The NRI path's paired order: "with" pods go to the instance the agent serves.
    if [[ $BENCH_PATH == nri && $ORDER == pairs ]]; then
        if [[ $mode == on ]]; then use_instance "$ON_INST"; else use_instance "$OFF_INST"; fi
    fi
    e2e_pod_json "$name" "uid-$name" "$POD_ANN" >"$E2E_ROOT/pod.json"
    if [[ $mode == off ]]; then
        e2e_ctr_json main "$CTR_ANN" "$OFF_EXTRA" >"$E2E_ROOT/ctr.json"
    else
        e2e_ctr_json main "$CTR_ANN" >"$E2E_ROOT/ctr.json"
    fi
    local handler=()
    # The wrapper path: "with" is the gpushare handler's pod.
    [[ $BENCH_PATH == nri || $mode == off ]] || handler=("${LINK[@]}")
    pod=$(e2e_crictl runp "${handler[@]}" "$E2E_ROOT/pod.json")
    t0=$(now_us)
    ctr=$(e2e_crictl create "$pod" "$E2E_ROOT/ctr.json" "$E2E_ROOT/pod.json")
    t1=$(now_us)
    e2e_crictl start "$ctr" >/dev/null
    t2=$(now_us)
    if [[ -n $check ]]; then
        # The checked pods' OCI specs, as runc got them, for comparing the two modes.
        [[ -z ${GPUSHARE_BENCH_SPECS:-} ]] || bundle_spec "$ctr" >"$GPUSHARE_BENCH_SPECS/$name.json"
        [[ $POD_KIND == gpu ]] || mode=off
        # The adjusted baseline's "without" container has the env too, given by CRI; that it
        # did not pass through the wrapper is checked by the runtime's pod handler.
        if [[ $OFF_EXTRA != '{}' && $mode == off ]]; then
            if [[ $(e2e_crictl inspectp -o go-template --template '{{.status.runtimeHandler}}' "$pod") == gpushare ]]; then
                echo "bench: mode off, but $name runs under the gpushare handler" >&2
                return 1
            fi
            mode=on
        fi
        has=off
        # The main process's environment, read on the host (the wrapper adjusts the
        # bundle, not the spec containerd stores).
        if tr '\0' '\n' <"/proc/$(e2e_crictl inspect -o go-template --template '{{.info.pid}}' "$ctr")/environ" |
            grep -q '^GPUSHARE_GPU_MEMORY_MIB='; then
            has=on
        fi
        if [[ $has != "$mode" ]]; then
            echo "bench: mode $mode, but the plugin's env is $has in $name's environment" >&2
            return 1
        fi
    fi
    e2e_crictl rmp -f "$pod" >/dev/null
    echo "$((t1 - t0)) $((t2 - t1))"
}

# measure MODE ROUND: switch to MODE (on|off), warm up, time PODS pods into $raw.
measure() {
    local mode=$1 round=$2 i s
    # Each NRI measurement starts and ends without the agent; the wrapper's agent runs
    # throughout (the handler makes the difference).
    [[ $mode == off || $BENCH_PATH == wrapper ]] || start_agent
    one_pod "warm-$mode-$round" "$mode" yes >/dev/null
    for ((i = 0; i < PODS; i++)); do
        s=$(one_pod "b-$mode-$round-$i" "$mode")
        echo "$mode $round $s" >>"$raw"
    done
    [[ $mode == off || $BENCH_PATH == wrapper ]] || kill_agent
    echo "bench: round $round, plugin $mode: $PODS pods" >&2
}

# measure_pairs ROUND: PODS pods of each mode, alternating pod by pod (ABBA: even pairs
# without first, odd pairs with first); a pair's two pods are adjacent in time.
measure_pairs() {
    local round=$1 i mode s order
    for ((i = 0; i < PODS; i++)); do
        if ((i % 2 == 0)); then order=(off on); else order=(on off); fi
        for mode in "${order[@]}"; do
            s=$(one_pod "p-$mode-$round-$i" "$mode")
            echo "$mode $round $s $((round * PODS + i))" >>"$raw"
        done
    done
    echo "bench: round $round: $PODS pairs" >&2
}

# serve_instance [ON OFF]: the paired order's set-up. On the NRI path the agent serves
# instance ON from now on (the wrapper's agent serves throughout). One untimed pod of each mode
# checks the modes: the plugin's env in the "with" container and not in a plain "without"
# one (so the other instance has no plugin, or the plain handler no wrapper); then, for the
# adjusted baseline, the probes that make OFF_EXTRA, and one adjusted "without" pod.
serve_instance() {
    if [[ $BENCH_PATH == nri ]]; then
        [[ -z $AGENT_PID ]] || kill_agent
        ON_INST=$1 OFF_INST=$2
        use_instance "$ON_INST"
        start_agent
        AGENT_LOGS+=("$E2E_ROOT/agent.log")
    fi
    OFF_EXTRA='{}'
    one_pod "warm-on-${1:-w}" on yes >/dev/null
    one_pod "warm-off-${2:-w}" off yes >/dev/null
    if [[ $BASELINE == adjusted ]]; then
        adjusted_baseline
        one_pod "warm-adjusted-${2:-w}" off yes >/dev/null
    fi
    [[ $BENCH_PATH == wrapper ]] || echo "bench: the agent serves instance $1; instance $2 runs without it" >&2
}

# summary COLUMN MODE: "n mean p50 p90" in ms of a raw column (3 create, 4 start, 5 both).
summary() {
    awk -v m="$2" '$1 == m { print ($3 + 0) " " ($4 + 0) " " ($3 + $4) }' "$raw" |
        cut -d' ' -f"$(($1 - 2))" | sort -n |
        awk '{ v[NR] = $1; s += $1 }
             function rank(p,  k) { k = int(p * NR); if (k < p * NR) k++; if (k < 1) k = 1; return v[k] }
             END { printf "%d %.1f %.1f %.1f\n", NR, s / NR / 1000, rank(0.5) / 1000, rank(0.9) / 1000 }'
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
root=$(mktemp -d /tmp/gpushare-bench.XXXXXX)
top=$root
if [[ ${GPUSHARE_BENCH_TMPFS:-1} != 0 ]]; then
    TMPFS=$root # removed by cleanup, mounted or not
    mount -t tmpfs -o size=4g,mode=0755 gpushare-bench "$root"
    root=$root/${root##*/} # unique name: it also names the pods' cgroup parent
fi
raw=$top/raw.txt
: >"$raw"
AGENT_LOGS=()
if [[ $BENCH_PATH == wrapper ]]; then
    mkdir -p "$root/bin"
    ln -sf "$WRAPPER_BIN" "$root/bin/gpushare-runtime"
    printf 'runtime = "%s"\nsocket = "%s"\n' "$(command -v runc || echo /usr/sbin/runc)" \
        "$root/runtime.sock" >"$root/runtime.toml"
    export E2E_WRAPPER_HANDLER=$root/bin/gpushare-runtime GPUSHARE_RUNTIME_CONFIG=$root/runtime.toml
    e2e_start_containerd 1.6 "$root"
    start_agent
    AGENT_LOGS+=("$E2E_ROOT/agent.log")
    [[ $BASELINE != adjusted || $ORDER == pairs ]] || adjusted_baseline
elif [[ $ORDER == pairs ]]; then
    e2e_start_containerd 2 "${root}a"
    save_instance A
    E2E_CONTAINERD_PID= # lib.sh runs one instance per shell; A's settings are saved
    e2e_start_containerd 2 "${root}b"
    save_instance B
else
    e2e_start_containerd 2 "$root"
fi
if [[ $ORDER == pairs ]]; then
    # The wrapper path: both handlers on one instance, so every round is alike.
    if [[ $BENCH_PATH == wrapper ]]; then serve_instance; else serve_instance A B; fi
    for ((r = 0; r < ROUNDS; r++)); do
        # Crossover: the agent moves to instance B for the second half of the rounds.
        if [[ $BENCH_PATH == nri ]] && ((r == ROUNDS / 2 && r > 0)); then serve_instance B A; fi
        measure_pairs "$r"
    done
    [[ -z $AGENT_PID || $BENCH_PATH == wrapper ]] || kill_agent
else
    for ((r = 0; r < ROUNDS; r++)); do
        if ((r % 2 == 0)); then order=(off on); else order=(on off); fi
        for mode in "${order[@]}"; do measure "$mode" "$r"; done
    done
    AGENT_LOGS+=("$E2E_ROOT/agent.log")
fi

echo
if [[ $BENCH_PATH == wrapper ]]; then
    echo "crictl create + start on containerd $(containerd --version | cut -d' ' -f3) through gpushare-runtime (runc $(runc --version | sed -n 's/^runc version //p')):"
else
    echo "crictl create + start on containerd $E2E_CONTAINERD2_VERSION (runc $(runc --version | sed -n 's/^runc version //p')):"
fi
if [[ $ORDER == pairs ]]; then
    how="alternating pod by pod (ABBA)"
    [[ $BENCH_PATH == wrapper ]] || how+=", two instances, the agent on A then on B"
else
    how="ABBA order of rounds"
fi
echo "$ROUNDS rounds x $PODS pods per mode, $how; $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "agent: $BIN node --gpu-backend sim${AGENT_ARGS[*]:+ ${AGENT_ARGS[*]}}; $POD_KIND pods; baseline: $BASELINE"
echo "load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-26s %5s %9s %9s %9s\n' "mode" "n" "mean ms" "p50 ms" "p90 ms"
declare -A mean50
for col in 5 3 4; do
    case $col in 5) what="create+start" ;; 3) what="create" ;; 4) what="start" ;; esac
    for mode in off on; do
        read -r n mean p50 p90 < <(summary "$col" "$mode")
        printf '%-26s %5d %9s %9s %9s\n' "$what, plugin $mode" "$n" "$mean" "$p50" "$p90"
        mean50[$mode.$col]="$mean $p50"
    done
done
read -r on_mean on_p50 <<<"${mean50[on.5]}"
read -r off_mean off_p50 <<<"${mean50[off.5]}"
awk -v a="$on_mean" -v b="$off_mean" -v c="$on_p50" -v d="$off_p50" 'BEGIN {
    printf "ratio with/without (create+start): mean %.3f, p50 %.3f (goal: <= 1.02)\n", a / b, c / d }'
# Each round measures both modes back to back: their ratios show how much of the overall
# ratio is noise between rounds, and their median is robust to a noisy round.
ratios=$(awk '{ s[$1, $2] += $3 + $4; n[$1, $2]++; if ($2 + 1 > r) r = $2 + 1 }
    END { for (i = 0; i < r; i++) printf "%.3f\n", (s["on", i] / n["on", i]) / (s["off", i] / n["off", i]) }' "$raw")
echo "per-round ratio of means with/without: $(paste -sd' ' <<<"$ratios")"
sort -g <<<"$ratios" | awk '{ v[NR] = $1 }
    END { printf "median of the per-round ratios: %.3f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'

# The plugin's own time per admitted container, from its log ("GPU container admitted").
{ cat "${AGENT_LOGS[@]}" 2>/dev/null | grep -o 'micros=[0-9]*' || true; } | cut -d= -f2 | sort -n |
    awk '{ v[NR] = $1 } END { if (NR) printf "in-plugin CreateContainer (agent log): n %d, p50 %d µs, p99 %d µs, max %d µs\n",
        NR, v[int(NR * 0.5 + 0.999)], v[int(NR * 0.99 + 0.999)], v[NR] }'

# The paired estimate: each pair's with − without, its mean with a bootstrap interval.
[[ $ORDER != pairs ]] || python3 "$here/paired_stats.py" "$raw"

if [[ -n ${GPUSHARE_BENCH_RAW:-} ]]; then
    { echo "# mode round create_us start_us [pair]"; cat "$raw"; } >"$GPUSHARE_BENCH_RAW"
fi
