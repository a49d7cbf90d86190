#!/usr/bin/env bash
# make bench-cluster: the extender end to end at cluster scale. A real etcd, kube-apiserver and
# kube-scheduler (configured with `gpushare scheduler` as its extender) and the openb cluster's
# 1,213 GPU nodes as fake nodes served by KWOK (sigs.k8s.io/kwok; no kubelet, pods bound to
# them never run: binding is what is measured). Not part of `make test`.
#
#   (a) throughput: BENCH_PODS (2000) one-GPU-share pods (gpu-mem 2048 MiB = 2 GiB + core 30 %)
#       through kube-scheduler + extender vs the same pods without GPU limits through
#       kube-scheduler alone; time from the first pod created to the last pod bound; plus the
#       over-committed GPUs summed from the written gpushare.io/assignment annotations; and,
#       to tell kube-scheduler's own cost of extended resources from the extender's, the GPU
#       pods through kube-scheduler alone (ratio_to_share_alone).
#   (b) packing: an openb pod list (BENCH_TRACE) in the arrival order of `gpushare simulate` for
#       BENCH_SEED (42) up to BENCH_LOAD (100) % arrived GPU demand, created one at a time in
#       that order; the unallocated GPU % compared with `gpushare simulate` for the same seed
#       and policy gpushare (the goal's figure), and with `gpushare simulate --as-extender`
#       (shapes learned as the extender learns them, ties by node name, the same node search):
#       the simulator's prediction of this cluster (simulate_as_extender in b.json).
#
# Shape of the cluster (what differs from a production one, and why):
#   - the memory resource is counted in MiB (extender --memory-unit MiB; node allocatable
#     aliyun.com/gpu-mem = 16000 per GPU, the simulator's trace GPU): the trace's fractions
#     (16 MiB per milli) are exact only in MiB;
#   - (a) runs on core_mem nodes (ack.node.gpu.placement binpack); (b) on `share` nodes
#     (memory only, no placement label: what the simulator's nodes have). The trace's compute
#     fractions (e.g. 46 %) are not multiples of 5 % as a compute quota must be, while in the
#     simulator a pod's core share always equals its memory share, so the memory share alone
#     decides the same fits; whole-GPU pods ask gpu-count k and all of those GPUs' memory;
#   - (b) kube-scheduler scores every node (percentageOfNodesToScore 100) and of its own score
#     plugins only NodeResourcesFit (MostAllocated, weight 1) is on: the extender's prioritize
#     ranks the nodes for GPU pods (one extender point outweighs it), NodeResourcesFit breaks
#     the extender's ties and packs the pods without GPUs, which the extender never sees (with
#     every plugin off they land at random: 4 points more unallocated, BENCHMARKS.md);
#   - kube-scheduler's client QPS/burst 5000/10000; the apiserver's in-flight limits raised and
#     API priority and fairness off; KWOK runs only the node-initialize stage (nodes Ready, no
#     pod lifecycle, node leases renewed every 15 min); the extender uses the admin identity.
#
# Settings (environment): BENCH_PODS (2000), BENCH_SEED (42), BENCH_LOAD (100), BENCH_TRACE
# ((b): the pod list openb_pod_list_NAME.csv, default: default),
# BENCH_PARALLEL (pod creation requests in flight for (a), 16), BENCH_PARTS (a,b),
# BENCH_POLICY (the extender's and the simulator's policy, gpushare), BENCH_TRACE_FIT ((b):
# MostAllocated (default) / LeastAllocated: of kube-scheduler's score plugins only
# NodeResourcesFit, with that strategy; none: all off), BENCH_TRACE_ALL ((b): 1 (default):
# the extender without managedResources, asked about every pod, ranks the pods without GPUs
# too, as the simulator's policy does; 0: only GPU pods, the others left to NodeResourcesFit),
# BENCH_FILTER_BEST (the extender's --filter-best: filter answers only the N nodes the policy
# ranks best; 1, the default; 0: every fitting node, kube-scheduler scores them),
# BENCH_TRACE_PARALLEL ((b): pod creations in flight, 1 (default): one at a time, in order,
# without waiting; 0: each pod bound or refused before the next is created),
# BENCH_TRACE_SCORE_PCT ((b): kube-scheduler's percentageOfNodesToScore, 100 (default): every
# feasible node reaches the extender; `default`: unset, kube-scheduler's adaptive share,
# about 40 % of 1,213 nodes, stops its search there), BENCH_A_SCORE_PCT / BENCH_A_BASE_SCORE_PCT
# ((a): percentageOfNodesToScore for the runs with / without the extender; unset (default):
# the adaptive share; kube-scheduler never stops before 100 feasible nodes),
# GPUSHARE_BIN (target/release/gpushare; copied to ROOT first), BENCH_OUT
# (target/bench/cluster), BENCH_KEEP_LOGS=1 (copy the components' logs, and (b)'s pods and
# nodes, to BENCH_OUT/logs),
# BENCH_PROFILE=SECONDS ((a): kube-scheduler's CPU profile over the first SECONDS of each run
# into BENCH_OUT/a-{plain,share-alone,extender}-scheduler.pprof and the API server's into
# a-*-apiserver.pprof, kube-scheduler's metrics after the run into a-*-scheduler-metrics.txt;
# `go tool pprof -top` reads the profiles), BENCH_AB_BIN=PATH ((a): then the GPU-share pods
# through kube-scheduler + extender again, BENCH_AB_ROUNDS (2) rounds alternating the extender
# binary GPUSHARE_BIN ("test") with PATH ("ab"), ABBA; each run's pods/s, CPU seconds per
# component and pod-watch objects in BENCH_OUT/ab.json, with their means per binary),
# BENCH_PERF=1 ((a): `perf record` of the extender during its run into
# BENCH_OUT/a-extender.perf.data; that run's pods/s then include perf's cost).
# Ports (loopback): BENCH_ETCD_PORT 24790 (+10), BENCH_API_PORT 17443, BENCH_SCHEDULER_PORT
# 21259, BENCH_EXT_PORT 40999, BENCH_KWOK_PORT 21247 — apart from tests/e2e-k8s's, so both
# can run on one machine.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/e2e-k8s/cluster.sh
source "$BENCH_DIR/../tests/e2e-k8s/cluster.sh"

KWOK_VERSION=0.8.0
KWOK_DIR=$E2E_PEERS_DIR/kwok-$KWOK_VERSION
BENCH_OUT=${BENCH_OUT:-$E2E_REPO/target/bench/cluster}
BENCH_PODS=${BENCH_PODS:-2000}
BENCH_SEED=${BENCH_SEED:-42}
export BENCH_TRACE=${BENCH_TRACE:-default}
BENCH_LOAD=${BENCH_LOAD:-100}
BENCH_PARALLEL=${BENCH_PARALLEL:-16}
BENCH_PARTS=${BENCH_PARTS:-a,b}
BENCH_POLICY=${BENCH_POLICY:-gpushare}
BENCH_TRACE_FIT=${BENCH_TRACE_FIT:-MostAllocated}
BENCH_TRACE_ALL=${BENCH_TRACE_ALL:-1}
BENCH_FILTER_BEST=${BENCH_FILTER_BEST:-1}
BENCH_PROFILE=${BENCH_PROFILE:-}
BENCH_TRACE_SCORE_PCT=${BENCH_TRACE_SCORE_PCT:-100}
BENCH_A_SCORE_PCT=${BENCH_A_SCORE_PCT:-}
BENCH_A_BASE_SCORE_PCT=${BENCH_A_BASE_SCORE_PCT:-}
BENCH_AB_BIN=${BENCH_AB_BIN:-}
BENCH_PERF=${BENCH_PERF:-}
BENCH_AB_ROUNDS=${BENCH_AB_ROUNDS:-2}
GPUSHARE_BIN=${GPUSHARE_BIN:-$E2E_REPO/target/release/gpushare}
TRACE_DIR=${BENCH_TRACE_DIR:-$E2E_REPO/../shared/traces/openb}
EXT_PORT=${BENCH_EXT_PORT:-19499}
KWOK_PORT=${BENCH_KWOK_PORT:-21247}
PY=(python3 "$BENCH_DIR/cluster.py")

log() { echo "bench-cluster: $*" >&2; }
die() {
    log "$*"
    exit 1
}

# build_kwok: kwok (the controller only) into KWOK_DIR. As for CRI-O (tests/e2e/crio.sh):
# `go install …@v0.8.0` reads the module's version list, which the proxy may refuse (403); the
# source copy `go mod download` fetches builds with its own go.mod and go.sum.
build_kwok() {
    local mod
    [[ -x $KWOK_DIR/kwok ]] && return 0
    log "building kwok $KWOK_VERSION into $KWOK_DIR"
    mod=$(cd "$E2E_REPO" && go mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" |
        jq -r '.Dir // empty') || mod=
    [[ -d $mod ]] || die "cannot download sigs.k8s.io/kwok@v$KWOK_VERSION"
    mkdir -p "$KWOK_DIR"
    (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -buildvcs=false \
        -ldflags "-s -w" -o "$KWOK_DIR/kwok.tmp" ./cmd/kwok) || {
        rm -f "$KWOK_DIR/kwok.tmp"
        die "kwok build failed"
    }
    mv -f "$KWOK_DIR/kwok.tmp" "$KWOK_DIR/kwok"
}

cleanup() {
    local rc=$?
    set +e
    if [[ -n ${K8S_ROOT:-} && -d ${K8S_ROOT:-} ]]; then
        _k8s_stop scheduler 20
        _k8s_stop extender 20
        _k8s_stop kwok 20
        if [[ ${BENCH_KEEP_LOGS:-0} == 1 ]]; then
            mkdir -p "$BENCH_OUT/logs" && cp -f "$K8S_ROOT"/*.log "$K8S_ROOT"/*.yaml "$BENCH_OUT/logs/" 2>/dev/null
        fi
    fi
    k8s_down
    exit "$rc"
}

# --------------------------------------------------------------- cluster ----
start_apiserver() {
    local p=$K8S_ROOT/pki
    _k8s_start apiserver "$K8S_BIN_DIR/kube-apiserver" \
        --v=1 \
        --etcd-servers "http://127.0.0.1:$K8S_ETCD_PORT" \
        --bind-address 127.0.0.1 \
        --advertise-address "$K8S_NODE_IP" \
        --secure-port "$K8S_API_PORT" \
        --cert-dir "$p" \
        --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
        --client-ca-file "$p/ca.crt" \
        --authorization-mode RBAC \
        --disable-admission-plugins TaintNodesByCondition \
        --service-cluster-ip-range "$K8S_SERVICE_CIDR" \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$p/sa.pub" \
        --service-account-signing-key-file "$p/sa.key" \
        --endpoint-reconciler-type none \
        --max-requests-inflight 3000 \
        --max-mutating-requests-inflight 1500 \
        --enable-priority-and-fairness=false \
        --profiling="$([[ -n $BENCH_PROFILE ]] && echo true || echo false)"
    _k8s_wait apiserver 180 "kube-apiserver /readyz" k8s_kubectl get --raw /readyz
}

# write_scheduler_config EXTENDER(0|1) TRACE(0|1)
write_scheduler_config() {
    local ext=$1 trace=$2 f=$K8S_ROOT/scheduler.yaml r
    cat >"$f" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $K8S_ROOT/scheduler.kubeconfig
  qps: 5000
  burst: 10000
leaderElection:
  leaderElect: false
EOF
    if ! ((trace)); then
        # (a): kube-scheduler's adaptive node search unless BENCH_A_SCORE_PCT (the runs with
        # the extender) or BENCH_A_BASE_SCORE_PCT (the runs without) sets it.
        local pct=$BENCH_A_BASE_SCORE_PCT
        ((ext)) && pct=$BENCH_A_SCORE_PCT
        [[ -z $pct ]] || echo "percentageOfNodesToScore: $pct" >>"$f"
    fi
    if ((trace)); then
        [[ $BENCH_TRACE_SCORE_PCT == default ]] ||
            echo "percentageOfNodesToScore: $BENCH_TRACE_SCORE_PCT" >>"$f"
        cat >>"$f" <<EOF
profiles:
- schedulerName: default-scheduler
  plugins:
    score:
      disabled:
      - name: '*'
EOF
        if [[ $BENCH_TRACE_FIT != none ]]; then
            # NodeResourcesFit alone scores CPU and memory (weight 1: at most 100 points, one
            # extender point is 100): it places the pods without GPUs, which the extender
            # never sees, and breaks the extender's ties.
            cat >>"$f" <<EOF
      enabled:
      - name: NodeResourcesFit
        weight: 1
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: $BENCH_TRACE_FIT
        resources:
        - name: cpu
          weight: 1
        - name: memory
          weight: 1
EOF
        fi
    fi
    if ((ext)); then
        cat >>"$f" <<EOF
extenders:
- urlPrefix: "http://127.0.0.1:$EXT_PORT"
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  weight: 10
  enableHTTPS: false
  nodeCacheCapable: true
  ignorable: false
  httpTimeout: 10s
EOF
        # (b) with BENCH_TRACE_ALL=1 (the default): no managedResources, so kube-scheduler
        # asks the extender about every pod and the pods without GPUs are ranked by the same
        # policy as in the simulator (which places them too).
        if ! ((trace)) || [[ $BENCH_TRACE_ALL != 1 ]]; then
            echo "  managedResources:" >>"$f"
            for r in aliyun.com/gpu-mem aliyun.com/gpu-core.percentage aliyun.com/gpu-count; do
                printf '  - name: %s\n    ignoredByScheduler: false\n' "$r" >>"$f"
            done
        fi
    fi
}

start_scheduler() { # EXTENDER TRACE
    _k8s_stop scheduler 20
    write_scheduler_config "$1" "$2"
    local allow=()
    # BENCH_PROFILE: its profile and metrics readable without credentials (loopback only).
    [[ -z $BENCH_PROFILE ]] ||
        allow=(--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/debug/pprof/*)
    _k8s_start scheduler "$K8S_BIN_DIR/kube-scheduler" \
        --v=1 \
        --config "$K8S_ROOT/scheduler.yaml" \
        --bind-address 127.0.0.1 --secure-port "$K8S_SCHEDULER_PORT" "${allow[@]}"
    _k8s_wait scheduler 90 "kube-scheduler /healthz" \
        _k8s_https_ok "https://127.0.0.1:$K8S_SCHEDULER_PORT/healthz"
}

start_extender() { # [BINARY] (default: the copy of GPUSHARE_BIN)
    _k8s_stop extender 20
    _k8s_start extender "${1:-$K8S_ROOT/gpushare}" scheduler \
        --listen "127.0.0.1:$EXT_PORT" --insecure-http \
        --kubeconfig "$K8S_ROOT/admin.kubeconfig" \
        --policy "$BENCH_POLICY" --memory-unit MiB --log-level warn \
        --filter-best "$BENCH_FILTER_BEST"
    _k8s_wait extender 60 "extender /healthz (synced)" \
        curl -fs --max-time 2 "http://127.0.0.1:$EXT_PORT/healthz"
}

start_kwok() {
    # Only the node stage that makes a node Ready (from kwok's kustomize/stage/node/fast),
    # trimmed: no pod stages, so KWOK leaves the pods alone.
    cat >"$K8S_ROOT/kwok.yaml" <<'EOF'
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type  | Quote }}
      {{ end }}
      addresses:
      - address: {{ NodeIP | Quote }}
        type: InternalIP
      - address: {{ NodeName | Quote }}
        type: Hostname
      allocatable:
      {{ YAML .status.allocatable 1 }}
      capacity:
      {{ YAML .status.capacity 1 }}
      nodeInfo:
        architecture: amd64
        kubeletVersion: fake
        operatingSystem: linux
      phase: Running
EOF
    _k8s_start kwok "$KWOK_DIR/kwok" \
        --kubeconfig "$K8S_ROOT/admin.kubeconfig" \
        --config "$K8S_ROOT/kwok.yaml" \
        --manage-all-nodes=false \
        --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
        --node-lease-duration-seconds 3600 \
        --server-address "127.0.0.1:$KWOK_PORT" \
        --cidr 10.0.0.1/16 --node-ip 10.0.0.1
}

ready_nodes() {
    k8s_kubectl get nodes -l type=kwok --chunk-size=0 \
        -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
        grep -c True || true
}

wait_nodes_ready() { # N
    local n=$1 deadline=$((SECONDS + 300)) got
    while :; do
        got=$(ready_nodes)
        ((got < n)) || break
        ((SECONDS < deadline)) || die "only $got of $n KWOK nodes Ready after 300 s"
        _k8s_pid kwok >/dev/null || _k8s_fail_log kwok "kwok exited" || exit 1
        sleep 2
    done
    log "$n KWOK nodes Ready"
}

delete_pods() {
    k8s_kubectl delete --raw "/api/v1/namespaces/bench/pods?gracePeriodSeconds=0" >/dev/null
    local deadline=$((SECONDS + 300))
    while [[ -n $(k8s_kubectl -n bench get pods --chunk-size=0 -o name 2>/dev/null | head -1) ]]; do
        ((SECONDS < deadline)) || die "pods of namespace bench not gone after 300 s"
        sleep 1
    done
}

load_avg() { cut -d' ' -f1-3 /proc/loadavg; }

# cpu_snapshot: {component: CPU seconds used so far} for the cluster's processes.
cpu_snapshot() {
    local n pid hz ticks out=()
    hz=$(getconf CLK_TCK)
    for n in etcd apiserver scheduler extender kwok; do
        pid=$(_k8s_pid "$n") || continue
        # utime + stime: fields 14 and 15 of /proc/PID/stat (after the parenthesized name).
        ticks=$(sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')
        out+=("\"$n\": $(awk -v t="$ticks" -v h="$hz" 'BEGIN{printf "%.2f", t / h}')")
    done
    local IFS=,
    echo "{${out[*]}}"
}

# profile_scheduler NAME: with BENCH_PROFILE=SECONDS, kube-scheduler's CPU profile over the
# next SECONDS (in the background: start it just before a run) into BENCH_OUT/NAME.pprof, and
# scheduler_metrics NAME its metrics into BENCH_OUT/NAME-metrics.txt (after the run).
PROFILE_PID=
profile_scheduler() {
    [[ -n $BENCH_PROFILE ]] || return 0
    curl -fsk --max-time $((BENCH_PROFILE + 30)) -o "$BENCH_OUT/$1.pprof" \
        "https://127.0.0.1:$K8S_SCHEDULER_PORT/debug/pprof/profile?seconds=$BENCH_PROFILE" &
    PROFILE_PID=$!
    # The API server's over the same time (admin credentials), beside it.
    k8s_kubectl get --raw "/debug/pprof/profile?seconds=$BENCH_PROFILE" \
        >"$BENCH_OUT/${1%-scheduler}-apiserver.pprof" 2>/dev/null &
    PROFILE_PID="$PROFILE_PID $!"
}
scheduler_metrics() {
    [[ -n $BENCH_PROFILE ]] || return 0
    # shellcheck disable=SC2086 # two PIDs
    [[ -z $PROFILE_PID ]] || wait $PROFILE_PID || true
    PROFILE_PID=
    curl -fsk --max-time 10 -o "$BENCH_OUT/$1-metrics.txt" \
        "https://127.0.0.1:$K8S_SCHEDULER_PORT/metrics" || true
}

# perf_extender NAME: with BENCH_PERF=1, `perf record` (sampling at 499 Hz, DWARF call graphs) of
# the extender until perf_extender_stop, into BENCH_OUT/NAME.perf.data (`perf report -i …`).
# perf costs CPU beside the run: the run's pods/s are not comparable with the others'.
PERF_PID=
perf_extender() {
    [[ -n $BENCH_PERF ]] || return 0
    command -v perf >/dev/null || die "BENCH_PERF=1: perf not found"
    perf record -q -F 499 --call-graph dwarf,8192 -o "$BENCH_OUT/$1.perf.data" \
        -p "$(_k8s_pid extender)" >/dev/null 2>&1 &
    PERF_PID=$!
    sleep 1
}
perf_extender_stop() {
    [[ -n $PERF_PID ]] || return 0
    kill -INT "$PERF_PID" 2>/dev/null || true
    wait "$PERF_PID" 2>/dev/null || true
    PERF_PID=
}

# measure NAME PODS-FILE OUT-JSON [run options...]: the run, with the load average and the
# CPU seconds each component used during it.
measure() {
    local name=$1 pods=$2 out=$3 before after
    shift 3
    before=$(cpu_snapshot)
    log "$name (load $(load_avg))"
    "${PY[@]}" run "$pods" "$out" "$@"
    after=$(cpu_snapshot)
    jq --arg l "$(load_avg)" --argjson b "$before" --argjson a "$after" \
        '.load_after = $l | .cpu_s = ($a | with_entries(.value = ((.value - ($b[.key] // 0)) * 100 | round) / 100))' \
        "$out" >"$out.tmp" && mv "$out.tmp" "$out"
    log "$name: $(jq -c '{pods_per_s, first_created_to_last_bound_s, bound, cpu_s}' "$out")"
}

# ------------------------------------------------------------------ main ----
[[ $(id -u) -eq 0 ]] || die "needs root (as tests/e2e-k8s does)"
command -v python3 >/dev/null || die "python3 not found"
command -v jq >/dev/null || die "jq not found"
[[ -x $GPUSHARE_BIN ]] || die "$GPUSHARE_BIN not found (make build, or set GPUSHARE_BIN)"
[[ -r $TRACE_DIR/openb_node_list_gpu_node.csv ]] || die "no openb trace in $TRACE_DIR"
export BENCH_TRACE_DIR=$TRACE_DIR BENCH_A_SCORE_PCT BENCH_A_BASE_SCORE_PCT

k8s_build_peers kube-apiserver kube-scheduler kubectl || die "building Kubernetes failed"
build_kwok

mkdir -p "$BENCH_OUT"
root=$(mktemp -d /tmp/gpushare-kwok.XXXXXX)
trap cleanup EXIT
trap 'exit 130' INT TERM
touch "$root/.gpushare-k8s-root" "$root/iptables-preexisting" # k8s_down: ours; no kubelet chains
export K8S_ROOT=$root K8S_NODE=bench-control-plane
export K8S_NODE_IP
K8S_NODE_IP=$(_k8s_node_ip)
export K8S_ETCD_PORT=${BENCH_ETCD_PORT:-24790} K8S_API_PORT=${BENCH_API_PORT:-17443}
export K8S_SCHEDULER_PORT=${BENCH_SCHEDULER_PORT:-21259}
export K8S_SERVICE_CIDR=10.96.0.0/16 K8S_LOG_LEVEL=1
export K8S_API=https://127.0.0.1:$K8S_API_PORT K8S_CA=$root/pki/ca.crt
export KUBECONFIG=$root/admin.kubeconfig K8S_KUBECTL K8S_BIN_DIR
export BENCH_API=$K8S_API BENCH_CA=$root/pki/ca.crt
export BENCH_CERT=$root/pki/admin.crt BENCH_KEY=$root/pki/admin.key
# A rebuild must not swap the binary mid-run.
cp "$GPUSHARE_BIN" "$root/gpushare"

t_up=$SECONDS
_k8s_make_pki || die "PKI"
_k8s_start_etcd || die "etcd did not start"
start_apiserver || die "kube-apiserver did not start"
k8s_ensure_namespace bench || die "namespace bench"
start_kwok
"${PY[@]}" nodes core_mem MiB "$root/nodes-core.jsonl"
"${PY[@]}" create "$root/nodes-core.jsonl" --parallel 8 >&2
nodes=$(wc -l <"$root/nodes-core.jsonl")
wait_nodes_ready "$nodes"
log "cluster up in $((SECONDS - t_up)) s: $nodes KWOK nodes, load $(load_avg)"

summary=$BENCH_OUT/summary.json
echo '{}' >"$summary"
add() { # KEY JSON-FILE
    jq --arg k "$1" --slurpfile v "$2" '.[$k] = $v[0]' "$summary" >"$summary.tmp" && mv "$summary.tmp" "$summary"
}
jq -n --arg l "$(load_avg)" --argjson n "$nodes" --arg c "$(nproc)" \
    --argjson fb "$BENCH_FILTER_BEST" --argjson all "$BENCH_TRACE_ALL" --arg fit "$BENCH_TRACE_FIT" \
    '{nodes: $n, cpus: ($c|tonumber), load_at_start: $l, filter_best: $fb, trace_all: $all, trace_fit: $fit}' \
    >"$BENCH_OUT/machine.json"
add machine "$BENCH_OUT/machine.json"

if [[ ,$BENCH_PARTS, == *,a,* ]]; then
    # (a) kube-scheduler alone, then with the extender, on the same pods.
    "${PY[@]}" pods-share "$BENCH_PODS" "$root/pods-plain.jsonl" --plain
    "${PY[@]}" pods-share "$BENCH_PODS" "$root/pods-share.jsonl"
    start_scheduler 0 0
    profile_scheduler a-plain-scheduler
    measure "(a) $BENCH_PODS pods without GPU limits, kube-scheduler alone" \
        "$root/pods-plain.jsonl" "$BENCH_OUT/a-plain.json" --parallel "$BENCH_PARALLEL"
    scheduler_metrics a-plain-scheduler
    delete_pods
    # The GPU pods through kube-scheduler alone (it counts the nodes' aliyun.com/gpu-mem as
    # a whole, no GPU is chosen): what the extended resources cost kube-scheduler itself
    # (NodeResourcesFit validates each extended resource name, per pod and node, with a
    # regular expression), apart from what the extender adds.
    profile_scheduler a-share-alone-scheduler
    measure "(a) $BENCH_PODS GPU-share pods, kube-scheduler alone (no extender)" \
        "$root/pods-share.jsonl" "$BENCH_OUT/a-share-alone.json" --parallel "$BENCH_PARALLEL"
    scheduler_metrics a-share-alone-scheduler
    delete_pods
    start_extender
    start_scheduler 1 0
    profile_scheduler a-extender-scheduler
    perf_extender a-extender
    measure "(a) $BENCH_PODS GPU-share pods, kube-scheduler + extender" \
        "$root/pods-share.jsonl" "$BENCH_OUT/a-extender.json" --parallel "$BENCH_PARALLEL"
    perf_extender_stop
    scheduler_metrics a-extender-scheduler
    curl -fs "http://127.0.0.1:$EXT_PORT/metrics" >"$BENCH_OUT/a-extender-metrics.txt" || true
    k8s_kubectl get nodes -l type=kwok --chunk-size=0 -o json >"$root/nodes.json"
    k8s_kubectl -n bench get pods --chunk-size=0 -o json >"$root/pods.json"
    "${PY[@]}" check-share "$root/nodes.json" "$root/pods.json" "$BENCH_OUT/a-check.json"
    jq -n --slurpfile p "$BENCH_OUT/a-plain.json" --slurpfile e "$BENCH_OUT/a-extender.json" \
        --slurpfile s "$BENCH_OUT/a-share-alone.json" --slurpfile c "$BENCH_OUT/a-check.json" \
        '{plain_pods_per_s: $p[0].pods_per_s, extender_pods_per_s: $e[0].pods_per_s,
          ratio: (if $p[0].pods_per_s then (($e[0].pods_per_s / $p[0].pods_per_s) * 1000 | round) / 1000 else null end),
          share_alone_pods_per_s: $s[0].pods_per_s,
          ratio_to_share_alone: (if $s[0].pods_per_s then (($e[0].pods_per_s / $s[0].pods_per_s) * 1000 | round) / 1000 else null end),
          goal: 0.9, bound: $e[0].bound, pods: $e[0].pods,
          score_pct_extender: $ENV.BENCH_A_SCORE_PCT, score_pct_base: $ENV.BENCH_A_BASE_SCORE_PCT,
          overcommitted_gpus: $c[0].overcommitted_gpus}' >"$BENCH_OUT/a.json"
    add a "$BENCH_OUT/a.json"
    log "(a) $(jq -c . "$BENCH_OUT/a.json")"
    delete_pods
    if [[ -n $BENCH_AB_BIN ]]; then
        # Two extender binaries on the same cluster and pods, alternating (ABBA: round 1 the
        # binary under test first, round 2 the other first, …), kube-scheduler restarted for
        # each run: what one change to the extender costs or saves, with the host's drift
        # spread over both.
        cp "$BENCH_AB_BIN" "$root/gpushare-ab"
        ab_runs=()
        for ((r = 1; r <= BENCH_AB_ROUNDS; r++)); do
            order=(test ab)
            ((r % 2)) || order=(ab test)
            for which in "${order[@]}"; do
                bin=$root/gpushare
                [[ $which == test ]] || bin=$root/gpushare-ab
                start_extender "$bin"
                start_scheduler 1 0
                out=$BENCH_OUT/ab-$r-$which.json
                measure "(a/b) round $r, $which ($([[ $which == test ]] && echo "$GPUSHARE_BIN" || echo "$BENCH_AB_BIN"))" \
                    "$root/pods-share.jsonl" "$out" --parallel "$BENCH_PARALLEL"
                curl -fs "http://127.0.0.1:$EXT_PORT/metrics" >"$BENCH_OUT/ab-$r-$which-metrics.txt" || true
                jq --arg w "$which" --argjson r "$r" \
                    --argjson pe "$(sed -n 's/^gpushare_extender_watch_objects_total{resource="pods"} //p' \
                        "$BENCH_OUT/ab-$r-$which-metrics.txt" | grep . || echo null)" \
                    '{which: $w, round: $r, pods_per_s, cpu_s, pod_watch_objects: $pe}' "$out" >"$out.row"
                ab_runs+=("$out.row")
                delete_pods
                _k8s_stop scheduler 20
            done
        done
        jq -s '{runs: ., by_binary: (group_by(.which) | map({which: .[0].which, runs: length,
                  pods_per_s: map(.pods_per_s), pods_per_s_mean: ((map(.pods_per_s) | add / length) * 10 | round / 10),
                  cpu_s_mean: (map(.cpu_s) as $cs | ($cs[0] | keys) as $k | reduce $k[] as $c ({};
                      .[$c] = (($cs | map(.[$c] // 0) | add) / ($cs | length) * 100 | round / 100)))}))}' \
            "${ab_runs[@]}" >"$BENCH_OUT/ab.json"
        add ab "$BENCH_OUT/ab.json"
        log "(a/b) $(jq -c '.by_binary' "$BENCH_OUT/ab.json")"
    fi
    _k8s_stop scheduler 20
    _k8s_stop extender 20
fi

if [[ ,$BENCH_PARTS, == *,b,* ]]; then
    # (b) memory-only sharing nodes without a placement label, as the simulator's.
    k8s_kubectl label nodes -l type=kwok --overwrite ack.node.gpu.schedule=share \
        ack.node.gpu.placement- >/dev/null
    "${PY[@]}" pods-trace "$BENCH_SEED" "$BENCH_LOAD" "$root/pods-trace.jsonl" >&2
    start_extender
    start_scheduler 1 1
    measure "(b) openb $BENCH_TRACE, seed $BENCH_SEED, up to $BENCH_LOAD % arrived load, in order" \
        "$root/pods-trace.jsonl" "$BENCH_OUT/b-run.json" --parallel "${BENCH_TRACE_PARALLEL:-1}" --timeout 3600
    curl -fs "http://127.0.0.1:$EXT_PORT/metrics" >"$BENCH_OUT/b-extender-metrics.txt" || true
    k8s_kubectl get nodes -l type=kwok --chunk-size=0 -o json >"$root/nodes.json"
    k8s_kubectl -n bench get pods --chunk-size=0 -o json >"$root/pods.json"
    "${PY[@]}" check-trace "$root/pods-trace.jsonl.meta.json" "$root/pods.json" "$root/nodes.json" \
        "$BENCH_OUT/b-cluster.json"
    if [[ ${BENCH_KEEP_LOGS:-0} == 1 ]]; then
        mkdir -p "$BENCH_OUT/logs" && cp -f "$root/pods-trace.jsonl" "$root/pods-trace.jsonl.meta.json" \
            "$root/pods.json" "$root/nodes.json" "$BENCH_OUT/logs/"
    fi
    # `gpushare simulate` of the same trace, seed and load into BENCH_OUT/NAME, its JSON copied
    # to BENCH_OUT/b-NAME.json; the arguments after NAME are added to the command.
    simulate_b() {
        local name=$1 sim
        shift
        "$root/gpushare" simulate --nodes "$TRACE_DIR/openb_node_list_gpu_node.csv" \
            --pods "$TRACE_DIR/openb_pod_list_$BENCH_TRACE.csv" --policy "$BENCH_POLICY" --seeds 1 \
            --seed-base "$BENCH_SEED" --max-load "$BENCH_LOAD" --json "$@" --out "$BENCH_OUT/$name" \
            >"$BENCH_OUT/$name.out" 2>&1 || die "gpushare simulate $* failed: $(tail -5 "$BENCH_OUT/$name.out")"
        sim=$(find "$BENCH_OUT/$name" -name '*.json' | head -1)
        [[ -n $sim ]] || die "gpushare simulate wrote no JSON under $BENCH_OUT/$name"
        cp "$sim" "$BENCH_OUT/b-$name.json"
    }
    simulate_b simulate
    # The same replay deciding as the extender does (shapes learned from the pods placed,
    # ties by node name), behind the same node search as kube-scheduler's: what the
    # simulator predicts for this cluster, beside its oracle figure above.
    search=()
    if [[ $BENCH_TRACE_SCORE_PCT != 100 ]]; then
        nodes=$(($(wc -l <"$TRACE_DIR/openb_node_list_gpu_node.csv") - 1))
        pct=$BENCH_TRACE_SCORE_PCT
        if [[ $pct == default ]]; then # kube-scheduler's adaptive share: 50 % less 1 per 125 nodes, 5 at least
            pct=$((50 - nodes / 125))
            if ((pct < 5)); then pct=5; fi
        fi
        len=$((nodes * pct / 100))
        if ((len < 100)); then len=100; fi # it never stops before 100 nodes
        search=(--search-nodes "$len")
    fi
    simulate_b simulate-as-extender --as-extender "${search[@]}"
    jq -n --slurpfile c "$BENCH_OUT/b-cluster.json" --slurpfile s "$BENCH_OUT/b-simulate.json" \
        --slurpfile x "$BENCH_OUT/b-simulate-as-extender.json" --arg l "$BENCH_LOAD" --arg t "$BENCH_TRACE" \
        '($s[0].results[0]) as $r | ($x[0].results[0]) as $e |
         {policy: $r.policy, trace: $t, seed: $c[0].seed, load_pct: ($l|tonumber), pods: $c[0].pods,
          simulate_attempts: $r.attempts,
          cluster_failed: $c[0].failed, simulate_failed: $r.failed,
          cluster_unallocated_pct: $c[0].unallocated_at_load_pct[$l],
          simulate_unallocated_pct: $r.unallocated_pct[$l].median,
          diff_points: ((($c[0].unallocated_at_load_pct[$l] - $r.unallocated_pct[$l].median) * 100 | round) / 100),
          goal_points: 0.5, overcommitted_gpus: $c[0].overcommitted_gpus,
          simulate_as_extender: {search_nodes: $x[0].search_nodes, failed: $e.failed,
            unallocated_pct: $e.unallocated_pct[$l].median,
            diff_points: ((($c[0].unallocated_at_load_pct[$l] - $e.unallocated_pct[$l].median) * 100 | round) / 100)}}' >"$BENCH_OUT/b.json"
    log "(b) $(jq -c . "$BENCH_OUT/b.json")"
    add b "$BENCH_OUT/b.json"
    add b_cluster "$BENCH_OUT/b-cluster.json"
    add b_run "$BENCH_OUT/b-run.json"
    add b_simulate "$BENCH_OUT/b-simulate.json"
    add b_simulate_as_extender "$BENCH_OUT/b-simulate-as-extender.json"
fi
jq --arg l "$(load_avg)" '.machine.load_at_end = $l' "$summary" >"$summary.tmp" && mv "$summary.tmp" "$summary"
log "results in $BENCH_OUT (summary.json)"
