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
#   GPUSHARE_BENCH_TMPFS   0 to keep containerd's root on the disk under /tmp (default: tmpfs)
#   GPUSHARE_BENCH_POD     gpu (default) or plain: a pod without GPU annotations, which the
#                          plugin passes through (isolates what NRI itself costs)
#   GPUSHARE_BENCH_PATH    nri (default) or wrapper: instead of the NRI plugin on containerd
#                          2.x, the runtime wrapper on Debian's containerd 1.6 — "with" is a
#                          pod of the runtime handler `gpushare` (runc = gpushare-runtime),
#                          "without" one of the plain runc handler, the agent serving the
#                          wrapper throughout.
#   GPUSHARE_BENCH_BASELINE  plain (default) or adjusted (wrapper path, GPU pods): the
#                          "without" pod's container config carries, through CRI, what the
#                          wrapper adds to the "with" pod's container (device nodes, env, the
#                          limiter's mounts, the CPU pin of the sim GPU: copied once from a
#                          probe container), so the difference is the wrapper itself, not the
#                          adjustment that every GPU container pays (the NRI path too)
#
# Design (for a fair comparison):
#   * One containerd 2.x instance (tests/e2e/lib.sh), one pod and container config for both
#     modes: a host-network GPU pod with the device plugin's assignment annotation and the
#     granted-mem/-core container annotations. Without the plugin containerd just carries
#     the annotations; with it, the plugin admits the container and adjusts it.
#   * ROUNDS rounds; each round measures both modes, in ABBA order (even rounds: without,
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
    e2e_stop_containerd || true
    if [[ -n $TMPFS ]]; then
        umount "$TMPFS" 2>/dev/null || umount -l "$TMPFS" 2>/dev/null || true
        rmdir "$TMPFS" 2>/dev/null || true
    fi
}
trap cleanup EXIT

now_us() { local t=${EPOCHREALTIME//[!0-9]/}; echo "$((10#$t))"; }

BENCH_PATH=${GPUSHARE_BENCH_PATH:-nri}
case $BENCH_PATH in
nri) LINK=() ;;
wrapper) LINK=(--runtime gpushare) ;;
*) echo "bench: GPUSHARE_BENCH_PATH must be nri or wrapper" >&2; exit 2 ;;
esac

start_agent() {
    local link=(--nri-socket "$E2E_NRI_SOCK")
    [[ $BENCH_PATH == nri ]] || link=(--no-nri --runtime-socket "$E2E_ROOT/runtime.sock")
    "$BIN" node "${link[@]}" --gpu-backend sim --dev-root "$E2E_ROOT/simdev" \
        --node-name bench-node --status-listen "127.0.0.1:$PORT" \
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
    [[ $BENCH_PATH == wrapper && $POD_KIND == gpu ]] || {
        echo "bench: GPUSHARE_BENCH_BASELINE=adjusted needs GPUSHARE_BENCH_PATH=wrapper and GPU pods" >&2
        exit 2
    }
    ;;
*) echo "bench: GPUSHARE_BENCH_BASELINE must be plain or adjusted" >&2; exit 2 ;;
esac
OFF_EXTRA='{}' # the "without" container's extra CRI config (adjusted baseline)

# bundle_spec CTR: the OCI spec runc got for container CTR (after the wrapper, if any).
bundle_spec() { cat "$E2E_ROOT/state/io.containerd.runtime.v2.task/k8s.io/$1/config.json"; }

# adjusted_baseline: runs one container through the wrapper and one through plain runc, and
# sets OFF_EXTRA to the CRI container config that gives the plain one what the wrapper added:
# its devices (host nodes of the sim backend), env, mounts (sources copied, since the agent
# removes them with the container) and CPU pin.
adjusted_baseline() {
    local mode pod ctr spec_on spec_off dir=$E2E_ROOT/baseline
    for mode in on off; do
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
    OFF_EXTRA=$(jq -c --argjson off "$spec_off" --arg dir "$dir" --arg state "$E2E_ROOT/agent-state" --arg dev "$E2E_ROOT/simdev" '
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
        [[ $POD_KIND == gpu ]] || mode=off
        # The adjusted baseline's "without" container has the env too, given by CRI; that it
        # did not pass through the wrapper is checked by the runtime's pod handler.
        if [[ $BASELINE == adjusted && $mode == off ]]; then
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
if [[ ${GPUSHARE_BENCH_TMPFS:-1} != 0 ]]; then
    TMPFS=$root # removed by cleanup, mounted or not
    mount -t tmpfs -o size=4g,mode=0755 gpushare-bench "$root"
    root=$root/${root##*/} # unique name: it also names the pods' cgroup parent
fi
if [[ $BENCH_PATH == wrapper ]]; then
    mkdir -p "$root/bin"
    ln -sf "$WRAPPER_BIN" "$root/bin/gpushare-runtime"
    printf 'runtime = "%s"\nsocket = "%s"\n' "$(command -v runc || echo /usr/sbin/runc)" \
        "$root/runtime.sock" >"$root/runtime.toml"
    export E2E_WRAPPER_HANDLER=$root/bin/gpushare-runtime GPUSHARE_RUNTIME_CONFIG=$root/runtime.toml
    e2e_start_containerd 1.6 "$root"
    start_agent
    [[ $BASELINE != adjusted ]] || adjusted_baseline
else
    e2e_start_containerd 2 "$root"
fi
raw=$E2E_ROOT/raw.txt
: >"$raw"
for ((r = 0; r < ROUNDS; r++)); do
    if ((r % 2 == 0)); then order=(off on); else order=(on off); fi
    for mode in "${order[@]}"; do measure "$mode" "$r"; done
done

echo
if [[ $BENCH_PATH == wrapper ]]; then
    echo "crictl create + start on containerd $(containerd --version | cut -d' ' -f3) through gpushare-runtime (runc $(runc --version | sed -n 's/^runc version //p')):"
else
    echo "crictl create + start on containerd $E2E_CONTAINERD2_VERSION (runc $(runc --version | sed -n 's/^runc version //p')):"
fi
echo "$ROUNDS rounds x $PODS pods per mode, ABBA order; $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
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
    printf "ratio with/without (create+start): mean %.3f, p50 %.3f (goal: <= 1.05)\n", a / b, c / d }'
# Each round measures both modes back to back: their ratios show how much of the overall
# ratio is noise between rounds, and their median is robust to a noisy round.
ratios=$(awk '{ s[$1, $2] += $3 + $4; n[$1, $2]++; if ($2 + 1 > r) r = $2 + 1 }
    END { for (i = 0; i < r; i++) printf "%.3f\n", (s["on", i] / n["on", i]) / (s["off", i] / n["off", i]) }' "$raw")
echo "per-round ratio of means with/without: $(paste -sd' ' <<<"$ratios")"
sort -g <<<"$ratios" | awk '{ v[NR] = $1 }
    END { printf "median of the per-round ratios: %.3f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'

# The plugin's own time per admitted container, from its log ("GPU container admitted").
{ grep -o 'micros=[0-9]*' "$E2E_ROOT/agent.log" || true; } | cut -d= -f2 | sort -n |
    awk '{ v[NR] = $1 } END { if (NR) printf "in-plugin CreateContainer (agent log): n %d, p50 %d µs, p99 %d µs, max %d µs\n",
        NR, v[int(NR * 0.5 + 0.999)], v[int(NR * 0.99 + 0.999)], v[NR] }'

if [[ -n ${GPUSHARE_BENCH_RAW:-} ]]; then
    { echo "# mode round create_us start_us"; cat "$raw"; } >"$GPUSHARE_BENCH_RAW"
fi
