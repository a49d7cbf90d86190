#!/usr/bin/env bash
# Smoke test of the e2e harness itself (no gpushare code involved): for each
# containerd version, start it in a temp root with NRI enabled, run a
# host-network pod with a busybox container through CRI, exec into it, restart
# containerd (the container must survive), stop + remove, tear down.
#
#   sudo tests/e2e/smoke.sh [VERSION...]     (default: 2 1.7)
set -euo pipefail

# shellcheck source=tests/e2e/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

trap e2e_stop_containerd EXIT

versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=(2 1.7)

is_running() { # CTR_ID
    [[ $(e2e_crictl inspect -o go-template --template '{{.status.state}}' "$1") == CONTAINER_RUNNING ]]
}

is_exited() { # CTR_ID
    [[ $(e2e_crictl inspect -o go-template --template '{{.status.state}}' "$1") == CONTAINER_EXITED ]]
}

annotation_is() { # CTR_ID KEY VALUE
    [[ $(e2e_crictl inspect "$1" | jq -r --arg k "$2" '.status.annotations[$k] // empty') == "$3" ]]
}

for version in "${versions[@]}"; do
    start=$SECONDS
    echo "=== containerd $version"
    root=$(mktemp -d /tmp/gpushare-e2e.XXXXXX)
    e2e_require "[$version] containerd starts with NRI enabled" e2e_start_containerd "$version" "$root"
    e2e_check "[$version] NRI socket exists" test -S "$E2E_NRI_SOCK"
    e2e_check "[$version] crictl info answers" e2e_crictl info
    e2e_check "[$version] pause image visible to CRI" e2e_crictl inspecti "$E2E_PAUSE_IMAGE"
    e2e_check "[$version] busybox image visible to CRI" e2e_crictl inspecti "$E2E_BUSYBOX_IMAGE"

    e2e_pod_json smoke-pod "uid-smoke-$version" '{"gpushare.test/pod":"yes"}' >"$root/pod.json"
    e2e_ctr_json smoke-ctr '{"gpushare.test/ctr":"yes"}' \
        '{"envs":[{"key":"SMOKE","value":"hello"}]}' >"$root/ctr.json"

    ctr=
    if ctr=$(e2e_run_pod_with_container "$root/pod.json" "$root/ctr.json"); then :; fi
    pod=$(e2e_last_pod_id 2>/dev/null || true)
    e2e_require "[$version] runp + create + start" test -n "$ctr" -a -n "$pod"
    e2e_check "[$version] container running" is_running "$ctr"
    e2e_check "[$version] pod is ready" e2e_grep_out SANDBOX_READY e2e_crictl inspectp -o go-template --template '{{.status.state}}' "$pod"
    e2e_check "[$version] pod uses host network" e2e_grep_out NODE e2e_crictl inspectp -o go-template --template '{{.status.linux.namespaces.options.network}}' "$pod"
    e2e_check "[$version] exec ls /dev" e2e_grep_out null e2e_crictl exec "$ctr" ls /dev
    e2e_check "[$version] exec env sees SMOKE" e2e_grep_out SMOKE=hello e2e_crictl exec "$ctr" env
    e2e_check_fail "[$version] exec exit code propagates" e2e_crictl exec "$ctr" sh -c 'exit 3'
    e2e_check "[$version] pod cgroup under E2E_CGROUP_BASE" e2e_grep_out "$E2E_CGROUP_BASE/poduid-smoke-$version" \
        e2e_crictl exec "$ctr" cat /proc/self/cgroup
    e2e_check "[$version] container annotation passed through" annotation_is "$ctr" gpushare.test/ctr yes

    e2e_require "[$version] containerd restarts" e2e_restart_containerd
    e2e_check "[$version] container survives containerd restart" is_running "$ctr"
    e2e_check "[$version] NRI socket back after restart" test -S "$E2E_NRI_SOCK"
    e2e_check "[$version] exec after restart" e2e_crictl exec "$ctr" true

    e2e_check "[$version] stop container" e2e_crictl stop --timeout 1 "$ctr"
    e2e_check "[$version] container exited" is_exited "$ctr"
    e2e_check "[$version] remove container" e2e_crictl rm "$ctr"
    e2e_check "[$version] stop pod" e2e_crictl stopp "$pod"
    e2e_check "[$version] remove pod" e2e_crictl rmp "$pod"
    e2e_check "[$version] no pods left" test -z "$(e2e_crictl pods -q)"

    saved_root=$E2E_ROOT saved_cg=$E2E_CGROUP_BASE
    e2e_stop_containerd
    e2e_stop_containerd # idempotent
    e2e_check "[$version] root removed" test ! -e "$saved_root"
    e2e_check "[$version] pod cgroups removed" test -z "$(find /sys/fs/cgroup -maxdepth 3 -path "*$saved_cg*" 2>/dev/null)"
    e2e_check "[$version] no shims left" test -z "$(E2E_CONTAINERD_SOCK=$saved_root/containerd.sock _e2e_our_shims)"
    echo "=== containerd $version took $((SECONDS - start))s"
done

e2e_summary
