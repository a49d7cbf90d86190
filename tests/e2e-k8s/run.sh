#!/usr/bin/env bash
# The seed walkthrough on a real one-node Kubernetes cluster (tests/e2e-k8s/cluster.sh:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet 1.36.3 built from
# their Go modules; containerd 2.x with NRI; bridge CNI), with `gpushare node` (NRI plugin,
# throttling controller, device plugin; sim backend, 4 GPUs × 15 GiB) and `gpushare
# scheduler` (the extender kube-scheduler calls). Everything through kubectl, as a user would.
#
#   sudo tests/e2e-k8s/run.sh        (make e2e-k8s)
#
# Ends with "N passed, M failed"; exits non-zero on any failure.
set -euo pipefail

# shellcheck source=tests/e2e-k8s/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
K8S_WAIT_WHO=e2e-k8s

BIN=${GPUSHARE_BIN:-$E2E_REPO/target/release/gpushare}
[[ -x $BIN ]] || { echo "e2e-k8s: $BIN not built (cargo build --release)" >&2; exit 1; }
# Test ports sit below Linux's ephemeral range (32768-60999): an earlier suite's outgoing
# connection can hold a port inside it ("Address already in use" once in CI at 39998).
EXT_PORT=${GPUSHARE_EXT_PORT:-19999}
STATUS_PORT=${GPUSHARE_STATUS_PORT:-19998}
# kube-scheduler calls the extender over mutual TLS (issue 11.2): the extender's serving
# certificate and kube-scheduler's client certificate come from a CA of their own.
export K8S_EXTENDER_URL=https://127.0.0.1:$EXT_PORT
EXT_PKI=$(mktemp -d /tmp/gpushare-ext-pki.XXXXXX)
export K8S_EXTENDER_TLS_DIR=$EXT_PKI
pki_ca "$EXT_PKI" "/CN=gpushare-extender-clients" 30 &&
    pki_cert "$EXT_PKI" 30 extender "/CN=gpushare-extender" serverAuth "IP:127.0.0.1" &&
    pki_cert "$EXT_PKI" 30 kube-scheduler "/CN=kube-scheduler" clientAuth ||
    { echo "e2e-k8s: cannot make the extender's PKI" >&2; exit 1; }
# ext_curl PATH [CURL ARGS...]: the extender's endpoint as kube-scheduler reaches it.
ext_curl() {
    curl -fsS --max-time 10 --cacert "$EXT_PKI/ca.crt" --cert "$EXT_PKI/kube-scheduler.crt" \
        --key "$EXT_PKI/kube-scheduler.key" "https://127.0.0.1:$EXT_PORT/$1" "${@:2}"
}
export -f ext_curl
export EXT_PKI EXT_PORT
AGENT_PID=
EXT_PID=
SCRAPE_PID=
ROOT=
# Both endpoints scraped every 2 s from the moment the extender runs, as a Prometheus would,
# kept for the dashboard's picture: `make dashboard-png` renders install/grafana/gpushare.json
# from them through a real Prometheus (bench/dashboard_png.sh). At most 900 rounds (30 min).
SCRAPES=$E2E_REPO/target/e2e-k8s/scrapes
scrape_loop() {
    local i t job
    for ((i = 0; i < 900; i++)); do
        t=$(date +%s%3N)
        curl -fsS --max-time 2 "127.0.0.1:$STATUS_PORT/metrics" >"$SCRAPES/agent/$t.tmp" 2>/dev/null &&
            mv "$SCRAPES/agent/$t.tmp" "$SCRAPES/agent/$t.prom"
        ext_curl metrics --max-time 2 >"$SCRAPES/extender/$t.tmp" 2>/dev/null &&
            mv "$SCRAPES/extender/$t.tmp" "$SCRAPES/extender/$t.prom"
        for job in agent extender; do rm -f "$SCRAPES/$job/$t.tmp"; done
        sleep 2
    done
}

cleanup() {
    local pid
    for pid in "$SCRAPE_PID" "$EXT_PID" "$AGENT_PID"; do
        [[ -n $pid ]] || continue
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n ${K8S_SAVE_LOGS_DIR:-} && -n $ROOT ]]; then
        mkdir -p "$K8S_SAVE_LOGS_DIR"
        cp "$ROOT"/agent.log "$ROOT"/extender.log "$K8S_SAVE_LOGS_DIR"/ 2>/dev/null || true
    fi
    k8s_down
    rm -rf "$EXT_PKI"
}
trap cleanup EXIT

kc() { k8s_kubectl "$@"; }

# pod_yaml NAME MEM CORE CMD [ANNOTATIONS_YAML]: a Pod (see k8s_pod_spec).
pod_yaml() {
    local name=$1 ann=${5:-}
    cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $name
  labels: {app: gpushare-e2e}
${ann:+  annotations: $ann}
spec:
EOF
    k8s_pod_spec "$2" "$3" "$4" | k8s_indent 2
}



running() { [[ $(kc get pod "$1" -o jsonpath='{.status.phase}') == Running ]]; }
assigned_gpu() { # POD -> the GPU index of its assignment (first container, first GPU)
    kc get pod "$1" -o json | jq -r '.metadata.annotations["gpushare.io/assignment"] | fromjson | .containers[][0].gpuIndex'
}
container_id() { kc get pod "$1" -o jsonpath='{.status.containerStatuses[0].containerID}' | sed 's|.*://||'; }
progress() { cat "$ROOT/agent-state/sim/$(container_id "$1")/progress"; }
job_pod() { kc get pod -l "job-name=$1" -o jsonpath='{.items[0].metadata.name}'; }

# Every GPU's allocation from the pods' assignments (non-terminated pods) must fit the GPU:
# memory ≤ 15360 MiB and core ≤ 100 %. Prints the per-GPU sums.
no_overcommit() {
    kc get pods -o json | jq -e '
      [.items[] | select(.status.phase != "Succeeded" and .status.phase != "Failed")
       | select(.metadata.annotations["gpushare.io/assignment"] != null)
       | select(.spec.nodeName != null)
       | .metadata.annotations["gpushare.io/assignment"] | fromjson | .containers[][]]
      | group_by(.gpuIndex)
      | map({gpu: .[0].gpuIndex, mem: (map(.memoryMiB) | add), core: (map(.corePercent // 0) | add), pods: length})
      | (.[] | "GPU \(.gpu): \(.mem) MiB, \(.core) %, \(.pods) pods" | stderr) as $x
      | all(.mem <= 15360 and .core <= 100)'
}

start_agent() {
    "$BIN" node --nri-socket "$K8S_NRI_SOCK" --gpu-backend sim --dev-root "$ROOT/simdev" \
        --node-name "$K8S_NODE" --status-listen "127.0.0.1:$STATUS_PORT" --status-socket "$E2E_STATUS_SOCKET" \
        --log-file "$ROOT/agent.log" --state-dir "$ROOT/agent-state" \
        --limiter-library "$(dirname "$BIN")/libgpushare_limiter.so" \
        --device-plugin --device-plugin-dir "$K8S_DEVICE_PLUGIN_DIR" \
        --device-plugin-core auto --kubeconfig "$KUBECONFIG" &
    AGENT_PID=$!
    k8s_wait_for 20 "agent healthy" curl -fsS "127.0.0.1:$STATUS_PORT/healthz"
}

start_extender() {
    "$BIN" scheduler --listen "127.0.0.1:$EXT_PORT" --kubeconfig "$ROOT/gpushare-scheduler.kubeconfig" \
        --tls-cert "$EXT_PKI/extender.crt" --tls-key "$EXT_PKI/extender.key" --client-ca "$EXT_PKI/ca.crt" \
        >>"$ROOT/extender.log" 2>&1 &
    EXT_PID=$!
    k8s_wait_for 30 "extender synced" ext_curl healthz
}

allocatable() { kc get node "$K8S_NODE" -o json | jq -r --arg r "aliyun.com/$1" '.status.allocatable[$r] // ""'; }
alloc_is() { [[ $(allocatable "$1") == "$2" ]]; } # RESOURCE VALUE

# ----------------------------------------------------------------------------- set-up ----
k8s_build_peers
e2e_build_images
ROOT=$(mktemp -d /tmp/gpushare-k8s.XXXXXX)
# Where the agent's status socket is (start_agent), for e2e_agent_status's registry reads.
export E2E_STATUS_SOCKET=$ROOT/status.sock
k8s_up "$ROOT"

# The extender's identity (CN=gpushare-scheduler), its RBAC and the admission policy.
_k8s_cert gpushare-scheduler "/CN=gpushare-scheduler" clientAuth
_k8s_kubeconfig "$ROOT/gpushare-scheduler.kubeconfig" gpushare-scheduler gpushare-scheduler
e2e_require "RBAC for the extender applied" kc apply -f "$E2E_REPO/install/scheduler-rbac.yaml"
e2e_require "admission policy applied" kc apply -f "$E2E_REPO/install/admission-policy.yaml"
# A policy takes effect a moment after it is created: probe with a server-side dry run.
policy_active() { ! k8s_job_yaml probe 2 33 'sleep 1' | kc apply --dry-run=server -f - >/dev/null 2>&1; }
e2e_require "admission policy in force" k8s_wait_for 30 "admission policy active" policy_active

echo "=== 1. node: labels, device plugin, allocatable"
e2e_require "gpushare node starts (NRI + device plugin)" start_agent
e2e_require "node labelled core_mem / binpack" kc label node "$K8S_NODE" --overwrite \
    ack.node.gpu.schedule=core_mem ack.node.gpu.placement=binpack
e2e_check "allocatable gpu-core.percentage becomes 400" k8s_wait_for 60 "core 400" alloc_is gpu-core.percentage 400
e2e_check "allocatable gpu-count is 4" alloc_is gpu-count 4
e2e_check "allocatable gpu-mem is 60" alloc_is gpu-mem 60
kc get node "$K8S_NODE" -o yaml | grep -E '^\s+aliyun.com/' | sort -u
e2e_check "node annotation gpushare.io/gpus lists 4 GPUs" bash -c \
    "$K8S_KUBECTL get node $K8S_NODE -o json | jq -e '.metadata.annotations[\"gpushare.io/gpus\"] | fromjson | .gpus | length == 4'"
# GPU health from the backend (sim: the indexes in <state>/sim/unhealthy; NVML: lost GPUs and
# new uncorrected ECC errors) reaches the node annotation and kubelet's allocatable.
gpu3_health="$K8S_KUBECTL get node $K8S_NODE -o json | jq -r '.metadata.annotations[\"gpushare.io/gpus\"] | fromjson | .gpus[] | select(.index == 3) | .healthy'"
mkdir -p "$ROOT/agent-state/sim" && echo 3 >"$ROOT/agent-state/sim/unhealthy"
e2e_check "GPU 3 reported unhealthy → node annotation says healthy: false" k8s_wait_for 30 "GPU 3 unhealthy" \
    bash -c "[[ \$($gpu3_health) == false ]]"
e2e_check "… and allocatable gpu-mem drops to 45" k8s_wait_for 60 "gpu-mem 45" alloc_is gpu-mem 45
rm -f "$ROOT/agent-state/sim/unhealthy"
e2e_check "GPU 3 healthy again → node annotation says healthy: true" k8s_wait_for 60 "GPU 3 healthy" \
    bash -c "[[ \$($gpu3_health) == true ]]"
e2e_require "… and allocatable gpu-mem is back to 60" k8s_wait_for 60 "gpu-mem 60" alloc_is gpu-mem 60
e2e_check "the agent found the admission policies installed (log)" bash -c \
    "grep -q 'admission policy installed.*gpushare-node-scope' '$ROOT/agent.log' && grep -q 'admission policy installed.*gpushare-pod-annotations' '$ROOT/agent.log'"
e2e_require "gpushare scheduler (extender) starts and syncs" start_extender
rm -rf "$SCRAPES" && mkdir -p "$SCRAPES"/{agent,extender}
scrape_loop &
SCRAPE_PID=$!
# The open door of issue 11.2, closed: without kube-scheduler's client certificate nobody gets
# an answer, and a /bind in plain HTTP gets nothing either.
unauth_bind() { # CURL ARGS...: the HTTP status of a /bind as an attacker would send it (000: none)
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@" -H 'content-type: application/json' \
        -d "{\"PodName\":\"x\",\"PodNamespace\":\"default\",\"PodUID\":\"\",\"Node\":\"$K8S_NODE\"}"
}
export -f unauth_bind
export K8S_NODE
e2e_check "an unauthenticated /bind (no client certificate) gets no answer" bash -c \
    "[[ \$(unauth_bind --cacert $EXT_PKI/ca.crt https://127.0.0.1:$EXT_PORT/bind) == 000 ]]"
e2e_check "… and neither does one in plain HTTP" bash -c \
    "[[ \$(unauth_bind http://127.0.0.1:$EXT_PORT/bind) == 000 ]]"
e2e_check "… while kube-scheduler's certificate gets answers" ext_curl healthz

echo "=== 2. the sample Job (2 GiB, 30 %) and an unconstrained pod"
k8s_job_yaml sample 2 30 "$K8S_BURN" | kc apply -f - >/dev/null
pod_yaml burn100 2 100 "$K8S_BURN" | kc apply -f - >/dev/null
e2e_check "sample Job's pod runs" k8s_wait_for 120 "sample running" bash -c "p=\$($K8S_KUBECTL get pod -l job-name=sample -o jsonpath='{.items[0].metadata.name}') && [[ \$($K8S_KUBECTL get pod \$p -o jsonpath='{.status.phase}') == Running ]]"
e2e_check "unconstrained pod (core 100) runs" k8s_wait_for 120 "burn100 running" running burn100
SAMPLE=$(job_pod sample)
SGPU=$(assigned_gpu "$SAMPLE")
echo "sample pod $SAMPLE assigned GPU $SGPU; burn100 assigned GPU $(assigned_gpu burn100)"
e2e_check "the assignment names one GPU with 2048 MiB and 30 %" bash -c \
    "$K8S_KUBECTL get pod $SAMPLE -o json | jq -e '.metadata.annotations[\"gpushare.io/assignment\"] | fromjson | .containers.main | length == 1 and .[0].memoryMiB == 2048 and .[0].corePercent == 30'"
e2e_check "in the container only that GPU's device node exists" bash -c \
    "[[ \$($K8S_KUBECTL exec $SAMPLE -- ls /dev | grep -E '^nvidia[0-9]+$' | tr '\n' ' ') == 'nvidia$SGPU ' ]]"
e2e_check "the container sees the kubelet grant (env from the NRI plugin)" bash -c \
    "$K8S_KUBECTL exec $SAMPLE -- env | grep -q '^NVIDIA_VISIBLE_DEVICES='"
sleep 3
progress_id() { cat "$ROOT/agent-state/sim/$1/progress"; }
e2e_quota_window_twice "$STATUS_PORT" "$(container_id "$SAMPLE")" "$(container_id burn100)" progress_id
e2e_check "sample uses 30 ±5 % of its GPU (${SHARE30}‰)" test "$SHARE30" -ge 250 -a "$SHARE30" -le 350
e2e_check "sample runs at 30 ±5 % of the unconstrained pod's rate per GPU (${RATIO30}‰)" test "$RATIO30" -ge 250 -a "$RATIO30" -le 350
e2e_check "agent metrics show the sample pod's quota" bash -c \
    "curl -fsS 127.0.0.1:$STATUS_PORT/metrics | grep -q 'gpushare_container_gpu_core_quota_ratio{pod=\"default/$SAMPLE\".*} 0.30'"
# Kept for the dashboard check (section 5): the agent's metrics while GPU pods run.
curl -fsS "127.0.0.1:$STATUS_PORT/metrics" >"$ROOT/agent-metrics.txt" || true
kc delete pod burn100 --wait=true >/dev/null

echo "=== 3. binpack: three more 30 % pods"
for i in 1 2 3; do
    pod_yaml "more$i" 2 30 'sleep 3600' | kc apply -f - >/dev/null
    k8s_wait_for 60 "more$i running" running "more$i" || true
done
g1=$(assigned_gpu more1) g2=$(assigned_gpu more2) g3=$(assigned_gpu more3)
echo "GPUs: sample $SGPU, more1 $g1, more2 $g2, more3 $g3"
e2e_check "sample, more1, more2 share one GPU (3 × 30 ≤ 100)" test "$SGPU" = "$g1" -a "$g1" = "$g2"
e2e_check "more3 goes to another GPU" test "$g3" != "$g1"
e2e_check "all four run" bash -c "for p in more1 more2 more3; do [[ \$($K8S_KUBECTL get pod \$p -o jsonpath='{.status.phase}') == Running ]] || exit 1; done"

echo "=== 4. refusals"
out=$(k8s_job_yaml bad33 2 33 'sleep 1' | kc apply -f - 2>&1) && rc=0 || rc=$?
echo "$out"
e2e_check "a Job with gpu-core.percentage 33 is refused at kubectl apply" test "$rc" -ne 0
e2e_check "… with the reason" grep -q "33" <<<"$out"
e2e_check "… and nothing was created" bash -c "! $K8S_KUBECTL get job bad33 2>/dev/null"
out=$(pod_yaml forged 2 30 'sleep 1' "{gpushare.io/assignment: '{\"version\":1,\"containers\":{\"main\":[{\"gpuIndex\":3,\"memoryMiB\":2048,\"corePercent\":30}]}}'}" |
    kc apply -f - 2>&1) && rc=0 || rc=$?
echo "$out"
e2e_check "a pod that sets gpushare.io/assignment itself is refused" test "$rc" -ne 0
e2e_check "… naming the annotation" grep -q "gpushare.io/assignment" <<<"$out"
pod_yaml memonly 2 "" 'sleep 3600' | kc apply -f - >/dev/null
reason() { kc get pod memonly -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}'; }
e2e_check "a memory-only pod is not placed on the core_mem node" k8s_wait_for 60 "memonly unschedulable" \
    bash -c "[[ \$($K8S_KUBECTL get pod memonly -o jsonpath='{.status.conditions[?(@.type==\"PodScheduled\")].status}') == False ]]"
echo "memonly: $(reason)"
e2e_check "… with a readable reason" grep -q "needs a cgpu or share node" <<<"$(reason)"
e2e_check "… and it stays unbound" test -z "$(kc get pod memonly -o jsonpath='{.spec.nodeName}')"
kc delete pod memonly --wait=false >/dev/null

echo "=== 5. 50 pods at once (1 GiB, 10 % each); the extender killed and restarted mid-way"
many_yaml() { # FROM TO
    local i
    for i in $(seq -w "$1" "$2"); do pod_yaml "many-$i" 1 10 'sleep 3600'; echo ---; done
}
bound_count() { kc get pods -o json | jq '[.items[] | select(.metadata.name | startswith("many-")) | select(.spec.nodeName != null)] | length'; }
bound_at_least() { (($(bound_count) >= $1)); }
many_yaml 01 25 >"$ROOT/many-a.yaml"
many_yaml 26 50 >"$ROOT/many-b.yaml"
kc apply -f "$ROOT/many-a.yaml" >/dev/null
e2e_check "the first 25 are bound" k8s_wait_for 120 "25 bound" bound_at_least 25
# Killed (SIGKILL: no goodbye), the other 25 arrive while it is away; the restarted extender
# must rebuild the allocations from the pods' annotations before it binds anything.
kill -9 "$EXT_PID"
wait "$EXT_PID" 2>/dev/null || true
EXT_PID=
kc apply -f "$ROOT/many-b.yaml" >/dev/null
sleep 3
e2e_check "nothing is bound while the extender is away" test "$(bound_count)" -eq 25
e2e_check "extender restarted and re-synced from the pods' annotations" start_extender
# Capacity left: GPU $SGPU has 10 % left, GPU $g3 70 %, two idle GPUs 100 % each → 1 + 7 + 10 + 10.
expect=28
e2e_check "all that fit are bound ($expect)" k8s_wait_for 180 "$expect bound" bound_at_least "$expect"
sleep 5
echo "bound: $(bound_count) of 50"
e2e_check "no more than fit were bound" test "$(bound_count)" -eq "$expect"
# The pods it found bound seed the typical shapes: without them, its 3 own reservations
# would be all it knew (no shapes before the 8th).
ext_curl metrics | grep -E '^gpushare_extender_(learned_requests|typical_shapes) ' || true
e2e_check "the restarted extender learnt the workload from the pods it found (≥ 25 requests, ≥ 1 shape)" \
    bash -c "ext_curl metrics | awk '/^gpushare_extender_learned_requests /{r=\$2} /^gpushare_extender_typical_shapes /{s=\$2} END{exit !(r >= 25 && s >= 1)}'"
e2e_check "no GPU over-committed (memory ≤ 15 GiB, core ≤ 100 % on every GPU)" no_overcommit
running_many() { kc get pods -o json | jq '[.items[] | select(.metadata.name | startswith("many-")) | select(.status.phase == "Running")] | length'; }
e2e_check "every bound pod runs" k8s_wait_for 240 "$expect running" bash -c "(( \$($K8S_KUBECTL get pods -o json | jq '[.items[] | select(.metadata.name | startswith(\"many-\")) | select(.status.phase == \"Running\")] | length') >= $expect ))"
echo "running: $(running_many)"
pending_reasons() { kc get pods -o json | jq -r '.items[] | select(.metadata.name | startswith("many-")) | select(.spec.nodeName == null) | .status.conditions[]? | select(.type == "PodScheduled") | .message'; }
pending_reasons | sort | uniq -c | head -5
# kube-scheduler itself refuses once the node's extended resources are used up; before that
# the extender's sentence ("… compute free, the pod needs 1") is the reason.
e2e_check "the rest wait with a readable reason" k8s_wait_for 60 "reasons" bash -c \
    "$K8S_KUBECTL get pods -o json | jq -e '[.items[] | select(.metadata.name | startswith(\"many-\")) | select(.spec.nodeName == null) | .status.conditions[]? | select(.type == \"PodScheduled\") | .message] | length == 22 and all(test(\"compute free|Insufficient aliyun.com/gpu\"))'"
e2e_check "extender metrics count the binds" bash -c \
    "ext_curl metrics | grep -E '^gpushare_extender_binds_total\\{result=\"ok\"\\} [1-9]'"
ext_curl metrics >"$ROOT/extender-metrics.txt" || true
e2e_check "the Grafana dashboard (install/grafana/gpushare.json) queries only metrics the agent and the extender export" \
    bash "$E2E_REPO/tests/dashboard_metrics.sh" "$E2E_REPO/install/grafana/gpushare.json" \
    "$ROOT/agent-metrics.txt" "$ROOT/extender-metrics.txt"

echo "=== 6. gpushare inspect"
out=$("$BIN" inspect --kubeconfig "$KUBECONFIG" 2>&1) || true
echo "$out"
e2e_check "inspect prints the per-GPU table" grep -q "GPU0(Allocated/Total)" <<<"$out"
e2e_check "inspect shows GPU memory 60 GiB in the cluster" grep -q "/60" <<<"$out"
out=$("$BIN" inspect --kubeconfig "$KUBECONFIG" -d 2>&1) || true
echo "$out" | head -30
e2e_check "inspect -d lists the sample pod" grep -q "$SAMPLE" <<<"$out"

echo "=== 7. kubelet restart: the device plugin registers again"
kc get pods -o name | grep '^pod/many-' | xargs "$K8S_KUBECTL" delete --wait=false >/dev/null
k8s_restart_kubelet
e2e_check "allocatable gpu-mem is back to 60 after the kubelet restart" k8s_wait_for 90 "gpu-mem 60" alloc_is gpu-mem 60
e2e_check "allocatable gpu-core.percentage is back to 400" k8s_wait_for 30 "core 400" alloc_is gpu-core.percentage 400
pod_yaml after 1 10 'sleep 3600' | kc apply -f - >/dev/null
e2e_check "a new GPU pod is granted and runs after the kubelet restart" k8s_wait_for 120 "after running" running after

echo "=== 8. a GPU init container (10 GiB, 20 %) before the app container (8 GiB, 10 %)"
# They never run together: the pod takes 10 GiB / 20 % (the larger), not 18 GiB / 30 % (no
# GPU has that much); each container gets its own share, and the init container's is free
# again once it has exited.
k8s_wait_for 120 "many- pods gone" bash -c "! $K8S_KUBECTL get pods -o name | grep -q '^pod/many-'" || true
GPU_ENV='env | grep ^GPUSHARE_GPU_ | sort'
kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: staged
  labels: {app: gpushare-e2e}
spec:
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  restartPolicy: Never
  initContainers:
  - name: prep
    image: $E2E_BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: ["sh", "-c", "$GPU_ENV"]
    resources:
      limits: {aliyun.com/gpu-mem: "10", aliyun.com/gpu-core.percentage: "20"}
  containers:
  - name: main
    image: $E2E_BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: ["sh", "-c", "$GPU_ENV; sleep 3600"]
    resources:
      limits: {aliyun.com/gpu-mem: "8", aliyun.com/gpu-core.percentage: "10"}
EOF
e2e_check "the pod with a GPU init container is scheduled and runs" k8s_wait_for 120 "staged running" running staged
staged_shares() { kc get pod staged -o json | jq -c '.metadata.annotations["gpushare.io/assignment"] | fromjson | .containers'; }
echo "staged assignment: $(staged_shares)"
e2e_check "the assignment gives the init and the app container each its own share, on one GPU" \
    jq -e '(.prep | length == 1 and .[0].memoryMiB == 10240 and .[0].corePercent == 20)
        and (.main | length == 1 and .[0].memoryMiB == 8192 and .[0].corePercent == 10)
        and .prep[0].gpuIndex == .main[0].gpuIndex' <<<"$(staged_shares)"
prep_log=$(kc logs staged -c prep 2>&1) || true
main_log=$(kc logs staged -c main 2>&1) || true
echo "prep saw: $(tr '\n' ' ' <<<"$prep_log")"
echo "main sees: $(tr '\n' ' ' <<<"$main_log")"
e2e_check "the init container saw its own share (GPUSHARE_GPU_MEMORY_MIB=10240, core 20)" \
    bash -c 'grep -qx GPUSHARE_GPU_MEMORY_MIB=10240 <<<"$1" && grep -qx GPUSHARE_GPU_CORE_PERCENT=20 <<<"$1"' _ "$prep_log"
e2e_check "the app container sees its own share (GPUSHARE_GPU_MEMORY_MIB=8192, core 10)" \
    bash -c 'grep -qx GPUSHARE_GPU_MEMORY_MIB=8192 <<<"$1" && grep -qx GPUSHARE_GPU_CORE_PERCENT=10 <<<"$1"' _ "$main_log"
# kubelet allocates the init container's devices first and hands some of them on to the app
# container (devicesToReuse); each is granted its own count, which the agent checks.
grant_of() { # CONTAINER of staged -> granted-mem/granted-core as kubelet created it
    local id
    id=$(kc get pod staged -o json | jq -r --arg c "$1" \
        '[.status.initContainerStatuses[]?, .status.containerStatuses[]?] | .[] | select(.name == $c) | .containerID' | sed 's|.*://||')
    e2e_crictl inspect "$id" | jq -r '.status.annotations | "\(.["gpushare.io/granted-mem"])/\(.["gpushare.io/granted-core"])"'
}
prep_grant=$(grant_of prep) || true
main_grant=$(grant_of main) || true
echo "grants (mem/core): prep $prep_grant, main $main_grant"
e2e_check "kubelet granted the init container 10/20 and the app container 8/10" \
    test "$prep_grant $main_grant" = "10/20 8/10"
e2e_check "the agent holds the exited init container as stopped (its share free again)" bash -c \
    "curl -fsS --unix-socket '$E2E_STATUS_SOCKET' http://status/registry | jq -e '[.. | objects | select(.pod_name? == \"staged\" and .container_name? == \"prep\")] | length == 1 and all(.state == \"stopped\")'"
e2e_check "… and refused no container of the pod (the app container was admitted at once)" bash -c \
    "! grep 'GPU container refused' '$ROOT/agent.log' | grep -q staged"
inspect_json=$("$BIN" inspect --kubeconfig "$KUBECONFIG" --json 2>&1) || true
# On the pod's GPU, allocated minus the other pods' shares is what the pod holds.
staged_held=$(jq -r '.nodes[].gpus[] | select(any(.shares[]; .pod == "staged"))
    | "\(.memoryAllocatedMiB - ([.shares[] | select(.pod != "staged") | .memoryMiB] | add // 0)) MiB, \(.coreAllocated - ([.shares[] | select(.pod != "staged") | .corePercent // 0] | add // 0)) %"' \
    <<<"$inspect_json") || true
echo "inspect: staged holds $staged_held of its GPU"
e2e_check "inspect shows the pod holding the larger share (10240 MiB, 20 %), not the sum" \
    test "$staged_held" = "10240 MiB, 20 %"
e2e_check "… and lists the init container's share as init" \
    jq -e '[.nodes[].gpus[].shares[] | select(.pod == "staged" and .container == "prep")] | length == 1 and .[0].role == "init"' <<<"$inspect_json"
# A pod that ends frees its share in the extender's books: its pod watch selects only bound,
# unfinished pods, so the API server reports the pod leaving the selection as a deletion.
pod_yaml ends 1 10 'sleep 4' | kc apply -f - >/dev/null
ext_share_count() { # POD: how many of the extender's allocations are the pod's (fails if it cannot tell)
    local a
    a=$(ext_curl allocations) && jq -e --arg p "default/$1" '[.allocations[] | select(.pod == $p)] | length' <<<"$a"
}
ext_holds() { [[ $(ext_share_count "$1") == 1 ]]; }
ext_released() { [[ $(ext_share_count "$1") == 0 ]]; }
succeeded() { [[ $(kc get pod "$1" -o jsonpath='{.status.phase}') == Succeeded ]]; }
e2e_check "a pod that runs 4 s is bound and held by the extender" k8s_wait_for 60 "ends held" ext_holds ends
e2e_check "… it ends (Succeeded)" k8s_wait_for 60 "ends succeeded" succeeded ends
e2e_check "… and the extender lets go of its share within 10 s" k8s_wait_for 10 "ends released" ext_released ends
# Restarted, the extender rebuilds the same books from the annotation and the pod's spec.
allocs_before=$(ext_curl allocations) || true
usage_before=$(jq -c .usage <<<"$allocs_before") || true
echo "extender holds before the restart: $(jq -c '[.allocations[].pod]' <<<"$allocs_before" 2>&1)"
kill -9 "$EXT_PID"
wait "$EXT_PID" 2>/dev/null || true
EXT_PID=
e2e_require "extender restarted" start_extender
usage_after=$(ext_curl allocations | jq -c .usage) || true
echo "extender usage before the restart: $usage_before; after: $usage_after"
e2e_check "the restarted extender holds what it placed (the init share not added)" \
    test "$usage_before" = "$usage_after"

kill "$SCRAPE_PID" 2>/dev/null || true
wait "$SCRAPE_PID" 2>/dev/null || true
SCRAPE_PID=
echo "scrapes for the dashboard's picture: $(ls "$SCRAPES/agent" | wc -l) of the agent, $(ls "$SCRAPES/extender" | wc -l) of the extender in $SCRAPES (make dashboard-png)"
e2e_summary
