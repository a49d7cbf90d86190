#!/usr/bin/env bash
# The seed walkthrough on a throwaway containerd with 4 simulated 15 GiB GPUs:
# node capacity, the sample job (2 GiB, 30 %), what its container got, and a refused request.
# Needs root. Run through `make demo`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/e2e/lib.sh
source "$here/lib.sh"

BIN=${GPUSHARE_BIN:-$repo/target/release/gpushare}
PORT=${GPUSHARE_DEMO_PORT:-19403}
VERSION=${GPUSHARE_DEMO_CONTAINERD:-2}
AGENT_PID=
REL=$(dirname "$BIN")
DRIVER_DIR=$(e2e_gpu_fakes "$REL")
trap '[[ -n $AGENT_PID ]] && kill "$AGENT_PID" 2>/dev/null; e2e_stop_containerd; rm -rf "$DRIVER_DIR"' EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "throwaway containerd $VERSION with NRI, in a temp root"
root=$(mktemp -d /tmp/gpushare-demo.XXXXXX)
e2e_start_containerd "$VERSION" "$root" >/dev/null
echo "containerd pid $E2E_CONTAINERD_PID, NRI socket $E2E_NRI_SOCK"

step "gpushare node --gpu-backend sim (4 GPUs x 15 GiB)"
"$BIN" node --nri-socket "$E2E_NRI_SOCK" --gpu-backend sim --sim-gpus 4 --sim-gpu-memory-mib 15360 \
    --node-name demo-node --dev-root "$root/simdev" --status-listen "127.0.0.1:$PORT" \
    --status-socket "$root/status.sock" \
    --log-file "$root/agent.log" --state-dir "$root/state" \
    --limiter-library "$REL/libgpushare_limiter.so" --sim-driver-dir "$DRIVER_DIR" &
AGENT_PID=$!
for _ in $(seq 100); do curl -fsS "127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "127.0.0.1:$PORT/healthz"
grep 'registered with the runtime' "$root/agent.log" | tail -1

step "node capacity, as the device plugin advertises it (kubectl get node -o yaml)"
"$BIN" capacity --gpu-backend sim --sim-gpus 4 --sim-gpu-memory-mib 15360 --node-name demo-node |
    sed 's/^/    /'

step "the sample job: limits {aliyun.com/gpu-mem: 2, aliyun.com/gpu-core.percentage: 30}"
# What the gpushare scheduler writes on the pod, and what kubelet passes to the container
# after the device plugin's Allocate. The scheduler itself comes with its own issue; here the
# assignment is written as it would be: GPU 0, 2048 MiB, 30 %.
uuid0=$(curl -fsS --unix-socket "$root/status.sock" http://status/inventory | jq -r '.inventory.gpus[0].uuid')
assignment=$(jq -cn --arg u "$uuid0" '{version:1, timestamp:(now|todate), containers:{main:[{gpuIndex:0, gpuUuid:$u, memoryMiB:2048, corePercent:30}]}}')
echo "pod annotation gpushare.io/assignment: $assignment"
# The workload: a busy loop that counts rounds (like the sample job's images/sec), written
# where the agent's sim directory is mounted.
burn='cd /var/run/gpushare; i=0; while :; do awk "BEGIN{for(j=0;j<20000;j++);}"; i=$((i+1)); echo $i >p.tmp; mv p.tmp progress; done'
burn_json=$(jq -cn --arg c "$burn" '{command: ["/bin/sh", "-c", $c]}')
# (The demo's container also gets the host's glibc and the CUDA probe, to look at its GPU the
# way CUDA software and nvidia-smi do; the driver itself is the agent's simulated one.)
sample_json=$(jq -cn --argjson a "$burn_json" --argjson b "$(e2e_probe_mounts "$REL")" '$a + $b')
e2e_pod_json sample-job uid-sample-job "$(jq -cn --arg a "$assignment" '{"gpushare.io/assignment":$a}')" >"$root/pod.json"
e2e_ctr_json main '{"gpushare.io/granted-mem":"2","gpushare.io/granted-core":"30"}' "$sample_json" >"$root/ctr.json"
cid=$(e2e_run_pod_with_container "$root/pod.json" "$root/ctr.json")
echo "container $cid running"

step "what the container got"
echo "\$ ls -l /dev | grep nvidia"
e2e_crictl exec "$cid" ls -l /dev | grep nvidia | sed 's/^/    /'
echo "\$ env | grep -E 'NVIDIA|GPUSHARE|ALIYUN'"
e2e_crictl exec "$cid" env | grep -E 'NVIDIA|GPUSHARE|ALIYUN' | sort | sed 's/^/    /'

step "the GPU as the container sees it: its 2 GiB quota is the GPU's memory (in-container limiter)"
probe() { e2e_crictl exec "$cid" /usr/local/bin/gpu-probe "$@" 2>&1 | sed 's/^/    /'; }
echo "\$ nvidia-smi --query-gpu=memory.total,memory.used --format=csv   (the probe's NVML client)"
probe nvml smi
echo "\$ cuMemGetInfo; cuMemAlloc 1.5 GiB; cuMemAlloc 1 GiB more   (rc 2 = CUDA_ERROR_OUT_OF_MEMORY)"
probe dlopen init info alloc:1536 info alloc:1024
echo "\$ a second process while the first holds 1 GiB"
e2e_crictl exec "$cid" sh -c '/usr/local/bin/gpu-probe dlopen init alloc:1024 sleep:4000 >/dev/null &
    sleep 2; /usr/local/bin/gpu-probe dlopen init info' 2>&1 | sed 's/^/    /'

step "the node agent's registry and metrics"
curl -fsS --unix-socket "$root/status.sock" http://status/registry | jq -c '.[] | {pod: "\(.pod_namespace)/\(.pod_name)", container: .container_name, state, cgroups_path, gpus: [.gpus[] | {index, memory_mib, core_percent}]}'
curl -fsS "127.0.0.1:$PORT/metrics" | grep -E '^gpushare_gpu_(memory_assigned_mib|core_assigned_percent)\{gpu="0"|^gpushare_create_container_total'

step "compute quota: the same job unconstrained (GPU 1, 100 %) next to the sample job (GPU 0, 30 %)"
free=$(jq -cn '{version:1, containers:{main:[{gpuIndex:1, memoryMiB:2048, corePercent:100}]}}')
e2e_pod_json free-job uid-free-job "$(jq -cn --arg a "$free" '{"gpushare.io/assignment":$a}')" >"$root/free-pod.json"
e2e_ctr_json main '{"gpushare.io/granted-mem":"2","gpushare.io/granted-core":"100"}' "$burn_json" >"$root/free-ctr.json"
fid=$(e2e_run_pod_with_container "$root/free-pod.json" "$root/free-ctr.json")
rounds() { cat "$root/state/sim/$1/progress"; }
sleep 2
for t in 1 2 3 4 5 6; do
    a0=$(rounds "$fid"); b0=$(rounds "$cid")
    sleep 1
    a=$(( $(rounds "$fid") - a0 )); b=$(( $(rounds "$cid") - b0 ))
    printf '    t=%ds  unconstrained: %4d rounds/s   sample-job (30%%): %4d rounds/s   ratio %3d%%\n' \
        "$t" "$a" "$b" $(( a > 0 ? 100 * b / a : 0 ))
done
curl -fsS "127.0.0.1:$PORT/metrics" | grep -E '^gpushare_container_(gpu_utilization_ratio|throttled_seconds_total|freezes_total)' | sed 's/,id="[^"]*"//; s/^/    /'

step "a bad request: gpu-core.percentage 33 is refused at container creation"
bad=$(jq -cn '{version:1, containers:{main:[{gpuIndex:1, memoryMiB:2048, corePercent:33}]}}')
e2e_pod_json bad-job uid-bad-job "$(jq -cn --arg a "$bad" '{"gpushare.io/assignment":$a}')" >"$root/bad-pod.json"
e2e_ctr_json main '{"gpushare.io/granted-mem":"2","gpushare.io/granted-core":"33"}' >"$root/bad-ctr.json"
pod=$(e2e_crictl runp "$root/bad-pod.json")
if e2e_crictl create "$pod" "$root/bad-ctr.json" "$root/bad-pod.json" 2>"$root/err"; then
    echo "unexpected: the bad request was accepted" >&2
    exit 1
fi
grep -o 'desc = gpushare: .*' "$root/err" | tail -1 | sed 's/^desc = /    crictl create: /; s/"$//'

step "done: everything above ran on real containerd, runc and crictl; only the GPUs are simulated"
