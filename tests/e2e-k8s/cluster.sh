# shellcheck shell=bash
# One-node Kubernetes cluster for end-to-end tests: etcd, kube-apiserver,
# kube-scheduler (optionally with a scheduler extender), a minimal
# kube-controller-manager, kubelet and containerd 2.x (from tests/e2e/lib.sh,
# NRI enabled), all in a throwaway ROOT, built from the Go module proxy.
# Source it (`source tests/e2e-k8s/cluster.sh`); like tests/e2e/lib.sh it does
# not change shell options and works under `set -euo pipefail`.
#
# Requirements: root, Linux, runc, busybox-static, jq, openssl, iproute2, go
# (to build missing peers); Debian's containernetworking-plugins is installed
# with apt-get when /usr/lib/cni/bridge is missing. Tested on a cgroup v1 host
# (kubelet failCgroupV1: false); the cgroup v2 path is written but untested.
#
# Typical use:
#   source tests/e2e-k8s/cluster.sh
#   root=$(mktemp -d /tmp/gpushare-k8s.XXXXXX)
#   trap k8s_down EXIT
#   k8s_up "$root"                  # builds what is missing, waits for Ready
#   k8s_kubectl apply -f pod.yaml
#
# Public functions:
#   k8s_build_peers [BIN...]  build missing binaries into target/peers/k8s-VERSION/
#   k8s_up ROOT            start everything under ROOT; waits until the node is Ready
#   k8s_down               stop everything, unmount, remove ROOT (EXIT-trap safe,
#                          idempotent, returns 0)
#   k8s_restart_scheduler  stop + start kube-scheduler (rewrites its config from
#                          the current K8S_EXTENDER_* environment)
#   k8s_restart_kubelet    stop + start kubelet (same config), waits until Ready
#   k8s_kubectl ARGS...    kubectl with the admin kubeconfig
#   k8s_wait_pod_phase NS/NAME PHASE [TIMEOUT]   wait for a pod phase
#   k8s_ensure_namespace NS  create NS with a `default` ServiceAccount and the
#                          kube-root-ca.crt ConfigMap (what the controllers do)
#   k8s_node_name          the node name (K8S_NODE_NAME or gpushare-node)
#
# After k8s_up these are exported: KUBECONFIG (admin, O=system:masters),
# K8S_ROOT, K8S_NODE, K8S_NODE_IP, K8S_KUBELET_ROOT (ROOT/kubelet),
# K8S_DEVICE_PLUGIN_DIR (ROOT/kubelet/device-plugins: kubelet.sock is there;
# a device plugin puts its own socket there and registers its file name),
# K8S_CONTAINERD_SOCK, K8S_NRI_SOCK (containerd's NRI socket), K8S_API
# (https://127.0.0.1:PORT), K8S_CA (CA cert; also signs every client cert),
# K8S_SCHEDULER_KUBECONFIG (CN=system:kube-scheduler), K8S_KUBECTL (path),
# K8S_BIN_DIR, plus everything e2e_start_containerd exports (E2E_ROOT is
# ROOT/containerd).
#
# Settings (environment, read by k8s_up / the restart functions):
#   K8S_EXTENDER_URL     when set, kube-scheduler calls this extender
#                        (filter/prioritize/bind, weight 10, nodeCacheCapable,
#                        not ignorable, managedResources aliyun.com/gpu-mem,
#                        aliyun.com/gpu-core.percentage, aliyun.com/gpu-count,
#                        httpTimeout 10s)
#   K8S_EXTENDER_TLS_DIR with K8S_EXTENDER_URL: call it over HTTPS with mutual
#                        TLS — tlsConfig caFile DIR/ca.crt (verifies the
#                        extender), certFile/keyFile DIR/kube-scheduler.{crt,key}
#   K8S_EXTENDER_IGNORED_BY_SCHEDULER  true|false (default false) for those resources
#   K8S_CONTROLLERS      kube-controller-manager --controllers list; "none" starts
#                        no controller manager (Jobs then never get pods)
#   K8S_NODE_NAME, K8S_NODE_IP (default: the default route's IPv4 address;
#                        kubelet refuses a loopback node IP)
#   K8S_ETCD_PORT (23790; peer port +10), K8S_API_PORT (16443),
#   K8S_KUBELET_PORT (20250; its healthz port is this -2), K8S_SCHEDULER_PORT
#   (20259), K8S_KCM_PORT (20257), K8S_POD_SUBNET (10.88.0.0/16),
#   K8S_SERVICE_CIDR (10.96.0.0/16), K8S_CNI_BRIDGE (gpsk8s0),
#   K8S_READY_TIMEOUT (seconds, 240), K8S_LOG_LEVEL (klog -v, 2),
#   K8S_SAVE_LOGS_DIR (k8s_down copies the logs and configs there first)
#
# Cluster shape (what differs from a kubeadm cluster, and why):
#   - Pods need a ServiceAccount: k8s_up creates `default` in namespace default
#     and the kube-root-ca.crt ConfigMap; the controller manager's
#     serviceaccount and root-ca publisher controllers do it for namespaces
#     created later (k8s_ensure_namespace does it without waiting). Tokens are
#     mounted as usual (TokenRequest; no legacy token controller).
#   - kube-controller-manager runs only K8S_CONTROLLERS (default: job,
#     garbage collector, serviceaccount, root-ca publisher, namespace,
#     ttl-after-finished, deployment, replicaset, daemonset, pod gc). No
#     node-lifecycle controller, so the node is never tainted or its pods
#     evicted while kubelet restarts; hence the TaintNodesByCondition admission
#     plugin is disabled too (its node.kubernetes.io/not-ready taint would
#     never be removed).
#   - No kube-proxy, no DNS; the apiserver's `kubernetes` Service has no
#     endpoints (--endpoint-reconciler-type=none).
#   - CNI: bridge (gpsk8s0, K8S_POD_SUBNET, host-local IPAM under ROOT) +
#     portmap, plugins from /usr/lib/cni symlinked into ROOT/containerd/cni/bin.
#   - kubelet: cgroupfs, cgroupRoot /gpushare-k8s.<suffix of ROOT> (removed by
#     k8s_down), eviction and image GC off (imported images cannot be pulled
#     again), self-signed serving cert in ROOT/kubelet/pki, x509 client auth
#     with the cluster CA and authorization AlwaysAllow, pod logs in
#     ROOT/logs/pods, resolv.conf ROOT/resolv.conf.
#   - kube-scheduler and kube-controller-manager run without leader election
#     (restarts take effect at once).
#   - kubelet's device-plugin directory is compiled in
#     (/var/lib/kubelet/device-plugins, --root-dir does not move it): while the
#     cluster is up ROOT/kubelet/device-plugins is bind-mounted there, so one
#     cluster per machine at a time; k8s_down unmounts it and removes the host
#     directories k8s_up created. Kubelet also keeps its legacy
#     /var/log/containers/*.log links (removed by k8s_down for ROOT's pods)
#     and adds iptables chains KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY and
#     KUBE-FIREWALL (removed by k8s_down unless the host had them before).
#
# Logs: ROOT/{etcd,apiserver,scheduler,controller-manager,kubelet}.log and
# ROOT/containerd/containerd.log.

# ------------------------------------------------------------ constants ----
K8S_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/e2e/lib.sh
source "$K8S_LIB_DIR/../e2e/lib.sh"
# shellcheck source=tests/e2e-k8s/pki.sh
source "$K8S_LIB_DIR/pki.sh"

K8S_VERSION=1.36.3
K8S_ETCD_VERSION=3.6.8
K8S_MODULE_DIR=$E2E_REPO/tests/peers/k8s
K8S_BIN_DIR=${K8S_BIN_DIR:-$E2E_PEERS_DIR/k8s-$K8S_VERSION}
K8S_KUBECTL=$K8S_BIN_DIR/kubectl

K8S_DEFAULT_CONTROLLERS=job-controller,garbage-collector-controller,serviceaccount-controller
K8S_DEFAULT_CONTROLLERS+=,root-ca-certificate-publisher-controller,namespace-controller
K8S_DEFAULT_CONTROLLERS+=,ttl-after-finished-controller,deployment-controller
K8S_DEFAULT_CONTROLLERS+=,replicaset-controller,daemonset-controller
K8S_DEFAULT_CONTROLLERS+=,pod-garbage-collector-controller

k8s_log() { echo "k8s: $*" >&2; }

k8s_node_name() { echo "${K8S_NODE_NAME:-gpushare-node}"; }

# ---------------------------------------------------------------- peers ----
# k8s_build_peers [BIN...]: build whichever of etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet and kubectl (or of etcd and
# the BINs named) is missing under K8S_BIN_DIR, from the wrapper module
# tests/peers/k8s (static, -trimpath, version stamped like a release build).
# Prints what it builds.
k8s_build_peers() {
    local d=$K8S_BIN_DIR pkgs=() b ldflags k minor want=("$@")
    local -A pkg=(
        [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
        [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
        [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
        [kubelet]=k8s.io/kubernetes/cmd/kubelet
        [kubectl]=k8s.io/kubernetes/cmd/kubectl
    )
    minor=${K8S_VERSION#*.}
    minor=${minor%%.*}
    ldflags="-s -w"
    for k in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        ldflags+=" -X $k.gitVersion=v$K8S_VERSION -X $k.gitMajor=${K8S_VERSION%%.*}"
        ldflags+=" -X $k.gitMinor=$minor -X $k.gitTreeState=clean"
    done
    ((${#want[@]})) || want=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
    for b in "${want[@]}"; do
        [[ -x $d/$b ]] || pkgs+=("${pkg[$b]}")
    done
    command -v go >/dev/null 2>&1 || {
        [[ ${#pkgs[@]} -eq 0 && -x $d/etcd ]] || {
            k8s_log "go not found; needed to build ${pkgs[*]##*/} etcd into $d"
            return 1
        }
    }
    mkdir -p "$d" || return 1
    if ((${#pkgs[@]})); then
        k8s_log "building Kubernetes v$K8S_VERSION (${pkgs[*]##*/}) into $d"
        (cd "$K8S_MODULE_DIR" && CGO_ENABLED=0 go build -trimpath -buildvcs=false \
            -ldflags "$ldflags" -o "$d/" "${pkgs[@]}") || return 1
    fi
    if [[ ! -x $d/etcd ]]; then
        # go.etcd.io/etcd/server/v3 is etcd's main package (server/main.go).
        k8s_log "building etcd v$K8S_ETCD_VERSION into $d"
        (cd "$K8S_MODULE_DIR" && CGO_ENABLED=0 go build -trimpath -buildvcs=false \
            -ldflags "-s -w" -o "$d/etcd.tmp$$" go.etcd.io/etcd/server/v3) || return 1
        mv -f "$d/etcd.tmp$$" "$d/etcd"
    fi
}

# ------------------------------------------------------------- helpers ----
# k8s_kubectl ARGS...: kubectl with the admin kubeconfig of the current cluster.
k8s_kubectl() {
    "$K8S_KUBECTL" --kubeconfig "$K8S_ROOT/admin.kubeconfig" "$@"
}

# The node's IPv4: K8S_NODE_IP, else the default route's source address, else
# the first global IPv4 address. (kubelet refuses loopback node IPs.)
_k8s_node_ip() {
    local ip dev
    if [[ -n ${K8S_NODE_IP:-} ]]; then
        echo "$K8S_NODE_IP"
        return 0
    fi
    dev=$(ip -4 route show default 2>/dev/null | awk '{for (i=1;i<NF;i++) if ($i=="dev") {print $(i+1); exit}}')
    if [[ -n $dev ]]; then
        ip=$(ip -4 -o addr show dev "$dev" scope global 2>/dev/null | awk '{print $4; exit}')
    fi
    [[ -n ${ip:-} ]] || ip=$(ip -4 -o addr show scope global 2>/dev/null | awk '{print $4; exit}')
    ip=${ip%%/*}
    if [[ -z $ip ]]; then
        k8s_log "no global IPv4 address for the node; set K8S_NODE_IP"
        return 1
    fi
    echo "$ip"
}

# --------------------------------------------------------------- certs ----
# The cluster's PKI lives in ROOT/pki (tests/e2e-k8s/pki.sh), valid 30 days.

# _k8s_cert NAME SUBJECT EKU [SAN]: EC P-256 key + cert signed by the CA.
_k8s_cert() {
    pki_cert "$K8S_ROOT/pki" 30 "$@"
}

_k8s_kubeconfig() { # FILE CERTNAME USER
    pki_kubeconfig "$1" "$K8S_ROOT/pki" "$2" "$3" "$K8S_API" gpushare-e2e
}

_k8s_make_pki() {
    local p=$K8S_ROOT/pki host
    pki_ca "$p" "/CN=gpushare-e2e-ca" 30 || return 1
    host=$(hostname 2>/dev/null | tr '[:upper:]' '[:lower:]')
    local svc_ip
    svc_ip=$(_k8s_first_service_ip "$K8S_SERVICE_CIDR")
    _k8s_cert apiserver "/CN=kube-apiserver" serverAuth \
        "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:$K8S_NODE${host:+,DNS:$host},IP:127.0.0.1,IP:$K8S_NODE_IP,IP:$svc_ip" &&
        _k8s_cert admin "/O=system:masters/CN=kubernetes-admin" clientAuth &&
        _k8s_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth &&
        _k8s_cert kubelet "/O=system:nodes/CN=system:node:$K8S_NODE" clientAuth &&
        _k8s_cert scheduler "/CN=system:kube-scheduler" clientAuth &&
        # The controllers run under the manager's own identity
        # (--use-service-account-credentials=false), which needs more than
        # the system:kube-controller-manager role grants.
        _k8s_cert controller-manager "/O=system:masters/CN=system:kube-controller-manager" clientAuth ||
        return 1
    pki_sa_keys "$p" || return 1
    _k8s_kubeconfig "$K8S_ROOT/admin.kubeconfig" admin kubernetes-admin
    _k8s_kubeconfig "$K8S_ROOT/kubelet.kubeconfig" kubelet "system:node:$K8S_NODE"
    _k8s_kubeconfig "$K8S_ROOT/scheduler.kubeconfig" scheduler system:kube-scheduler
    _k8s_kubeconfig "$K8S_ROOT/controller-manager.kubeconfig" controller-manager \
        system:kube-controller-manager
}

_k8s_first_service_ip() { # CIDR (IPv4, network address) -> network + 1
    local net=${1%/*} a b c d
    IFS=. read -r a b c d <<<"$net"
    echo "$a.$b.$c.$((d + 1))"
}

# ------------------------------------------------------------ processes ----
# _k8s_start NAME CMD...: run CMD in the background, log to ROOT/NAME.log,
# pid in ROOT/NAME.pid.
_k8s_start() {
    local name=$1 pid
    shift
    {
        echo
        echo "===== k8s: starting $name at $(date -u +%FT%TZ): $* ====="
    } >>"$K8S_ROOT/$name.log"
    "$@" </dev/null >>"$K8S_ROOT/$name.log" 2>&1 &
    pid=$!
    echo "$pid" >"$K8S_ROOT/$name.pid"
    # Between fork and exec, /proc/PID/cmdline is still this shell's, which _k8s_pid does not
    # take for NAME (a loaded host once took that for an exit: "controller-manager exited
    # while waiting for kube-controller-manager /healthz" with nothing in its log). Wait for
    # the exec, or the end, before anyone asks (10 s at most).
    local deadline=$((SECONDS + 10))
    while _e2e_alive "$pid" && ! _k8s_pid "$name" >/dev/null && ((SECONDS < deadline)); do
        sleep 0.05
    done
}

_k8s_pid() { _k8s_pid_in "$K8S_ROOT" "$1"; } # NAME -> pid if running and ours

_k8s_pid_in() { # ROOT NAME -> pid of ROOT's NAME if it runs
    local f=$1/$2.pid pid cmd
    [[ -r $f ]] || return 1
    pid=$(<"$f")
    [[ -n $pid ]] && _e2e_alive "$pid" || return 1
    cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
    [[ $cmd == *"$1"* ]] || return 1
    echo "$pid"
}

# _k8s_stop NAME [TIMEOUT]: SIGTERM, wait, SIGKILL.
_k8s_stop() {
    local name=$1 timeout=${2:-20} pid deadline
    if pid=$(_k8s_pid "$name"); then
        kill -TERM "$pid" 2>/dev/null || true
        deadline=$((SECONDS + timeout))
        while _e2e_alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
        if _e2e_alive "$pid"; then
            k8s_log "$name (pid $pid) ignored SIGTERM for ${timeout}s; killing"
            kill -KILL "$pid" 2>/dev/null || true
            while _e2e_alive "$pid"; do sleep 0.1; done
        fi
        wait "$pid" 2>/dev/null || true
    fi
    rm -f "$K8S_ROOT/$name.pid"
}

_k8s_fail_log() { # NAME MESSAGE
    k8s_log "$2; tail of $K8S_ROOT/$1.log:"
    tail -n 40 "$K8S_ROOT/$1.log" >&2 || true
    return 1
}

# _k8s_wait NAME TIMEOUT DESC CMD...: poll CMD until it succeeds; fail early
# when the process NAME died.
_k8s_wait() {
    local name=$1 timeout=$2 desc=$3 deadline
    shift 3
    deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ! _k8s_pid "$name" >/dev/null; then
            _k8s_fail_log "$name" "$name exited while waiting for $desc"
            return 1
        fi
        if ((SECONDS >= deadline)); then
            _k8s_fail_log "$name" "$desc: not after ${timeout}s"
            return 1
        fi
        sleep 0.5
    done
}

_k8s_https_ok() { # URL
    curl -fsk --max-time 3 "$1" >/dev/null 2>&1
}

# ------------------------------------------------------------ components ----
_k8s_start_etcd() {
    _k8s_start etcd "$K8S_BIN_DIR/etcd" \
        --name "$K8S_NODE" \
        --data-dir "$K8S_ROOT/etcd" \
        --listen-client-urls "http://127.0.0.1:$K8S_ETCD_PORT" \
        --advertise-client-urls "http://127.0.0.1:$K8S_ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$((K8S_ETCD_PORT + 10))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((K8S_ETCD_PORT + 10))" \
        --initial-cluster "$K8S_NODE=http://127.0.0.1:$((K8S_ETCD_PORT + 10))" \
        --quota-backend-bytes 1073741824 \
        --unsafe-no-fsync \
        --log-level warn
    _k8s_wait etcd 60 "etcd health" curl -fs --max-time 2 "http://127.0.0.1:$K8S_ETCD_PORT/health"
}

_k8s_start_apiserver() {
    local p=$K8S_ROOT/pki
    _k8s_start apiserver "$K8S_BIN_DIR/kube-apiserver" \
        --v="$K8S_LOG_LEVEL" \
        --etcd-servers "http://127.0.0.1:$K8S_ETCD_PORT" \
        --bind-address 127.0.0.1 \
        --advertise-address "$K8S_NODE_IP" \
        --secure-port "$K8S_API_PORT" \
        --cert-dir "$p" \
        --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
        --client-ca-file "$p/ca.crt" \
        --kubelet-client-certificate "$p/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$p/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types InternalIP,Hostname \
        --authorization-mode Node,RBAC \
        --enable-admission-plugins NodeRestriction \
        --disable-admission-plugins TaintNodesByCondition \
        --allow-privileged=true \
        --service-cluster-ip-range "$K8S_SERVICE_CIDR" \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$p/sa.pub" \
        --service-account-signing-key-file "$p/sa.key" \
        --endpoint-reconciler-type none \
        --profiling=false
    _k8s_wait apiserver 180 "kube-apiserver /readyz" k8s_kubectl get --raw /readyz
}

_k8s_start_controller_manager() {
    local controllers=${K8S_CONTROLLERS:-$K8S_DEFAULT_CONTROLLERS}
    [[ $controllers != none ]] || return 0
    _k8s_start controller-manager "$K8S_BIN_DIR/kube-controller-manager" \
        --v="$K8S_LOG_LEVEL" \
        --kubeconfig "$K8S_ROOT/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$K8S_KCM_PORT" \
        --leader-elect=false \
        --use-service-account-credentials=false \
        --controllers "$controllers" \
        --root-ca-file "$K8S_ROOT/pki/ca.crt" \
        --cluster-signing-cert-file "$K8S_ROOT/pki/ca.crt" \
        --cluster-signing-key-file "$K8S_ROOT/pki/ca.key" \
        --profiling=false
    _k8s_wait controller-manager 90 "kube-controller-manager /healthz" \
        _k8s_https_ok "https://127.0.0.1:$K8S_KCM_PORT/healthz"
}

_k8s_write_scheduler_config() {
    local f=$K8S_ROOT/scheduler.yaml
    cat >"$f" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $K8S_ROOT/scheduler.kubeconfig
leaderElection:
  leaderElect: false
EOF
    if [[ -n ${K8S_EXTENDER_URL:-} ]]; then
        local ign=${K8S_EXTENDER_IGNORED_BY_SCHEDULER:-false} r
        cat >>"$f" <<EOF
extenders:
- urlPrefix: "$K8S_EXTENDER_URL"
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  weight: 10
  enableHTTPS: $([[ -n ${K8S_EXTENDER_TLS_DIR:-} ]] && echo true || echo false)
  nodeCacheCapable: true
  ignorable: false
  httpTimeout: 10s
  managedResources:
EOF
        for r in aliyun.com/gpu-mem aliyun.com/gpu-core.percentage aliyun.com/gpu-count; do
            printf '  - name: %s\n    ignoredByScheduler: %s\n' "$r" "$ign" >>"$f"
        done
        if [[ -n ${K8S_EXTENDER_TLS_DIR:-} ]]; then
            printf '  tlsConfig:\n    caFile: %s/ca.crt\n    certFile: %s/kube-scheduler.crt\n    keyFile: %s/kube-scheduler.key\n' \
                "$K8S_EXTENDER_TLS_DIR" "$K8S_EXTENDER_TLS_DIR" "$K8S_EXTENDER_TLS_DIR" >>"$f"
        fi
    fi
}

_k8s_start_scheduler() {
    _k8s_write_scheduler_config
    _k8s_start scheduler "$K8S_BIN_DIR/kube-scheduler" \
        --v="$K8S_LOG_LEVEL" \
        --config "$K8S_ROOT/scheduler.yaml" \
        --bind-address 127.0.0.1 --secure-port "$K8S_SCHEDULER_PORT"
    _k8s_wait scheduler 90 "kube-scheduler /healthz" \
        _k8s_https_ok "https://127.0.0.1:$K8S_SCHEDULER_PORT/healthz"
}

# The kubelet's cgroup root must exist in every hierarchy it uses.
_k8s_make_cgroup_root() {
    local d sub
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
        mkdir -p "/sys/fs/cgroup$K8S_CGROUP_ROOT" || return 1
        return 0
    fi
    for d in /sys/fs/cgroup/*/; do
        sub=${d%/}
        [[ ${sub##*/} != unified ]] || continue
        mountpoint -q "$sub" || continue
        mkdir -p "$sub$K8S_CGROUP_ROOT" 2>/dev/null || continue
        if [[ -f $sub/cpuset.cpus ]]; then
            cat "$sub/cpuset.cpus" >"$sub$K8S_CGROUP_ROOT/cpuset.cpus" 2>/dev/null || true
            cat "$sub/cpuset.mems" >"$sub$K8S_CGROUP_ROOT/cpuset.mems" 2>/dev/null || true
        fi
    done
}

_k8s_remove_cgroup_root() {
    local d
    [[ -n ${K8S_CGROUP_ROOT:-} && $K8S_CGROUP_ROOT == /gpushare-k8s.* ]] || return 0
    for d in /sys/fs/cgroup"$K8S_CGROUP_ROOT" /sys/fs/cgroup/*"$K8S_CGROUP_ROOT"; do
        [[ -d $d ]] || continue
        find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
}

# kubelet serves the device-plugin registration socket at the compiled-in
# /var/lib/kubelet/device-plugins/kubelet.sock whatever --root-dir says, and
# dials plugins at /var/lib/kubelet/device-plugins/<endpoint>. Bind-mount
# ROOT/kubelet/device-plugins there while the cluster is up, so both paths
# name the same directory. Host directories created here are listed in
# ROOT/host-dirs for k8s_down.
K8S_HOST_DEVICE_PLUGIN_DIR=/var/lib/kubelet/device-plugins

_k8s_dp_mount_root() { # -> mount root (source) of the bind on the host dir, if any
    awk -v m="$K8S_HOST_DEVICE_PLUGIN_DIR" '$5 == m { print $4 }' /proc/self/mountinfo | tail -n 1
}

_k8s_bind_device_plugins() {
    local host=$K8S_HOST_DEVICE_PLUGIN_DIR src d old
    src=$K8S_KUBELET_ROOT/device-plugins
    mkdir -p "$src" || return 1
    # A bind left by a cluster whose ROOT is gone (killed without k8s_down).
    while old=$(_k8s_dp_mount_root) && [[ -n $old ]]; do
        d=${old%//deleted}
        d=${d%/kubelet/device-plugins}
        if [[ $old == *//deleted ]] || ! _k8s_pid_in "$d" kubelet >/dev/null; then
            k8s_log "unmounting stale $host (bind of $old)"
            umount "$host" 2>/dev/null || umount -l "$host" || return 1
        else
            k8s_log "$host is already a mount point ($old): another cluster is up;" \
                "call k8s_down there first"
            return 1
        fi
    done
    for d in /var/lib/kubelet "$host" /var/log/containers; do
        [[ -d $d ]] || echo "$d" >>"$K8S_ROOT/host-dirs"
    done
    mkdir -p "$host" /var/log/containers || return 1
    mount --bind "$src" "$host" || {
        k8s_log "cannot bind-mount $src on $host"
        return 1
    }
}

_k8s_unbind_device_plugins() { # ROOT
    local root=$1 old d
    while old=$(_k8s_dp_mount_root) && [[ -n $old && $old == *"/${root##*/}/kubelet/device-plugins"* ]]; do
        umount "$K8S_HOST_DEVICE_PLUGIN_DIR" 2>/dev/null ||
            umount -l "$K8S_HOST_DEVICE_PLUGIN_DIR" 2>/dev/null || break
    done
    # Directories k8s_up created on the host, deepest first, if empty.
    if [[ -f $root/host-dirs ]]; then
        sort -r "$root/host-dirs" | while IFS= read -r d; do
            rmdir "$d" 2>/dev/null || true
        done
    fi
}

# kubelet adds iptables chains for other components' sake (KUBE-IPTABLES-HINT,
# KUBE-KUBELET-CANARY, and KUBE-FIREWALL with jumps from INPUT and OUTPUT).
# When the host had none of them before k8s_up, k8s_down removes them.
_k8s_iptables_note() {
    command -v iptables >/dev/null 2>&1 || return 0
    if iptables -w 5 -t mangle -S KUBE-IPTABLES-HINT >/dev/null 2>&1 ||
        iptables -w 5 -t filter -S KUBE-FIREWALL >/dev/null 2>&1; then
        touch "$K8S_ROOT/iptables-preexisting"
    fi
}

_k8s_iptables_cleanup() { # ROOT
    local ipt t
    [[ ! -e $1/iptables-preexisting ]] || return 0
    for ipt in iptables ip6tables; do
        command -v "$ipt" >/dev/null 2>&1 || continue
        while "$ipt" -w 5 -t filter -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
        while "$ipt" -w 5 -t filter -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
        "$ipt" -w 5 -t filter -F KUBE-FIREWALL 2>/dev/null || true
        "$ipt" -w 5 -t filter -X KUBE-FIREWALL 2>/dev/null || true
        for t in mangle nat filter; do
            "$ipt" -w 5 -t "$t" -X KUBE-KUBELET-CANARY 2>/dev/null || true
        done
        "$ipt" -w 5 -t mangle -X KUBE-IPTABLES-HINT 2>/dev/null || true
    done
}

_k8s_write_kubelet_config() {
    cat >"$K8S_ROOT/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# kubelet >= 1.35 refuses to start on cgroup v1 unless told otherwise.
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: $K8S_CGROUP_ROOT
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://$K8S_CONTAINERD_SOCK
imageServiceEndpoint: unix://$K8S_CONTAINERD_SOCK
address: 0.0.0.0
port: $K8S_KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $((K8S_KUBELET_PORT - 2))
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: $K8S_ROOT/pki/ca.crt
authorization:
  mode: AlwaysAllow
resolvConf: $K8S_ROOT/resolv.conf
podLogsDir: $K8S_ROOT/logs/pods
# No eviction ("0%" disables a threshold) and no image GC: a full disk must not
# evict test pods, and the locally imported images cannot be pulled again.
evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
  imagefs.inodesFree: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
registerNode: true
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
EOF
}

_k8s_node_ready() {
    [[ $(k8s_kubectl get node "$K8S_NODE" \
        -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

_k8s_start_kubelet() {
    _k8s_start kubelet "$K8S_BIN_DIR/kubelet" \
        --v="$K8S_LOG_LEVEL" \
        --config "$K8S_ROOT/kubelet.yaml" \
        --kubeconfig "$K8S_ROOT/kubelet.kubeconfig" \
        --root-dir "$K8S_KUBELET_ROOT" \
        --cert-dir "$K8S_KUBELET_ROOT/pki" \
        --hostname-override "$K8S_NODE" \
        --node-ip "$K8S_NODE_IP"
}

_k8s_wait_node_ready() {
    _k8s_wait kubelet "$K8S_READY_TIMEOUT" "node $K8S_NODE Ready" _k8s_node_ready
}

# k8s_ensure_namespace NS: create NS (if missing), its `default`
# ServiceAccount and its kube-root-ca.crt ConfigMap.
k8s_ensure_namespace() {
    local ns=$1 out
    if ! k8s_kubectl get namespace "$ns" >/dev/null 2>&1; then
        out=$(k8s_kubectl create namespace "$ns" 2>&1) ||
            [[ $out == *AlreadyExists* || $out == *"already exists"* ]] || {
            echo "$out" >&2
            return 1
        }
    fi
    out=$(k8s_kubectl -n "$ns" create serviceaccount default 2>&1) ||
        [[ $out == *AlreadyExists* || $out == *"already exists"* ]] || {
        echo "$out" >&2
        return 1
    }
    out=$(k8s_kubectl -n "$ns" create configmap kube-root-ca.crt \
        --from-file=ca.crt="$K8S_ROOT/pki/ca.crt" 2>&1) ||
        [[ $out == *AlreadyExists* || $out == *"already exists"* ]] || {
        echo "$out" >&2
        return 1
    }
}

# k8s_wait_pod_phase NS/NAME PHASE [TIMEOUT]: wait until the pod is in PHASE
# (Running, Succeeded, ...); on timeout prints the pod's status and events.
k8s_wait_pod_phase() {
    local ns=${1%%/*} name=${1#*/} phase=$2 timeout=${3:-120} deadline cur
    deadline=$((SECONDS + timeout))
    while :; do
        cur=$(k8s_kubectl -n "$ns" get pod "$name" -o 'jsonpath={.status.phase}' 2>/dev/null) || cur=
        [[ $cur != "$phase" ]] || return 0
        if ((SECONDS >= deadline)); then
            k8s_log "pod $ns/$name: phase '${cur:-?}', not $phase after ${timeout}s"
            k8s_kubectl -n "$ns" describe pod "$name" 2>&1 | tail -n 30 >&2 || true
            return 1
        fi
        sleep 0.5
    done
}

# ------------------------------------------------------------------ up ----
# k8s_up ROOT: build missing peers and images, then start etcd,
# kube-apiserver, kube-controller-manager (unless K8S_CONTROLLERS=none),
# kube-scheduler, containerd 2.x (tests/e2e/lib.sh, in ROOT/containerd) and
# kubelet, all under ROOT (an empty directory, e.g. from mktemp -d; keep its
# path short: unix sockets live in it). Waits until the node is Ready and the
# `default` ServiceAccount exists. Must run in the main shell (not in $(...))
# so the exports stick. On failure prints the tail of the failing component's
# log and returns 1 (call k8s_down to clean up).
# ------------------------------------------------------ workload helpers ----
# K8S_BURN: the seed's workload, a busy loop that counts rounds in its sim directory (written
# with a rename so a reader never sees a half-written file).
K8S_BURN='cd /var/run/gpushare; i=0; while :; do awk "BEGIN{for(j=0;j<20000;j++);}"; i=$((i+1)); echo $i >p.tmp; mv p.tmp progress; done'

k8s_indent() { sed "s/^/$(printf '%*s' "$1" '')/"; } # N: indent stdin by N spaces

# k8s_pod_spec MEM CORE CMD [SCHEDULER]: a pod spec with one busybox container `main` asking
# MEM GiB (and CORE %, unless empty; no GPU when MEM is empty), scheduled by SCHEDULER
# (default: the cluster's default).
k8s_pod_spec() {
    local mem=$1 core=$2 cmd=$3 sched=${4:-}
    cat <<EOF
${sched:+schedulerName: $sched}
terminationGracePeriodSeconds: 1
automountServiceAccountToken: false
restartPolicy: Never
containers:
- name: main
  image: $E2E_BUSYBOX_IMAGE
  imagePullPolicy: Never
  command: ["sh", "-c", '$cmd']
${mem:+  resources:
    limits:
      aliyun.com/gpu-mem: \"$mem\"}
${core:+      aliyun.com/gpu-core.percentage: \"$core\"}
EOF
}

# k8s_job_yaml NAME MEM CORE CMD [SCHEDULER]: a Job of one such pod.
k8s_job_yaml() {
    cat <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: $1
spec:
  backoffLimit: 0
  template:
    metadata:
      labels: {app: gpushare-e2e}
    spec:
EOF
    k8s_pod_spec "$2" "$3" "$4" "${5:-}" | k8s_indent 6
}

# k8s_wait_for TIMEOUT DESC CMD...: poll CMD every 0.5 s; on time-out say so, prefixed with
# K8S_WAIT_WHO (default k8s).
k8s_wait_for() {
    local t=$1 desc=$2 i
    shift 2
    for ((i = 0; i < t * 2; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "${K8S_WAIT_WHO:-k8s}: timed out after ${t}s waiting for: $desc" >&2
    return 1
}

k8s_up() {
    local root=${1:-}
    if [[ $# -ne 1 || -z $root ]]; then
        k8s_log "usage: k8s_up ROOT"
        return 2
    fi
    if [[ $(id -u) -ne 0 ]]; then
        k8s_log "the Kubernetes e2e cluster needs root"
        return 1
    fi
    if [[ -n ${K8S_ROOT:-} && -f $K8S_ROOT/.gpushare-k8s-root ]] && _k8s_pid apiserver >/dev/null; then
        k8s_log "a cluster is already up in $K8S_ROOT; call k8s_down first"
        return 1
    fi
    command -v openssl >/dev/null 2>&1 || {
        k8s_log "openssl not found (apt-get install openssl)"
        return 1
    }
    command -v curl >/dev/null 2>&1 || {
        k8s_log "curl not found (apt-get install curl)"
        return 1
    }
    k8s_build_peers || return 1
    e2e_ensure_cni_plugins || return 1

    mkdir -p "$root" || return 1
    root=$(cd "$root" && pwd -P) || return 1
    touch "$root/.gpushare-k8s-root" # marks ROOT as ours for k8s_down

    export K8S_ROOT=$root
    export K8S_NODE
    K8S_NODE=$(k8s_node_name)
    export K8S_NODE_IP
    K8S_NODE_IP=$(_k8s_node_ip) || return 1
    export K8S_ETCD_PORT=${K8S_ETCD_PORT:-23790}
    export K8S_API_PORT=${K8S_API_PORT:-16443}
    export K8S_KUBELET_PORT=${K8S_KUBELET_PORT:-20250}
    export K8S_SCHEDULER_PORT=${K8S_SCHEDULER_PORT:-20259}
    export K8S_KCM_PORT=${K8S_KCM_PORT:-20257}
    export K8S_POD_SUBNET=${K8S_POD_SUBNET:-10.88.0.0/16}
    export K8S_SERVICE_CIDR=${K8S_SERVICE_CIDR:-10.96.0.0/16}
    export K8S_READY_TIMEOUT=${K8S_READY_TIMEOUT:-240}
    export K8S_LOG_LEVEL=${K8S_LOG_LEVEL:-2}
    export K8S_CNI_BRIDGE=${K8S_CNI_BRIDGE:-gpsk8s0}
    export K8S_API=https://127.0.0.1:$K8S_API_PORT
    export K8S_CA=$root/pki/ca.crt
    export K8S_KUBELET_ROOT=$root/kubelet
    export K8S_DEVICE_PLUGIN_DIR=$root/kubelet/device-plugins
    export K8S_SCHEDULER_KUBECONFIG=$root/scheduler.kubeconfig
    local suffix=${root##*/}
    suffix=${suffix#gpushare-k8s.}
    export K8S_CGROUP_ROOT=/gpushare-k8s.${suffix//[^A-Za-z0-9_-]/_}
    export K8S_KUBECTL K8S_BIN_DIR
    export KUBECONFIG=$root/admin.kubeconfig
    echo "$K8S_CGROUP_ROOT" >"$root/cgroup-root"

    mkdir -p "$K8S_KUBELET_ROOT" "$root/logs/pods" || return 1
    printf 'nameserver 127.0.0.1\noptions ndots:1\n' >"$root/resolv.conf"
    _k8s_make_pki || return 1

    _k8s_start_etcd || return 1
    _k8s_start_apiserver || return 1
    k8s_ensure_namespace default || return 1
    _k8s_start_controller_manager || return 1
    _k8s_start_scheduler || return 1

    # containerd (NRI on) with CNI: config written before it starts.
    e2e_write_cni_config "$root/containerd" "$K8S_CNI_BRIDGE" "$K8S_POD_SUBNET" \
        "$K8S_ROOT/cni-ipam" || return 1
    e2e_start_containerd 2 "$root/containerd" || return 1
    export K8S_CONTAINERD_SOCK=$E2E_CONTAINERD_SOCK
    export K8S_NRI_SOCK=$E2E_NRI_SOCK

    _k8s_make_cgroup_root || return 1
    _k8s_bind_device_plugins || return 1
    _k8s_iptables_note
    _k8s_write_kubelet_config
    _k8s_start_kubelet
    _k8s_wait_node_ready || return 1
    k8s_log "cluster up: node $K8S_NODE Ready (root $root, API $K8S_API)"
}

# k8s_restart_scheduler: stop kube-scheduler and start it again (the config is
# rewritten, so a K8S_EXTENDER_URL set since k8s_up takes effect).
k8s_restart_scheduler() {
    [[ -n ${K8S_ROOT:-} && -f $K8S_ROOT/.gpushare-k8s-root ]] || {
        k8s_log "k8s_restart_scheduler: no cluster"
        return 1
    }
    _k8s_stop scheduler 20
    _k8s_start_scheduler || return 1
    k8s_log "kube-scheduler restarted"
}

# k8s_restart_kubelet: stop kubelet and start it again with the same config;
# waits until the node is Ready (pods keep running meanwhile).
k8s_restart_kubelet() {
    [[ -n ${K8S_ROOT:-} && -f $K8S_ROOT/.gpushare-k8s-root ]] || {
        k8s_log "k8s_restart_kubelet: no cluster"
        return 1
    }
    _k8s_stop kubelet 30
    # Ready must be reported by the new kubelet, not left over from the old.
    _k8s_start_kubelet
    _k8s_wait kubelet 60 "kubelet /healthz" \
        curl -fs --max-time 2 "http://127.0.0.1:$((K8S_KUBELET_PORT - 2))/healthz" || return 1
    _k8s_wait_node_ready || return 1
    k8s_log "kubelet restarted"
}

# ---------------------------------------------------------------- down ----
# k8s_down: stop kubelet, scheduler, controller manager, containerd (its pods
# removed), apiserver and etcd; unmount what is left under ROOT, remove the
# kubelet cgroup root, the CNI bridge and kubelet's /var/log/containers links
# into ROOT; delete ROOT. Safe from an EXIT trap, safe to call twice, never
# fails (returns 0).
k8s_down() {
    local root=${K8S_ROOT:-} n m l
    [[ -n $root && -d $root && -f $root/.gpushare-k8s-root && $root != / ]] || return 0
    {
        [[ -n ${K8S_CGROUP_ROOT:-} ]] || K8S_CGROUP_ROOT=$(cat "$root/cgroup-root" 2>/dev/null)
        _k8s_stop kubelet 30
        _k8s_stop scheduler 20
        _k8s_stop controller-manager 20
        if [[ -n ${K8S_SAVE_LOGS_DIR:-} ]]; then # e2e_stop_containerd deletes it
            mkdir -p "$K8S_SAVE_LOGS_DIR" &&
                cp -f "$root/containerd/containerd.log" "$K8S_SAVE_LOGS_DIR/" 2>/dev/null
        fi
        if [[ -f $root/containerd/.gpushare-e2e-root ]]; then
            export E2E_ROOT=$root/containerd
            export E2E_CONTAINERD_SOCK=$root/containerd/containerd.sock
            [[ -n ${E2E_CONTAINERD_PID:-} ]] || E2E_CONTAINERD_PID=$(cat "$root/containerd/containerd.pid" 2>/dev/null)
            export E2E_CONTAINERD_DIR
            E2E_CONTAINERD_DIR=$(e2e_containerd_dir 2)
            e2e_stop_containerd
        fi
        _k8s_stop apiserver 30
        _k8s_stop etcd 20
        # Leftover processes whose command line names ROOT.
        for n in /proc/[0-9]*; do
            [[ ${n#/proc/} != "$$" ]] || continue
            l=$(tr '\0' ' ' 2>/dev/null <"$n/cmdline") || continue
            [[ $l == *"$root/"* ]] || continue
            kill -KILL "${n#/proc/}" 2>/dev/null || true
        done
        # Unmount deepest first (kubelet's volume mounts, netns, ...).
        e2e_unmount_below "$root"
        _k8s_remove_cgroup_root
        if [[ -n ${K8S_CNI_BRIDGE:-} ]] && ip link show "$K8S_CNI_BRIDGE" >/dev/null 2>&1; then
            ip link delete "$K8S_CNI_BRIDGE" 2>/dev/null || true
        fi
        for l in /var/log/containers/*.log; do
            [[ -L $l ]] || continue
            [[ $(readlink "$l") != "$root/"* ]] || rm -f "$l"
        done
        _k8s_unbind_device_plugins "$root"
        _k8s_iptables_cleanup "$root"
        if [[ -n ${K8S_SAVE_LOGS_DIR:-} ]]; then
            mkdir -p "$K8S_SAVE_LOGS_DIR" &&
                cp -f "$root"/*.log "$root"/*.yaml "$K8S_SAVE_LOGS_DIR/" 2>/dev/null
        fi
        rm -rf --one-file-system "$root" 2>/dev/null ||
            k8s_log "warning: could not fully remove $root"
    } || true
    return 0
}
