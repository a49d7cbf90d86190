#!/usr/bin/env bash
# Why the e2e quota window holds /dev/cpu_dma_latency at 0: on a VM, a process that is frozen
# most of the time does less work per CPU second than one that runs all the time, when its
# vCPU halts in between. No gpushare involved: two copies of the e2e busy loop (E2E_BURN's
# shape, run with the host's busybox), A pinned to CPU 0 and never frozen, B pinned to CPU 1
# and frozen 70 ms / thawed 30 ms through a cgroup v1 freezer, each in its own cpuacct
# cgroup; over 10 s, each one's loop rounds per CPU second. Run with the default idle states
# and with the PM QoS request at 0 µs (idle CPUs poll). Prints numbers, gates nothing.
# Needs root, cgroup v1 freezer and cpuacct, busybox, 2 CPUs or more.
#
# Usage: bench/idle_core.sh [RUNS]   (default 3 per setting)
set -euo pipefail
runs=${1:-3}
dir=$(mktemp -d /tmp/gpushare-idle.XXXXXX)
fz=/sys/fs/cgroup/freezer acct=/sys/fs/cgroup/cpuacct
cleanup() {
    for c in A B; do
        [[ -d $fz/gpushare-idle$c ]] || continue
        echo THAWED >"$fz/gpushare-idle$c/freezer.state" || true
        for p in $(cat "$fz/gpushare-idle$c/cgroup.procs"); do kill -9 "$p" 2>/dev/null || true; done
    done
    sleep 0.5
    for c in A B; do rmdir "$fz/gpushare-idle$c" "$acct/gpushare-idle$c" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
# shellcheck disable=SC2016 # expanded by the loop's shell
burn='cd "$1"; i=0; while :; do busybox awk "BEGIN{for(j=0;j<20000;j++);}"; i=$((i+1)); echo $i >p.tmp; mv p.tmp progress; done'

rounds() { cat "$dir/$1/progress" 2>/dev/null || echo 0; }
cpu() { cat "$acct/gpushare-idle$1/cpuacct.usage"; }

one() { # QOS(0|default): prints "A r/s, share; B r/s, share; B/A work per CPU second"
    local qos=$1 fd= t0 t1 a0 a1 b0 b1 ca0 ca1 cb0 cb1 sa sb duty
    for c in A B; do mkdir -p "$fz/gpushare-idle$c" "$acct/gpushare-idle$c" "$dir/$c"; done
    for c in A B; do
        # Not a job of this shell (setsid -f): killed through its cgroup, never reaped here.
        setsid -f sh -c 'echo $$ >"$1/cgroup.procs" && echo $$ >"$2/cgroup.procs" &&
            exec taskset -c "$3" busybox sh -c "$4" sh "$5"' sh \
            "$fz/gpushare-idle$c" "$acct/gpushare-idle$c" "$([[ $c == A ]] && echo 0 || echo 1)" \
            "$burn" "$dir/$c"
    done
    if [[ $qos == 0 ]]; then exec {fd}>/dev/cpu_dma_latency && echo 0 >&"$fd"; fi
    (while :; do
        echo FROZEN >"$fz/gpushare-idleB/freezer.state"; sleep 0.07
        echo THAWED >"$fz/gpushare-idleB/freezer.state"; sleep 0.03
    done) &
    duty=$!
    sleep 2
    t0=$(date +%s%N); a0=$(rounds A); b0=$(rounds B); ca0=$(cpu A); cb0=$(cpu B)
    sleep 10
    t1=$(date +%s%N); a1=$(rounds A); b1=$(rounds B); ca1=$(cpu A); cb1=$(cpu B)
    kill "$duty"; wait "$duty" 2>/dev/null || true
    [[ -z $fd ]] || exec {fd}>&-
    sa=$(((ca1 - ca0) * 1000 / (t1 - t0))) sb=$(((cb1 - cb0) * 1000 / (t1 - t0)))
    printf '%-8s A %3d rounds/s on %3d‰ of CPU 0; B %3d rounds/s on %3d‰ of CPU 1; B/A work per CPU second %4d‰\n' \
        "$qos" $(((a1 - a0) / 10)) "$sa" $(((b1 - b0) / 10)) "$sb" $(((b1 - b0) * sa * 1000 / ((a1 - a0) * sb)))
    cleanup_run
}
cleanup_run() {
    for c in A B; do
        echo THAWED >"$fz/gpushare-idle$c/freezer.state"
        for p in $(cat "$fz/gpushare-idle$c/cgroup.procs"); do kill -9 "$p" 2>/dev/null || true; done
    done
    sleep 0.5
    for c in A B; do rmdir "$fz/gpushare-idle$c" "$acct/gpushare-idle$c"; rm -rf "${dir:?}/$c"; done
}

echo "idle driver: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none); $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
echo "setting: default = the idle states as they are; 0 = /dev/cpu_dma_latency held at 0 µs"
for ((r = 0; r < runs; r++)); do one default; one 0; done
