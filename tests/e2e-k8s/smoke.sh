#!/usr/bin/env bash
# Smoke test of the one-node Kubernetes e2e cluster (tests/e2e-k8s/cluster.sh;
# no gpushare code involved): build the peers (cached), bring the cluster up,
# run a plain Pod (logs, exec), a Job to completion, restart kube-scheduler and
# kubelet and run another Pod, tear down (no process or mount left behind).
#
#   sudo tests/e2e-k8s/smoke.sh
set -euo pipefail

# shellcheck source=tests/e2e-k8s/cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster.sh"

trap k8s_down EXIT

pod_yaml() { # NAME [LIMITS] -> a busybox Pod (default ServiceAccount, token mounted)
    cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  labels: {app: smoke}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: $E2E_BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: ["sh", "-c", "echo hello; sleep 3600"]
    resources: {limits: {${2:-}}}
EOF
}

job_yaml() {
    cat <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: smoke-job
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      containers:
      - name: main
        image: $E2E_BUSYBOX_IMAGE
        imagePullPolicy: Never
        command: ["sh", "-c", "echo job-done"]
EOF
}

apply_pod() { pod_yaml "$@" | k8s_kubectl apply -f -; }


job_complete() {
    k8s_kubectl wait --for=condition=Complete --timeout=120s job/smoke-job
}

job_logs() { k8s_kubectl logs job/smoke-job; }

pod_gone() { # NAME
    k8s_kubectl wait --for=delete --timeout=60s "pod/$1"
}

no_leftovers() { # ROOT: no process names it, nothing mounted under it, ROOT gone
    local root=$1 p cmd bad=0
    for p in /proc/[0-9]*; do
        cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
        if [[ $cmd == *"$root"* ]] || grep -qF ":$K8S_CGROUP_ROOT/" "$p/cgroup" 2>/dev/null; then
            echo "leftover process ${p#/proc/}: $cmd"
            bad=1
        fi
    done
    if grep -F "$root/" /proc/self/mountinfo; then bad=1; fi
    if mountpoint -q /var/lib/kubelet/device-plugins; then
        echo "/var/lib/kubelet/device-plugins still mounted"
        bad=1
    fi
    if [[ -L /sys/class/net/$K8S_CNI_BRIDGE ]]; then
        echo "bridge $K8S_CNI_BRIDGE still exists"
        bad=1
    fi
    if [[ $had_kube_iptables == no ]] && iptables -S 2>/dev/null | grep -q KUBE-; then
        echo "kubelet's iptables chains still there:"
        iptables -S | grep KUBE-
        bad=1
    fi
    if [[ -e /sys/fs/cgroup/memory$K8S_CGROUP_ROOT || -e /sys/fs/cgroup$K8S_CGROUP_ROOT ]]; then
        echo "cgroup $K8S_CGROUP_ROOT still exists"
        bad=1
    fi
    if [[ -e $root ]]; then
        echo "$root still exists"
        bad=1
    fi
    ((bad == 0))
}

had_kube_iptables=no
if iptables -S 2>/dev/null | grep -q KUBE-; then had_kube_iptables=yes; fi

start=$SECONDS
echo "=== build (cached under target/peers/k8s-$K8S_VERSION)"
e2e_require "peers built (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl)" k8s_build_peers
echo "build: $((SECONDS - start))s"

echo "=== cluster up"
root=$(mktemp -d /tmp/gpushare-k8s.XXXXXX)
up_start=$SECONDS
# k8s_up must run in this shell (exports); e2e_require runs it here.
e2e_require "cluster up, node Ready" k8s_up "$root"
echo "up: $((SECONDS - up_start))s"
e2e_check "kubectl version reports v$K8S_VERSION" e2e_grep_out "v$K8S_VERSION" k8s_kubectl version
e2e_check "node $K8S_NODE Ready" e2e_grep_out True k8s_kubectl get node "$K8S_NODE" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}'
e2e_check "NRI socket exists" test -S "$K8S_NRI_SOCK"
e2e_check "kubelet device-plugin socket in ROOT/kubelet/device-plugins" test -S "$K8S_KUBELET_ROOT/device-plugins/kubelet.sock"
e2e_check "K8S_DEVICE_PLUGIN_DIR is that directory" test "$K8S_DEVICE_PLUGIN_DIR" = "$K8S_KUBELET_ROOT/device-plugins"
e2e_check "same socket at kubelet's compiled-in path" test /var/lib/kubelet/device-plugins/kubelet.sock -ef "$K8S_KUBELET_ROOT/device-plugins/kubelet.sock"
e2e_check "scheduler kubeconfig can list pods" \
    "$K8S_KUBECTL" --kubeconfig "$K8S_SCHEDULER_KUBECONFIG" get pods -A

echo "=== plain Pod"
e2e_check "apply pod smoke-1" apply_pod smoke-1
e2e_check "pod smoke-1 Running" k8s_wait_pod_phase default/smoke-1 Running 120
e2e_check "kubectl logs prints hello" e2e_grep_out '^hello$' k8s_kubectl logs smoke-1
e2e_check "kubectl exec works" e2e_grep_out '^exec-ok$' k8s_kubectl exec smoke-1 -- echo exec-ok
e2e_check "pod got an IP from $K8S_POD_SUBNET" e2e_grep_out '^10\.' k8s_kubectl get pod smoke-1 \
    -o 'jsonpath={.status.podIP}'
e2e_check "service account token mounted" e2e_grep_out token k8s_kubectl exec smoke-1 -- \
    ls /var/run/secrets/kubernetes.io/serviceaccount
e2e_check "delete pod smoke-1" k8s_kubectl delete pod smoke-1 --wait=false
e2e_check "pod smoke-1 gone" pod_gone smoke-1

echo "=== Job"
e2e_check "apply job" eval 'job_yaml | k8s_kubectl apply -f -'
e2e_check "job completes" job_complete
e2e_check "job logs print job-done" e2e_grep_out '^job-done$' job_logs
e2e_check "delete job (cascading)" k8s_kubectl delete job smoke-job --cascade=foreground --timeout=60s

echo "=== restarts"
e2e_check "restart kube-scheduler" k8s_restart_scheduler
e2e_check "restart kubelet" k8s_restart_kubelet
e2e_check "apply pod smoke-2" apply_pod smoke-2
e2e_check "pod smoke-2 Running after restarts" k8s_wait_pod_phase default/smoke-2 Running 120
e2e_check "kubectl logs smoke-2 prints hello" e2e_grep_out '^hello$' k8s_kubectl logs smoke-2
e2e_check "kubectl exec smoke-2 works" e2e_grep_out '^exec-ok$' k8s_kubectl exec smoke-2 -- echo exec-ok

# The extender path (K8S_EXTENDER_URL) is exercised with the real `gpushare scheduler` by
# tests/e2e-k8s/run.sh.

echo "=== teardown"
down_start=$SECONDS
k8s_down
echo "down: $((SECONDS - down_start))s"
e2e_check "teardown leaves no process, mount or directory" no_leftovers "$root"
echo "total: $((SECONDS - start))s"
e2e_summary
