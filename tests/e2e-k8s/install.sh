#!/usr/bin/env bash
# The Helm chart (install/helm/gpushare) on the real one-node Kubernetes cluster of
# cluster.sh (1.36.3, containerd 2.4.2 with NRI, no kube-proxy): no gpushare host process;
# the agent, the extender and its kube-scheduler run as the chart's pods, from images built
# here without a container engine (install/image/build.sh; kube-scheduler and kubectl from
# the cluster's own binaries, tagged as the chart's defaults).
#
#   sudo tests/e2e-k8s/install.sh        (make e2e-install)
#
# helm (helm.sh/helm/v3, tests/peers/helm) is built into target/peers the first time.
# Ends with "N passed, M failed"; exits non-zero on any failure.
set -euo pipefail

# shellcheck source=tests/e2e-k8s/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"
K8S_WAIT_WHO=e2e-install

START=$SECONDS
HELM_VERSION=3.22.0
HELM=$E2E_PEERS_DIR/helm-$HELM_VERSION/helm
CHART=$E2E_REPO/install/helm/gpushare
NS=gpushare-system
RELEASE=gpushare
# Host paths and ports of this test, apart from the defaults (/run/gpushare, 9402, 39999,
# 10259) a node agent or extender of another suite may use on this machine; all below the
# ephemeral range (32768-60999), where an outgoing connection can hold a port.
HOST_DIR=/run/gpushare-e2e-install
STATUS_PORT=19412
EXT_PORT=19443
KS_PORT=19259
ROOT=
WORK=$(mktemp -d /tmp/gpushare-install.XXXXXX)

build_helm() {
    [[ -x $HELM ]] && return 0
    k8s_log "building helm v$HELM_VERSION into ${HELM%/*}"
    mkdir -p "${HELM%/*}"
    (cd "$E2E_REPO/tests/peers/helm" && CGO_ENABLED=0 go build -trimpath -buildvcs=false \
        -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
        -o "$HELM.tmp$$" helm.sh/helm/v3/cmd/helm) && mv -f "$HELM.tmp$$" "$HELM"
}

helm() { "$HELM" ${KUBECONFIG:+--kubeconfig "$KUBECONFIG"} "$@"; }
kc() { k8s_kubectl "$@"; }

cleanup() {
    set +e
    if [[ -n $ROOT ]]; then
        if [[ -n ${K8S_SAVE_LOGS_DIR:-} ]]; then
            mkdir -p "$K8S_SAVE_LOGS_DIR"
            kc -n "$NS" logs -l app.kubernetes.io/instance=$RELEASE --all-containers --prefix \
                --tail=-1 >"$K8S_SAVE_LOGS_DIR/chart-pods.log" 2>&1
        fi
        helm -n "$NS" status "$RELEASE" >/dev/null 2>&1 &&
            helm -n "$NS" uninstall "$RELEASE" --wait --timeout 2m >/dev/null 2>&1
        k8s_down
    fi
    # What the chart would have removed, had the run not got that far.
    if [[ -d $HOST_DIR ]]; then
        find /sys/fs/cgroup -name freezer.state -path '*gpushare-k8s.*' -exec sh -c 'echo THAWED >"$1"' _ {} \; 2>/dev/null
        rm -rf "$HOST_DIR"
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT


job_pod() { kc get pod -l "job-name=$1" -o jsonpath='{.items[0].metadata.name}'; }
pod_running() { [[ $(kc get pod "$1" -o jsonpath='{.status.phase}') == Running ]]; }
job_running() { local p; p=$(job_pod "$1") && [[ -n $p ]] && pod_running "$p"; }
allocatable() { kc get node "$K8S_NODE" -o json | jq -r --arg r "aliyun.com/$1" '.status.allocatable[$r] // ""'; }
alloc_is() { [[ $(allocatable "$1") == "$2" ]]; }
agent_pod() { kc -n "$NS" get pod -l app.kubernetes.io/component=node -o jsonpath='{.items[0].metadata.name}'; }
agent_metrics() { curl -fsS --max-time 5 "http://127.0.0.1:$STATUS_PORT/metrics"; }

# ----------------------------------------------------------------------------- set-up ----
k8s_build_peers
build_helm
e2e_build_images
# The images: gpushare from the release binaries; kube-scheduler and kubectl (the clean-up
# hook's) from the cluster's binaries, under the names the chart defaults to.
GPUSHARE_TAR=$("$E2E_REPO/install/image/build.sh" "$E2E_REPO/target/image/gpushare-e2e.tar")
KS_TAR=$(e2e_image_tar kube-scheduler "registry.k8s.io/kube-scheduler:v$K8S_VERSION" \
    --env PATH=/usr/local/bin:/bin:/usr/bin --copy "$K8S_BIN_DIR/kube-scheduler=/usr/local/bin/kube-scheduler" \
    -- kube-scheduler --help)
KUBECTL_TAR=$(e2e_image_tar kubectl "registry.k8s.io/kubectl:v$K8S_VERSION" \
    --copy "$K8S_BIN_DIR/kubectl=/bin/kubectl" -- kubectl --help)

echo "=== 0. the chart without a cluster"
e2e_check "helm lint" helm lint "$CHART" --set agent.config.gpuBackend=sim
e2e_check "renders with every optional part on (ServiceMonitor, existing TLS secret, enableNri, privileged)" \
    bash -c "'$HELM' template x '$CHART' -n ns --kube-version $K8S_VERSION --set metrics.serviceMonitor.enabled=true \
        --set scheduler.tls.existingSecret=mine --set agent.containerd.enableNri=true \
        --set agent.privileged=true --set scheduler.extraUsers[0]=gpushare-scheduler \
        --set agent.nodeGroup=gpushare:nodes | grep -q 'kind: ServiceMonitor'"
custom_names_everywhere() { # other resource names reach the agent, the extender, kube-scheduler
    local out
    out=$("$HELM" template x "$CHART" -n ns --kube-version "$K8S_VERSION" \
        --set resourceNames.memory=example.com/vgpu-mem --set resourceNames.core=example.com/vgpu-core \
        --set resourceNames.count=example.com/vgpu) || return 1
    local want
    for want in 'memory = "example.com/vgpu-mem"' --memory-resource=example.com/vgpu-mem \
        --core-resource=example.com/vgpu-core --count-resource=example.com/vgpu \
        '- name: example.com/vgpu-mem'; do
        grep -qF -- "$want" <<<"$out" || { echo "missing: $want"; return 1; }
    done
    ! grep -F 'aliyun.com/gpu' <<<"$out" | grep -v '^ *#' | grep -q .
}
e2e_check "resourceNames reach the node config, the extender's flags and kube-scheduler's managedResources" \
    custom_names_everywhere
e2e_check "every value in values.yaml is in the chart's README table" bash -c '
    python3 - "$1/values.yaml" "$1/README.md" <<"EOF"
import sys, yaml
OPAQUE = {"affinity", "updateStrategy", "resources", "nodeSelector", "tolerations",
          "podAnnotations", "labels", "commonLabels"}
def leaves(d, p=""):
    for k, v in d.items():
        q = p + "." + k if p else k
        # Kubernetes fields passed through whole are one value each.
        if isinstance(v, dict) and v and k not in OPAQUE:
            yield from leaves(v, q)
        else:
            yield q
vals = yaml.safe_load(open(sys.argv[1]))
readme = open(sys.argv[2]).read()
missing = [k for k in leaves(vals) if "`" + k + "`" not in readme]
print("\n".join(missing))
sys.exit(1 if missing else 0)
EOF' _ "$CHART"
# The nri init container's script on containerd configs (busybox sh, as in the image).
nri_case() { # CONFIG_TEXT ENABLE -> runs nri-check.sh on it; prints its log, RC, the config
    local d=$WORK/nri.$RANDOM
    mkdir -p "$d"
    printf '%s\n' "$1" >"$d/config.toml"
    NRI_SOCKET=$d/nri.sock CONTAINERD_CONFIG=$d/config.toml ENABLE_NRI=$2 WAIT_SECONDS=2 HOST_EXEC='' \
        RESTART_COMMAND="python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"$d/nri.sock\")'; touch $d/restarted" \
        busybox sh "$CHART/files/nri-check.sh" 2>&1 && echo "RC 0" || echo "RC $?"
    [[ -e $d/restarted ]] && echo RESTARTED
    echo "--- config"
    cat "$d/config.toml"
}
out=$(nri_case $'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  x = 1' true)
e2e_check "nri-check: containerd 1.7 config without NRI, enableNri → section added, containerd restarted, socket found" \
    bash -c 'grep -q "RC 0" <<<"$1" && grep -q RESTARTED <<<"$1" && grep -q "^  disable = false" <<<"$1" && grep -q "socket_path" <<<"$1"' _ "$out"
out=$(nri_case $'version = 2\n[plugins."io.containerd.nri.v1.nri"]\n  disable = true\n  socket_path = "/x"\n[other]\n  y = 2' true)
e2e_check "nri-check: 1.7 config with disable = true → flipped to false in place, other sections kept" \
    bash -c 'grep -q "RC 0" <<<"$1" && ! grep -q "disable = true" <<<"$1" && grep -q "^\[other\]" <<<"$1" && [[ $(grep -c "disable" <<<"$1") == 1 ]]' _ "$out"
out=$(nri_case $'version = 2' false)
e2e_check "nri-check: 1.7 config without NRI, enableNri off → fails, says how, changes nothing" \
    bash -c 'grep -q "RC 1" <<<"$1" && grep -q "enableNri=true" <<<"$1" && ! grep -q RESTARTED <<<"$1" && ! sed -n "/^--- config/,\$p" <<<"$1" | grep -q nri.v1' _ "$out"
out=$(nri_case $'version = 3\n[plugins."io.containerd.nri.v1.nri"]\n  disable = true' true)
e2e_check "nri-check: containerd 2.x config with NRI disabled → verify only: fails, no change, no restart" \
    bash -c 'grep -q "RC 1" <<<"$1" && ! grep -q RESTARTED <<<"$1" && grep -q "disable = true" <<<"$1"' _ "$out"

ROOT=$(mktemp -d /tmp/gpushare-k8s.XXXXXX)
k8s_up "$ROOT"
for tar in "$GPUSHARE_TAR" "$KS_TAR" "$KUBECTL_TAR"; do
    e2e_ctr images import --snapshotter native --platform linux/amd64 "$tar" >"$WORK/import.log" 2>&1 ||
        { cat "$WORK/import.log" >&2; exit 1; }
done
# (The controllers add its default ServiceAccount and kube-root-ca.crt, which pods mount.)
e2e_require "namespace $NS" kc create namespace "$NS"
e2e_require "… with its kube-root-ca.crt" k8s_wait_for 60 "kube-root-ca.crt in $NS" kc -n "$NS" get configmap kube-root-ca.crt
# The seed's user story: the GPU node pool is labelled, then gpushare is installed.
e2e_require "node labelled core_mem / binpack" kc label node "$K8S_NODE" --overwrite \
    ack.node.gpu.schedule=core_mem ack.node.gpu.placement=binpack

VALUES=(
    # No kube-proxy: the API server at its own address, reachable from the node only.
    --set kubernetes.apiServerHost=127.0.0.1 --set kubernetes.apiServerPort="$K8S_API_PORT"
    --set agent.hostNetwork=true --set scheduler.hostNetwork=true
    --set agent.hostDir="$HOST_DIR" --set agent.nriSocket="$K8S_NRI_SOCK"
    --set agent.containerd.configPath="$E2E_ROOT/config.toml"
    --set agent.config.gpuBackend=sim --set agent.config.statusListen="127.0.0.1:$STATUS_PORT"
    --set scheduler.port="$EXT_PORT" --set scheduler.service.port="$EXT_PORT"
    --set scheduler.secondScheduler.securePort="$KS_PORT"
    # Rendered into the profile and validated by kube-scheduler at start (one node: no
    # other effect here).
    --set scheduler.secondScheduler.percentageOfNodesToScore=50
    # The agent's container asks for every GPU, as the chart's own environment does with
    # runtimeClassName nvidia (gpuBackend nvml): it is created while no agent runs, and its
    # resync must not kill it.
    --set-json 'agent.extraEnv=[{"name":"NVIDIA_VISIBLE_DEVICES","value":"all"}]'
    --set 'agent.config.passthroughNamespaces={gpu-system}'
)

echo "=== 1. helm install"
t0=$SECONDS
e2e_require "helm install (--wait: DaemonSet and Deployment ready)" \
    helm install "$RELEASE" "$CHART" -n "$NS" --wait --timeout 3m "${VALUES[@]}"
echo "installed in $((SECONDS - t0)) s"
kc -n "$NS" get ds,deploy,pods -o wide
# (helm --wait counts a DaemonSet ready with maxUnavailable pods not ready: 0 of 1 here.)
e2e_check "agent DaemonSet: 1 of 1 ready" k8s_wait_for 60 "agent ready" bash -c \
    "[[ \$($K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS get ds $RELEASE-node -o jsonpath='{.status.numberReady}/{.status.desiredNumberScheduled}') == 1/1 ]]"
e2e_check "scheduler Deployment: available, both containers ready" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS get pod -l app.kubernetes.io/component=scheduler -o json | jq -e '.items[0].status.containerStatuses | length == 2 and all(.ready)'"
e2e_check "… its kube-scheduler started with the profile's percentageOfNodesToScore 50 (validated at start)" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS get configmap $RELEASE-kube-scheduler -o jsonpath='{.data.config\\.yaml}' | grep -q 'percentageOfNodesToScore: 50'"
AGENT=$(agent_pod)
e2e_check "the agent container is not privileged: root with capabilities MKNOD, KILL, SYS_NICE only, no privilege escalation, seccomp RuntimeDefault" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS get pod $AGENT -o json | jq -e '.spec.securityContext.seccompProfile.type == \"RuntimeDefault\" and (.spec.containers[0].securityContext | (.privileged // false) == false and .capabilities.drop == [\"ALL\"] and .capabilities.add == [\"MKNOD\",\"KILL\",\"SYS_NICE\"] and .allowPrivilegeEscalation == false)'"
kc -n "$NS" logs "$AGENT" -c nri 2>&1 | sed 's/^/    nri: /'
kc -n "$NS" logs "$AGENT" -c limiter 2>&1 | sed 's/^/    limiter: /'
e2e_check "the nri init container found containerd's NRI socket" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS logs $AGENT -c nri | grep -q 'NRI socket .* is there'"
e2e_check "the limiter library was copied onto the host ($HOST_DIR/lib)" \
    cmp "$E2E_REPO/target/release/libgpushare_limiter.so" "$HOST_DIR/lib/libgpushare_limiter.so"

# agent.containerd.enableNri (containerd 1.7): the `nri` init container as the chart renders
# it, in a pod against a containerd 1.7 config without NRI (in WORK), its restart command
# run on the host. (nsenter targets containerd's PID: this VM's PID 1 hides its namespaces
# even from the host's root; on a node it is systemd's, the default.)
nri_enable_pod() {
    local d=$WORK/nri17
    mkdir -p "$d" && printf 'version = 2\n' >"$d/config.toml"
    helm template "$RELEASE" "$CHART" -n "$NS" --kube-version "$K8S_VERSION" "${VALUES[@]}" \
        --set agent.containerd.enableNri=true 2>/dev/null |
        D=$d CPID=$E2E_CONTAINERD_PID python3 -c '
import json, os, sys, yaml
d = os.environ["D"]
for o in yaml.safe_load_all(sys.stdin):
    if not (o and o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-node")):
        continue
    spec = o["spec"]["template"]["spec"]
    c = [x for x in spec["initContainers"] if x["name"] == "nri"][0]
    env = {e["name"]: e for e in c["env"]}
    env["NRI_SOCKET"]["value"] = d + "/nri.sock"
    env["WAIT_SECONDS"]["value"] = "20"
    env["RESTART_COMMAND"]["value"] = ("python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind(\x27%s/nri.sock\x27)\"; echo on-the-host >%s/restarted" % (d, d))
    c["env"] = list(env.values()) + [{"name": "HOST_EXEC", "value": "nsenter -t %s -m -u -i -n -p --" % os.environ["CPID"]}]
    for m in c["volumeMounts"]:
        if m["name"] == "nri":
            m["mountPath"] = d
    vols = [v for v in spec["volumes"] if v["name"] == "scripts"]
    vols += [{"name": "nri", "hostPath": {"path": d}}, {"name": "containerd-config", "hostPath": {"path": d}}]
    print(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nri-enable"},
        "spec": {"securityContext": spec["securityContext"], "hostPID": True, "restartPolicy": "Never",
                 "serviceAccountName": spec["serviceAccountName"], "automountServiceAccountToken": False,
                 "containers": [c], "volumes": vols}}))' >"$WORK/nri-enable.json" || return 1
    jq -c '.spec.containers[0].securityContext' "$WORK/nri-enable.json"
    kc -n "$NS" apply -f "$WORK/nri-enable.json" >/dev/null || return 1
    k8s_wait_for 60 "nri-enable done" bash -c "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS get pod nri-enable -o jsonpath='{.status.phase}' | grep -qE 'Succeeded|Failed'"
    kc -n "$NS" logs nri-enable
    kc -n "$NS" delete pod nri-enable --wait=false >/dev/null
    grep -q '^  disable = false' "$d/config.toml" && [[ $(cat "$d/restarted") == on-the-host && -S $d/nri.sock ]]
}
e2e_check "enableNri: the nri init container (SYS_ADMIN, SYS_CHROOT, SYS_PTRACE; seccomp RuntimeDefault) turns NRI on in a 1.7 config and restarts containerd in the host's namespaces" \
    nri_enable_pod

echo "=== 2. the node: allocatable, annotation, the agent's identity"
e2e_check "allocatable gpu-core.percentage is 400" k8s_wait_for 60 "core 400" alloc_is gpu-core.percentage 400
e2e_check "allocatable gpu-count is 4" alloc_is gpu-count 4
e2e_check "allocatable gpu-mem is 60" alloc_is gpu-mem 60
kc get node "$K8S_NODE" -o yaml | grep -E '^\s+aliyun.com/' | sort -u
# The policy gpushare-node-scope lets an agent identity update only the node its token
# names: the annotation being there shows the token carries it.
e2e_check "node annotation gpushare.io/gpus lists 4 GPUs (the agent passed gpushare-node-scope)" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG get node $K8S_NODE -o json | jq -e '.metadata.annotations[\"gpushare.io/gpus\"] | fromjson | .gpus | length == 4'"
e2e_check "the agent found the admission policies installed (its log)" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS logs $AGENT -c agent | grep -q 'admission policy installed.*gpushare-node-scope'"
TOKEN=$(kc -n "$NS" exec "$AGENT" -c agent -- cat /var/run/secrets/kubernetes.io/serviceaccount/token)
as_agent() { # kubectl with the agent's token only (no kubeconfig, no client certificate)
    "$K8S_KUBECTL" --kubeconfig /dev/null --server "$K8S_API" --certificate-authority "$K8S_CA" \
        --token "$TOKEN" "$@"
}
whoami=$(as_agent auth whoami -o json 2>&1) || true
echo "agent token: $(jq -c '.status.userInfo | {username, extra}' <<<"$whoami" 2>/dev/null || echo "$whoami")"
e2e_check "the agent's token is its ServiceAccount's and names its node (extra authentication.kubernetes.io/node-name)" \
    jq -e --arg n "$K8S_NODE" --arg u "system:serviceaccount:$NS:$RELEASE-node" \
    '.status.userInfo.username == $u and .status.userInfo.extra["authentication.kubernetes.io/node-name"] == [$n]' <<<"$whoami"
out=$(as_agent label node "$K8S_NODE" gpushare-e2e=forged 2>&1) && rc=0 || rc=$?
echo "$out"
e2e_check "with that token a node label change is refused (gpushare-node-scope)" \
    bash -c '[[ $1 -ne 0 ]] && grep -q "may change only the gpushare.io/gpus annotation" <<<"$2"' _ "$rc" "$out"

echo "=== 3. (a) the sample Job through gpushare's kube-scheduler"
k8s_job_yaml sample 2 30 "$K8S_BURN" gpushare-scheduler | kc apply -f - >/dev/null
e2e_check "sample Job's pod (schedulerName gpushare-scheduler) runs" k8s_wait_for 120 "sample running" job_running sample
SAMPLE=$(job_pod sample)
kc get pod "$SAMPLE" -o wide
SGPU=$(kc get pod "$SAMPLE" -o json | jq -r '.metadata.annotations["gpushare.io/assignment"] | fromjson | .containers.main[0].gpuIndex') || SGPU=
e2e_check "it was scheduled by gpushare-scheduler (the chart's kube-scheduler)" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG get events -o json --field-selector involvedObject.name=$SAMPLE,reason=Scheduled | jq -e '[.items[] | (.reportingComponent // .source.component)] | index(\"gpushare-scheduler\") != null'"
e2e_check "the assignment names one GPU with 2048 MiB and 30 %" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG get pod $SAMPLE -o json | jq -e '.metadata.annotations[\"gpushare.io/assignment\"] | fromjson | .containers.main | length == 1 and .[0].memoryMiB == 2048 and .[0].corePercent == 30'"
e2e_check "in the container only that GPU's device node exists (nvidia$SGPU)" bash -c \
    "[[ \$($K8S_KUBECTL --kubeconfig $KUBECONFIG exec $SAMPLE -- ls /dev | grep -E '^nvidia[0-9]+$' | tr '\n' ' ') == 'nvidia$SGPU ' ]]"
envs=$(kc exec "$SAMPLE" -- env 2>&1 | grep -E '^(NVIDIA_VISIBLE_DEVICES|GPUSHARE_GPU_)' | sort) || true
echo "$envs"
e2e_check "its environment: NVIDIA_VISIBLE_DEVICES, GPUSHARE_GPU_MEMORY_MIB=2048, GPUSHARE_GPU_CORE_PERCENT=30" bash -c \
    'grep -q "^NVIDIA_VISIBLE_DEVICES=" <<<"$1" && grep -qx GPUSHARE_GPU_MEMORY_MIB=2048 <<<"$1" && grep -qx GPUSHARE_GPU_CORE_PERCENT=30 <<<"$1"' _ "$envs"
e2e_check "the limiter is in the container (the host's copy, preloaded)" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG exec $SAMPLE -- sh -c 'test -s /usr/lib/gpushare/libgpushare_limiter.so && grep -q libgpushare_limiter /etc/ld.so.preload'"
e2e_check "the agent holds its quota (metric gpushare_container_gpu_core_quota_ratio 0.30)" bash -c \
    "curl -fsS --max-time 5 127.0.0.1:$STATUS_PORT/metrics | grep -q 'gpushare_container_gpu_core_quota_ratio{pod=\"default/$SAMPLE\".*} 0.30'"

echo "=== 3b. containers granted no GPU: void, except in a passthrough namespace"
env_pod() { # NAME NAMESPACE: a pod without a GPU whose spec asks for every GPU
    printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: %s}\nspec:\n' "$1" "$2"
    { k8s_pod_spec "" "" "sleep 3600"; echo "  env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]"; } | k8s_indent 2
}
env_of() { kc -n "$1" exec "$2" -- env 2>/dev/null | grep '^NVIDIA_VISIBLE_DEVICES='; }
env_is() { [[ $(env_of "$1" "$2") == "NVIDIA_VISIBLE_DEVICES=$3" ]]; } # NAMESPACE POD VALUE
e2e_require "namespace gpu-system" kc create namespace gpu-system
e2e_require "… with its default ServiceAccount" k8s_wait_for 60 "default ServiceAccount in gpu-system" \
    kc -n gpu-system get serviceaccount default
env_pod cuda-plain default | kc apply -f - >/dev/null
env_pod cuda-exempt gpu-system | kc apply -f - >/dev/null
e2e_check "a pod granted no GPU whose spec says NVIDIA_VISIBLE_DEVICES=all gets void" \
    k8s_wait_for 60 "cuda-plain's environment" env_is default cuda-plain void
e2e_check "… in the passthrough namespace gpu-system (agent.config.passthroughNamespaces) it keeps all" \
    k8s_wait_for 60 "cuda-exempt's environment" env_is gpu-system cuda-exempt all
echo "    default/cuda-plain: $(env_of default cuda-plain); gpu-system/cuda-exempt: $(env_of gpu-system cuda-exempt)"
e2e_check "the agent counted it (gpushare_create_container_total{result=\"exempt\"} 1)" bash -c \
    "curl -fsS --max-time 5 127.0.0.1:$STATUS_PORT/metrics | grep -qx 'gpushare_create_container_total{result=\"exempt\"} 1'"
kc delete pod cuda-plain --wait=false >/dev/null
kc -n gpu-system delete pod cuda-exempt --wait=false >/dev/null

echo "=== 4. admission"
out=$(k8s_job_yaml bad33 2 33 'sleep 1' gpushare-scheduler | kc apply -f - 2>&1) && rc=0 || rc=$?
echo "$out"
e2e_check "a Job with gpu-core.percentage 33 is refused at kubectl apply, with the reason" \
    bash -c '[[ $1 -ne 0 ]] && grep -q "aliyun.com/gpu-core.percentage 33 of container \"main\" is not a multiple of 5" <<<"$2"' _ "$rc" "$out"
e2e_check "… and nothing was created" bash -c "! $K8S_KUBECTL --kubeconfig $KUBECONFIG get job bad33 2>/dev/null"

echo "=== 5. (b) the default kube-scheduler calling the chart's extender"
# The cluster's own kube-scheduler (a host process here) gets the extender entry of
# NOTES.txt, with kube-scheduler's files from the chart's Secret; the extender listens on the
# node's addresses (hostNetwork), where its certificate's 127.0.0.1 leads.
EXT_TLS=$WORK/ext-tls
mkdir -p "$EXT_TLS"
for k in ca.crt:ca.crt client.crt:kube-scheduler.crt client.key:kube-scheduler.key; do
    kc -n "$NS" get secret "$RELEASE-extender-tls" -o json | jq -r --arg k "${k%%:*}" '.data[$k]' | base64 -d >"$EXT_TLS/${k#*:}"
done
export K8S_EXTENDER_URL=https://127.0.0.1:$EXT_PORT K8S_EXTENDER_TLS_DIR=$EXT_TLS
e2e_require "default kube-scheduler restarted with the extender" k8s_restart_scheduler
k8s_job_yaml plain 1 10 'sleep 3600' default-scheduler | kc apply -f - >/dev/null
e2e_check "a Job of the default scheduler (1 GiB, 10 %) runs" k8s_wait_for 120 "plain running" job_running plain
PLAIN=$(job_pod plain)
e2e_check "… placed by the extender (assignment 1024 MiB, 10 %, on the sample's GPU: binpack)" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG get pod $PLAIN -o json | jq -e --argjson g ${SGPU:-0} '.metadata.annotations[\"gpushare.io/assignment\"] | fromjson | .containers.main[0] | .memoryMiB == 1024 and .corePercent == 10 and .gpuIndex == \$g'"
kc delete job plain --wait=false >/dev/null

echo "=== 5. (c) the agent killed: the guardian container thaws, and is not restarted"
guardian_status() { kc -n "$NS" get pod "$AGENT" -o json | jq -c '.status.containerStatuses[] | select(.name == "guardian") | {restartCount, ready, startedAt: .state.running.startedAt}'; }
e2e_check "the guardian container runs beside the agent: root, no capability, no privilege escalation" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS get pod $AGENT -o json | jq -e '(.spec.containers[1] | .name == \"guardian\" and .securityContext.capabilities.drop == [\"ALL\"] and .securityContext.capabilities.add == null and .securityContext.allowPrivilegeEscalation == false) and ([.status.containerStatuses[] | select(.name == \"guardian\" and .ready)] | length == 1)'"
agent_restarts=$(kc -n "$NS" get pod "$AGENT" -o json | jq '.status.containerStatuses[] | select(.name == "agent") | .restartCount')
guardian_before=$(guardian_status)
# The sample (30 %) is duty-cycled: the agent's guardian list names its cgroup.
pkill -KILL -f '^/usr/local/bin/gpushare node --config' || true
e2e_check "a SIGKILL of the agent: the guardian container saw it go and thawed (its log)" k8s_wait_for 20 "guardian log" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS logs $AGENT -c guardian | grep -E 'agent gone, thawed [0-9]+ cgroup'"
e2e_check "… the agent container restarted and is ready again, the guardian container was not restarted" k8s_wait_for 90 "agent back" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS get pod $AGENT -o json | jq -e --argjson r $agent_restarts '[.status.containerStatuses[] | select((.name == \"agent\" and .restartCount > \$r and .ready) or (.name == \"guardian\" and .restartCount == 0 and .ready))] | length == 2'"
echo "    guardian before: $guardian_before; after: $(guardian_status)"
# Its container (NVIDIA_VISIBLE_DEVICES=all, created while no agent ran) is one the resync
# kills in other pods; the agent knows its own.
sleep 5
e2e_check "… the restarted agent did not kill its own container at its resync (restarted once, ready 5 s later, no kill logged)" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS get pod $AGENT -o json | jq -e --argjson r $agent_restarts '.status.containerStatuses[] | select(.name == \"agent\") | .restartCount == \$r + 1 and .ready' &&
     ! $K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS logs $AGENT -c agent | grep -q 'adjustment: killed'"
kc -n "$NS" logs "$AGENT" -c guardian 2>&1 | sed 's/^/    guardian: /'

echo "=== 6. helm upgrade: the agent replaced, host files and certificates kept"
ca_before=$(kc -n "$NS" get secret "$RELEASE-extender-tls" -o jsonpath='{.data.ca\.crt}')
sample_id=$(kc get pod "$SAMPLE" -o jsonpath='{.status.containerStatuses[0].containerID}' | sed 's|.*://||')
lib_inode=$(stat -c %i "$HOST_DIR/lib/libgpushare_limiter.so")
e2e_check "helm upgrade (agent log level debug: a new agent pod)" \
    helm upgrade "$RELEASE" "$CHART" -n "$NS" --wait --timeout 3m --reuse-values --set agent.config.log.level=debug
e2e_check "the agent pod was replaced and is ready" k8s_wait_for 90 "new agent ready" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG -n $NS get pod -l app.kubernetes.io/component=node -o json | jq -e '[.items[] | select(.metadata.name != \"$AGENT\" and .metadata.deletionTimestamp == null) | .status.conditions[]? | select(.type == \"Ready\" and .status == \"True\")] | length == 1'"
e2e_check "the running sample's limiter files are still on the host" test -s "$HOST_DIR/limiter/$sample_id/limits.json"
e2e_check "the limiter library is the same file (an unchanged library is not rewritten)" \
    test "$(stat -c %i "$HOST_DIR/lib/libgpushare_limiter.so")" = "$lib_inode"
e2e_check "the sample still runs, and the new agent holds it again (metric)" k8s_wait_for 60 "sample in the new agent" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG get pod $SAMPLE -o jsonpath='{.status.phase}' | grep -qx Running && curl -fsS --max-time 5 127.0.0.1:$STATUS_PORT/metrics | grep -q 'gpushare_container_gpu_core_quota_ratio{pod=\"default/$SAMPLE\".*} 0.30'"
e2e_check "the extender's certificates were kept" test "$(kc -n "$NS" get secret "$RELEASE-extender-tls" -o jsonpath='{.data.ca\.crt}')" = "$ca_before"

echo "=== 7. helm uninstall: no object, no host file left"
sample_cg=$(find /sys/fs/cgroup/freezer -type d -name "*$sample_id*" 2>/dev/null | head -n 1)
t0=$SECONDS
e2e_check "helm uninstall (pre-delete clean-up hook)" helm -n "$NS" uninstall "$RELEASE" --wait --timeout 5m
echo "uninstalled in $((SECONDS - t0)) s"
gone() { # no pod of the release is left (hook pods included)
    [[ -z $(kc -n "$NS" get pods -l app.kubernetes.io/instance=$RELEASE -o name 2>/dev/null) ]]
}
e2e_check "every pod of the release is gone" k8s_wait_for 60 "pods gone" gone
leftovers() { # every object whose name or namespace says gpushare, but the test's namespace
    # and the node (named gpushare-node: its Node, Lease, CSINode)
    local r
    for r in $(kc api-resources --verbs=list -o name | grep -v '^events'); do
        kc get "$r" -A -o json 2>/dev/null | jq -r --arg r "$r" --arg ns "$NS" --arg node "$K8S_NODE" '.items[]
            | select((.metadata.name | test("gpushare")) or (.metadata.namespace // "" ) == $ns)
            | select((.metadata.name == $node or (.metadata.name | startswith($node + "."))) | not)
            | select(($r == "namespaces" and .metadata.name == $ns) | not)
            | select(($r == "serviceaccounts" or $r == "configmaps") and .metadata.namespace == $ns
                     and (.metadata.name == "default" or .metadata.name == "kube-root-ca.crt") | not)
            | "\($r) \(.metadata.namespace // "-")/\(.metadata.name)"'
    done
}
no_leftovers() { [[ -z $(leftovers) ]]; }
# (What the garbage collector removes after its owner: ReplicaSets, ControllerRevisions, the
# hook's pods, takes a moment.)
leftovers_gone() { k8s_wait_for 90 "no leftovers" no_leftovers || { leftovers; return 1; }; }
e2e_check "no gpushare object is left (cluster-scoped or in $NS)" leftovers_gone
e2e_check "no host directory is left ($HOST_DIR)" test ! -e "$HOST_DIR"
e2e_check "no gpushare socket is left in the device-plugin directory" bash -c \
    "! ls $K8S_HOST_DEVICE_PLUGIN_DIR/gpushare-* 2>/dev/null"
e2e_check "the node annotation gpushare.io/gpus is gone" bash -c \
    "$K8S_KUBECTL --kubeconfig $KUBECONFIG get node $K8S_NODE -o json | jq -e '.metadata.annotations[\"gpushare.io/gpus\"] == null'"
if [[ -n $sample_cg && -f $sample_cg/freezer.state ]]; then
    e2e_check "the sample (30 %, duty-cycled until then) is left thawed" bash -c "[[ \$(cat $sample_cg/freezer.state) == THAWED ]]"
fi
e2e_check "the sample still runs, unmanaged" pod_running "$SAMPLE"

echo "e2e-install: $((SECONDS - START)) s"
e2e_summary
