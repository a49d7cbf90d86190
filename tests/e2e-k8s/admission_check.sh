#!/usr/bin/env bash
# Checks install/admission-policy.yaml against a real kube-apiserver: bad GPU requests of
# Pods, Jobs, CronJobs and Deployments/ReplicaSets/StatefulSets/DaemonSets are refused with
# the policy's message, good ones accepted; gpushare.io/assignment is settable only by the
# gpushare scheduler; gpushare.io/granted-* never; a node agent identity changes only its own
# node's gpushare.io/gpus annotation (standalone mode, which makes that identity).
#
# Standalone (default): starts a throwaway etcd + kube-apiserver (no kubelet, no root needed)
# from target/peers/k8s-$K8S_VERSION/ (override K8S_BIN_DIR) in a temp dir, removed at exit.
# Against a running cluster instead: set ADMISSION_KUBECONFIG (a cluster admin) and
# ADMISSION_SCHEDULER_KUBECONFIG (user gpushare-scheduler, or the service account
# kube-system:gpushare-scheduler); the script works in namespace gpushare-admission and
# deletes it, the policies and its ClusterRoleBinding at the end.
#
# Settings: ADMISSION_ETCD_PORT (23990), ADMISSION_API_PORT (16643), KEEP=1 keeps the temp
# dir and the servers' logs. Needs openssl, curl, jq.
# Output: one line per check (ok / FAIL), then "admission: N passed, M failed"; exit 1 on any
# failure.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
POLICY=$REPO/install/admission-policy.yaml
K8S_VERSION=${K8S_VERSION:-1.36.3}
BIN=${K8S_BIN_DIR:-$REPO/target/peers/k8s-$K8S_VERSION}
KUBECTL=${KUBECTL:-$BIN/kubectl}
NS=gpushare-admission
PASSED=0
FAILED=0

# shellcheck source=tests/e2e-k8s/pki.sh
source "$REPO/tests/e2e-k8s/pki.sh"

log() { echo "admission: $*" >&2; }
die() {
    log "$*"
    exit 1
}

for t in openssl curl jq; do
    command -v "$t" >/dev/null || die "$t not found (apt-get install $t)"
done
[[ -x $KUBECTL ]] || die "kubectl not found at $KUBECTL (build it: source tests/e2e-k8s/cluster.sh && k8s_build_peers)"

# ------------------------------------------------------- throwaway cluster ----
ROOT=
PIDS=()
cleanup() {
    local i pid deadline
    # apiserver before etcd (it drains against etcd); SIGKILL after 15 s.
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        pid=${PIDS[i]}
        kill -TERM "$pid" 2>/dev/null || continue
        deadline=$((SECONDS + 15))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n $ROOT && -d $ROOT ]]; then
        if [[ ${KEEP:-0} == 1 ]]; then
            log "kept $ROOT"
        else
            rm -rf "$ROOT"
        fi
    fi
}

wait_for() { # SECONDS DESC LOG CMD...
    local deadline=$((SECONDS + $1)) desc=$2 logf=$3
    shift 3
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "$desc: not after ${1}s; tail of $logf:"
            tail -n 30 "$logf" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
}

start_cluster() {
    local etcd_port=${ADMISSION_ETCD_PORT:-23990}
    API_PORT=${ADMISSION_API_PORT:-16643}
    [[ -x $BIN/etcd && -x $BIN/kube-apiserver ]] ||
        die "etcd/kube-apiserver not in $BIN (build them: source tests/e2e-k8s/cluster.sh && k8s_build_peers)"
    ROOT=$(mktemp -d /tmp/gpushare-admission.XXXXXX)
    trap cleanup EXIT
    # PKI in ROOT itself (tests/e2e-k8s/pki.sh), valid 2 days.
    if ! { pki_ca "$ROOT" "/CN=gpushare-admission-ca" 2 &&
        pki_cert "$ROOT" 2 apiserver "/CN=kube-apiserver" serverAuth "DNS:localhost,IP:127.0.0.1" &&
        pki_cert "$ROOT" 2 admin "/O=system:masters/CN=kubernetes-admin" clientAuth &&
        pki_cert "$ROOT" 2 scheduler "/CN=gpushare-scheduler" clientAuth &&
        pki_cert "$ROOT" 2 agent-a "/O=gpushare:nodes/CN=gpushare-node:node-a" clientAuth &&
        pki_sa_keys "$ROOT"; }; then
        die "could not make the certificates (openssl errors above)"
    fi
    pki_kubeconfig "$ROOT/admin.kubeconfig" "$ROOT" admin kubernetes-admin "https://127.0.0.1:$API_PORT" admission
    pki_kubeconfig "$ROOT/scheduler.kubeconfig" "$ROOT" scheduler gpushare-scheduler "https://127.0.0.1:$API_PORT" admission
    pki_kubeconfig "$ROOT/agent-a.kubeconfig" "$ROOT" agent-a gpushare-node:node-a "https://127.0.0.1:$API_PORT" admission
    AGENT=$ROOT/agent-a.kubeconfig
    ADMIN=$ROOT/admin.kubeconfig
    SCHED=$ROOT/scheduler.kubeconfig

    "$BIN/etcd" --name admission --data-dir "$ROOT/etcd" \
        --listen-client-urls "http://127.0.0.1:$etcd_port" \
        --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$((etcd_port + 10))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 10))" \
        --initial-cluster "admission=http://127.0.0.1:$((etcd_port + 10))" \
        --unsafe-no-fsync --log-level warn </dev/null >"$ROOT/etcd.log" 2>&1 &
    PIDS+=($!)
    wait_for 60 "etcd health" "$ROOT/etcd.log" curl -fs --max-time 2 "http://127.0.0.1:$etcd_port/health"

    "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
        --cert-dir "$ROOT" --tls-cert-file "$ROOT/apiserver.crt" \
        --tls-private-key-file "$ROOT/apiserver.key" --client-ca-file "$ROOT/ca.crt" \
        --authorization-mode RBAC \
        --service-cluster-ip-range 10.97.0.0/16 \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$ROOT/sa.pub" \
        --service-account-signing-key-file "$ROOT/sa.key" \
        --endpoint-reconciler-type none --profiling=false \
        </dev/null >"$ROOT/apiserver.log" 2>&1 &
    PIDS+=($!)
    wait_for 180 "kube-apiserver /readyz" "$ROOT/apiserver.log" \
        "$KUBECTL" --kubeconfig "$ADMIN" get --raw /readyz
    log "kube-apiserver up at https://127.0.0.1:$API_PORT ($("$KUBECTL" --kubeconfig "$ADMIN" version -o json | jq -r .serverVersion.gitVersion))"
}

if [[ -n ${ADMISSION_KUBECONFIG:-} ]]; then
    [[ -n ${ADMISSION_SCHEDULER_KUBECONFIG:-} ]] || die "ADMISSION_SCHEDULER_KUBECONFIG is needed with ADMISSION_KUBECONFIG"
    ADMIN=$ADMISSION_KUBECONFIG
    SCHED=$ADMISSION_SCHEDULER_KUBECONFIG
    trap 'as_admin delete namespace $NS --wait=false >/dev/null 2>&1 || true; as_admin delete -f "$POLICY" >/dev/null 2>&1 || true; as_admin delete clusterrolebinding gpushare-admission-check >/dev/null 2>&1 || true' EXIT
else
    start_cluster
fi

as_admin() { "$KUBECTL" --kubeconfig "$ADMIN" "$@"; }
as_sched() { "$KUBECTL" --kubeconfig "$SCHED" "$@"; }

# ------------------------------------------------------------- objects ----
# container NAME MEM CORE: a container JSON; MEM/CORE empty = not requested.
container() {
    jq -cn --arg n "$1" --arg m "$2" --arg c "$3" '{name: $n, image: "busybox",
        resources: {limits: ({} + (if $m == "" then {} else {"aliyun.com/gpu-mem": $m} end)
                                + (if $c == "" then {} else {"aliyun.com/gpu-core.percentage": $c} end))}}'
}

# podspec MEM CORE [INIT_CORE]: a pod spec with container "main" (and init container "setup").
podspec() {
    local init='[]'
    [[ -z ${3:-} ]] || init="[$(container setup 1 "$3")]"
    jq -cn --argjson c "$(container main "$1" "$2")" --argjson i "$init" \
        '{containers: [$c], initContainers: $i, restartPolicy: "Never", automountServiceAccountToken: false}'
}

# object KIND NAME SPEC [ANNOTATIONS_JSON]: the object of KIND whose pod (template) has SPEC
# and, for Pods and templates, ANNOTATIONS_JSON.
object() {
    local kind=$1 name=$2 spec=$3 ann=${4:-'{}'}
    jq -cn --arg kind "$kind" --arg name "$name" --argjson spec "$spec" --argjson ann "$ann" '
      def tmpl: {metadata: {labels: {app: $name}, annotations: $ann}, spec: $spec};
      def always: tmpl | .spec.restartPolicy = "Always";
      def sel: {matchLabels: {app: $name}};
      {metadata: {name: $name}} +
      if $kind == "Pod" then {apiVersion: "v1", kind: "Pod", metadata: {name: $name, annotations: $ann}, spec: $spec}
      elif $kind == "Job" then {apiVersion: "batch/v1", kind: "Job", spec: {template: tmpl}}
      elif $kind == "CronJob" then {apiVersion: "batch/v1", kind: "CronJob",
            spec: {schedule: "0 0 * * *", jobTemplate: {spec: {template: tmpl}}}}
      elif $kind == "Deployment" then {apiVersion: "apps/v1", kind: "Deployment", spec: {selector: sel, template: always}}
      elif $kind == "ReplicaSet" then {apiVersion: "apps/v1", kind: "ReplicaSet", spec: {selector: sel, template: always}}
      elif $kind == "StatefulSet" then {apiVersion: "apps/v1", kind: "StatefulSet", spec: {selector: sel, serviceName: $name, template: always}}
      elif $kind == "DaemonSet" then {apiVersion: "apps/v1", kind: "DaemonSet", spec: {selector: sel, template: always}}
      else error("unknown kind " + $kind) end'
}

# ------------------------------------------------------------- checks ----
pass() {
    PASSED=$((PASSED + 1))
    echo "ok    $1"
}
fail() {
    FAILED=$((FAILED + 1))
    echo "FAIL  $1"
    [[ -z ${2:-} ]] || printf '      %s\n' "$2"
}

# cmd_refused DESC WANT CMD...: CMD fails and its error contains WANT.
cmd_refused() {
    local desc=$1 want=$2 out
    shift 2
    if out=$("$@" 2>&1); then
        fail "$desc" "accepted: $out"
    elif [[ $out == *"$want"* ]]; then
        pass "$desc"
        echo "      $out"
    else
        fail "$desc" "refused, but without \"$want\": $out"
    fi
}
# cmd_accepted DESC CMD...: CMD succeeds.
cmd_accepted() {
    local desc=$1 out
    shift
    if out=$("$@" 2>&1); then
        pass "$desc"
    else
        fail "$desc" "$out"
    fi
}

create_as() { echo "$2" | "as_$1" -n "$NS" create -f -; } # WHO JSON

# refused DESC WANT WHO JSON: creating JSON as WHO (admin|sched) fails and the error contains WANT.
refused() { cmd_refused "$1" "$2" create_as "$3" "$4"; }

# accepted DESC WHO JSON
accepted() { cmd_accepted "$1" create_as "$2" "$3"; }

core_msg() { echo "aliyun.com/gpu-core.percentage $1 of container \"$2\" is not a multiple of 5 in [5, 100]"; }
ASSIGN='{"version":1,"containers":{"main":[{"gpuIndex":0,"memoryMiB":2048,"corePercent":30}]}}'
ASSIGN2='{"version":1,"containers":{"main":[{"gpuIndex":1,"memoryMiB":2048,"corePercent":30}]}}'

# ----------------------------------------------------------------- setup ----
as_admin create namespace "$NS" >/dev/null
as_admin -n "$NS" create serviceaccount default >/dev/null 2>&1 || true # no controller manager here
as_admin create clusterrolebinding gpushare-admission-check --clusterrole cluster-admin \
    --user gpushare-scheduler --serviceaccount kube-system:gpushare-scheduler >/dev/null
# Admitted before the policy exists: must stay manageable.
as_admin -n "$NS" create -f - >/dev/null <<<"$(object Deployment legacy "$(podspec 2 33)")"

as_admin apply -f "$POLICY"
# Policies take effect asynchronously: wait until a bad pod is refused (server-side dry run
# goes through admission).
probe() { ! object Pod probe "$(podspec 2 33)" | as_admin -n "$NS" create --dry-run=server -f - >/dev/null 2>&1; }
deadline=$((SECONDS + 60))
until probe; do
    ((SECONDS < deadline)) || die "policy not in force after 60s: $(as_admin get validatingadmissionpolicies -o json | jq -c '[.items[] | {name: .metadata.name, status}]')"
    sleep 1
done
for p in $(as_admin get validatingadmissionpolicies -o name); do
    w=$(as_admin get "$p" -o json | jq -c '.status.typeChecking.expressionWarnings // empty')
    if [[ -n $w ]]; then fail "$p type-checks" "$w"; else pass "$p type-checks without warnings"; fi
done

# ------------------------------------------------------- resource checks ----
refused "Pod core 33 refused" "$(core_msg 33 main)" admin "$(object Pod core33 "$(podspec 2 33)")"
accepted "Pod core 30 accepted" admin "$(object Pod core30 "$(podspec 2 30)")"
accepted "Pod core 5 and 100 accepted" admin "$(object Pod core5 "$(podspec 2 5 100)")"
accepted "Pod with no GPU accepted" admin "$(object Pod plain "$(podspec "" "")")"
accepted "Pod memory-only accepted" admin "$(object Pod memonly "$(podspec 3 "")")"
refused "Pod core 0 refused" "$(core_msg 0 main)" admin "$(object Pod core0 "$(podspec 2 0)")"
refused "Pod core 105 refused" "$(core_msg 105 main)" admin "$(object Pod core105 "$(podspec 2 105)")"
refused "Pod initContainer core 33 refused" "$(core_msg 33 setup)" admin "$(object Pod init33 "$(podspec 2 30 33)")"
refused "Pod gpu-mem 0 refused" 'aliyun.com/gpu-mem 0 of container "main" is not a positive integer' \
    admin "$(object Pod mem0 "$(podspec 0 30)")"
refused "Pod core without gpu-mem refused" \
    'aliyun.com/gpu-core.percentage 30 of container "main" is requested without aliyun.com/gpu-mem' \
    admin "$(object Pod nomem "$(podspec "" 30)")"
refused "Job core 33 refused" "$(core_msg 33 main)" admin "$(object Job job33 "$(podspec 2 33)")"
accepted "Job core 30 accepted" admin "$(object Job job30 "$(podspec 2 30)")"
refused "CronJob core 33 refused" "$(core_msg 33 main)" admin "$(object CronJob cron33 "$(podspec 2 33)")"
accepted "CronJob core 30 accepted" admin "$(object CronJob cron30 "$(podspec 2 30)")"
for kind in Deployment ReplicaSet StatefulSet DaemonSet; do
    lower=$(tr '[:upper:]' '[:lower:]' <<<"$kind")
    refused "$kind core 33 refused" "$(core_msg 33 main)" admin "$(object "$kind" "${lower}33" "$(podspec 2 33)")"
done
accepted "Deployment core 30 accepted" admin "$(object Deployment deploy30 "$(podspec 2 30)")"
cmd_refused "Deployment update to core 33 refused" "$(core_msg 33 main)" \
    as_admin -n "$NS" patch deployment deploy30 --type=json \
    -p '[{"op":"replace","path":"/spec/template/spec/containers/0/resources/limits/aliyun.com~1gpu-core.percentage","value":"33"}]'
cmd_accepted "pre-existing bad Deployment: label and scale still allowed" \
    sh -c "'$KUBECTL' --kubeconfig '$ADMIN' -n $NS label deployment legacy team=a >/dev/null &&
           '$KUBECTL' --kubeconfig '$ADMIN' -n $NS scale deployment legacy --replicas=2 >/dev/null"
cmd_refused "pre-existing bad Deployment: template change refused" "$(core_msg 33 main)" \
    as_admin -n "$NS" set image deployment/legacy main=busybox:2
refused "Deployment template with gpushare.io/assignment refused" \
    "pod template annotation gpushare.io/assignment is reserved" admin \
    "$(object Deployment forged "$(podspec 2 30)" "$(jq -cn --arg a "$ASSIGN" '{"gpushare.io/assignment": $a}')")"

# ----------------------------------------------------- annotation checks ----
ann() { jq -cn --arg k "$1" --arg v "$2" '{($k): $v}'; }
refused "Pod with gpushare.io/assignment refused for the admin" \
    "annotation gpushare.io/assignment is written only by the gpushare scheduler; user kubernetes-admin may not set it" \
    admin "$(object Pod forged "$(podspec 2 30)" "$(ann gpushare.io/assignment "$ASSIGN")")"
accepted "Pod with gpushare.io/assignment accepted for the scheduler" sched \
    "$(object Pod assigned "$(podspec 2 30)" "$(ann gpushare.io/assignment "$ASSIGN")")"
cmd_refused "admin changing the assignment refused" "may not change it" \
    as_admin -n "$NS" annotate --overwrite pod assigned "gpushare.io/assignment=$ASSIGN2"
cmd_refused "admin removing the assignment refused" "may not change it" \
    as_admin -n "$NS" annotate pod assigned gpushare.io/assignment-
cmd_accepted "admin labelling an assigned pod allowed" \
    as_admin -n "$NS" label pod assigned team=a
cmd_accepted "scheduler changing the assignment allowed" \
    as_sched -n "$NS" annotate --overwrite pod assigned "gpushare.io/assignment=$ASSIGN2"
cmd_refused "admin adding an assignment to a pod refused" "may not change it" \
    as_admin -n "$NS" annotate pod core30 "gpushare.io/assignment=$ASSIGN"
cmd_refused "admin adding an assignment through pods/status refused" "may not change it" \
    as_admin -n "$NS" patch pod core30 --subresource=status --type=merge \
    -p "$(jq -cn --arg a "$ASSIGN" '{metadata: {annotations: {"gpushare.io/assignment": $a}}}')"
binding=$(jq -cn --arg a "$ASSIGN" '{apiVersion: "v1", kind: "Binding", metadata: {name: "core30", annotations: {"gpushare.io/assignment": $a}}, target: {apiVersion: "v1", kind: "Node", name: "node-a"}}')
cmd_refused "admin binding with an assignment annotation refused" "may not set it" \
    sh -c "echo '$binding' | '$KUBECTL' --kubeconfig '$ADMIN' create --raw /api/v1/namespaces/$NS/pods/core30/binding -f -"
refused "Pod with gpushare.io/granted-mem refused" \
    "annotation gpushare.io/granted-mem is a container annotation kubelet sets from the gpushare device plugin; a pod may not carry it" \
    admin "$(object Pod granted "$(podspec 2 30)" "$(ann gpushare.io/granted-mem 2)")"
refused "Pod with gpushare.io/granted-core refused for the scheduler too" \
    "annotation gpushare.io/granted-core is a container annotation" \
    sched "$(object Pod granted2 "$(podspec 2 30)" "$(ann gpushare.io/granted-core 30)")"

# ------------------------------------------------------- node agent scope ----
if [[ -n ${AGENT:-} ]]; then
    as_agent() { "$KUBECTL" --kubeconfig "$AGENT" "$@"; }
    as_admin apply -f "$REPO/install/scheduler-rbac.yaml" >/dev/null
    for n in node-a node-b; do
        as_admin create -f - >/dev/null <<<"{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"$n\",\"labels\":{\"ack.node.gpu.schedule\":\"core_mem\"}}}"
    done
    GPUS='{"version":1,"gpus":[]}'
    cmd_accepted "node agent annotating its own node with gpushare.io/gpus allowed" \
        as_agent annotate --overwrite node node-a "gpushare.io/gpus=$GPUS"
    cmd_refused "node agent annotating another node refused" \
        "gpushare node agent gpushare-node:node-a may change its own node only, not node-b" \
        as_agent annotate --overwrite node node-b "gpushare.io/gpus=$GPUS"
    cmd_refused "node agent relabelling its own node refused" \
        "may change only the gpushare.io/gpus annotation of node node-a" \
        as_agent label --overwrite node node-a ack.node.gpu.schedule=share
    cmd_refused "node agent tainting its own node refused" \
        "may change only the gpushare.io/gpus annotation of node node-a" \
        as_agent taint node node-a gpushare=x:NoSchedule
    cmd_refused "node agent setting another annotation refused" \
        "may change only the gpushare.io/gpus annotation of node node-a" \
        as_agent annotate node node-a other=1
    cmd_refused "node agent deleting a node refused" "forbidden" \
        as_agent delete node node-b
    cmd_accepted "the admin still relabels nodes" \
        as_admin label --overwrite node node-b ack.node.gpu.schedule=share
fi

echo "admission: $PASSED passed, $FAILED failed"
((FAILED == 0))
