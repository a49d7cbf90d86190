#!/usr/bin/env bash
# cri-tools' own validation suite, critest (the release of the crictl we use), against a
# throwaway containerd 2 with NRI on: first without the agent, then with `gpushare node`
# (simulated GPUs) attached to the same containerd. Every test that passes without the agent
# must pass with it. A test that fails only with the agent is run once more (with the agent)
# before it counts, since some of critest's tests wait on timers that a loaded 2-CPU machine
# can miss; one that then passes is listed as such.
#
# What critest needs, and how it gets it here:
#   - images: critest pulls them by name from registry.k8s.io and gcr.io (CRI PullImage always
#     asks the registry). They are built from the host's static busybox by mkimage.sh under
#     the names critest expects (see push_images) and served by the CNCF distribution registry
#     (built from its Go module) on 127.0.0.1; containerd's hosts.toml sends registry.k8s.io,
#     gcr.io and k8s.gcr.io there. Stand-ins for images that are not busybox: nginx and httpd
#     are busybox httpd run by a script named nginx (what the tests look for: HTTP 200, a pid
#     file, "master process" in its command line, "httpd" in its log); nonewprivs is
#     conformance/nonewprivs.go installed setuid root; pgrep and ipcs, which Debian's
#     busybox lacks, are small scripts.
#   - a quiet pause image: lib.sh's is a single process, so that containers sharing the
#     pod's PID namespace (`pgrep sleep`) see nothing of it;
#   - pod networking: a CNI bridge with portmap (Debian's containernetworking-plugins);
#   - NRI: critest's NRI tests connect plugins of their own to containerd's NRI socket, next
#     to the agent in the second run.
# Tests skipped with critest's -ginkgo.skip, the same in both runs: see SKIPS. critest also
# skips its benchmarks, and tests whose feature the host or runtime lacks (AppArmor, user
# namespaces with runc 1.1); those are listed with critest's reason.
#
# Needs root; about 2.5 minutes on 2 CPUs once critest, ginkgo and the registry are built
# (tests/e2e/lib.sh e2e_build_conformance_peers, cached in target/peers/). Usage: tests/e2e/conformance.sh. Environment: CRITEST_NODES (parallel ginkgo
# processes, default 2), GPUSHARE_CONFORMANCE_PORT (agent status, 19404),
# GPUSHARE_CONFORMANCE_REGISTRY_PORT (19405), GPUSHARE_CONFORMANCE_BRIDGE (gpscnf0) and
# GPUSHARE_CONFORMANCE_SUBNET (10.89.0.0/16). Prints both runs' counts and any difference;
# exits non-zero when a test that passed without the agent does not pass with it. Logs,
# ginkgo's JSON reports and the per-test results are kept in target/e2e-conformance/.
set -euo pipefail
export LC_ALL=C # one collation for sort and comm

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/e2e/lib.sh
source "$here/lib.sh"

BIN=${GPUSHARE_BIN:-$repo/target/release/gpushare}
[[ -x $BIN ]] || { echo "e2e: $BIN not built (make build)" >&2; exit 1; }
NODES=${CRITEST_NODES:-2}
PORT=${GPUSHARE_CONFORMANCE_PORT:-19404}
REGISTRY_PORT=${GPUSHARE_CONFORMANCE_REGISTRY_PORT:-19405}
BRIDGE=${GPUSHARE_CONFORMANCE_BRIDGE:-gpscnf0}
SUBNET=${GPUSHARE_CONFORMANCE_SUBNET:-10.89.0.0/16}
LOGS=$repo/target/e2e-conformance
CRITEST=$E2E_CRITEST_DIR/critest

# Tests not run (critest -ginkgo.skip, regular expressions over the full test name), each
# with why. Both runs skip the same.
SKIPS=(
    # The digest names the manifest of the image on gcr.io; a local build cannot have it.
    'public image with digest should be pulled and removed'
    # Debian's busybox runs applets inside its shell (FEATURE_SH_STANDALONE), so masking
    # /bin/ls does not stop `sh -c ls` as the test expects of busybox:1.29.
    'runtime should support MaskedPaths'
    # These two race container creations against a late plugin's Synchronize and skip
    # themselves when containerd loses one (a gap critest knows of): whether they pass or
    # skip is down to timing, with or without the agent.
    'NRI plugin synchronization should receive a callback for container created during the Synchronize call'
    'NRI plugin synchronization should receive information about all containers without the race condition'
    # (critest adds `benchmark` itself: validation runs skip the benchmarks.)
)

# ----------------------------------------------------------------- images ----
# The images critest uses, built from busybox by mkimage.sh and pushed to the local registry
# under each name critest gives them (the path without the registry's host: critest's three
# registries are one here, so registry.k8s.io/pause:3.9 and k8s.gcr.io/pause:3.9 are one
# image, as critest expects of the real ones).
CRI_TOOLS=gcr.io/k8s-staging-cri-tools
E2E_IMAGES=registry.k8s.io/e2e-test-images
PASSWD=$'root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/false\n'
GROUP=$'root:x:0:\nwww-data:x:33:\n'
# The web servers' PID 1: busybox httpd under a script named nginx, so that `pidof nginx`
# finds it, with "nginx: master process" as its first argument and its pid in
# /var/run/nginx.pid, as the real nginx has; it exits on SIGTERM.
# shellcheck disable=SC2016 # expanded by the image's shell
NGINX_SH='#!/bin/sh
# Stands in for nginx and httpd: serves /usr/share/nginx/html on port $2.
trap "exit 0" TERM INT
mkdir -p /var/run && echo $$ >/var/run/nginx.pid
echo "httpd: serving on port $2"
httpd -f -v -p "$2" -h /usr/share/nginx/html &
wait
'
# Applets critest runs that Debian's busybox lacks.
# shellcheck disable=SC2016 # expanded by the image's shell
PGREP_SH='#!/bin/sh
# Stands in for pgrep NAME: the pids of the processes named NAME, one a line.
pids=$(pidof "$1") || exit 1
for p in $pids; do echo "$p"; done
'
# shellcheck disable=SC2016 # expanded by the image's shell
IPCS_SH='#!/bin/sh
# Stands in for ipcs -m: the shared memory segments of the IPC namespace.
echo "key        shmid      perms      bytes      nattch"
awk '"'"'NR > 1 { printf "0x%08x %-10s %-10s %-10s %s\n", $1, $2, $3, $4, $7 }'"'"' /proc/sysvipc/shm
'
WEB=(--script "/usr/sbin/nginx=$NGINX_SH"
    --file "/usr/share/nginx/html/index.html=<p>critest web server</p>")

# ctr in a namespace of its own, so that the CRI (namespace k8s.io) sees only what it pulls.
push_ctr() { "$E2E_CONTAINERD_DIR/ctr" --address "$E2E_CONTAINERD_SOCK" --namespace conformance-push "$@"; }

PUSHED=0
# push_image SHORT "REF..." MKIMAGE_ARGS...: build the image (cached; named after the first
# REF, with a file /SHORT that makes it differ from every other image) and push it to the
# local registry under every REF.
push_image() {
    local short=$1 refs tar ref
    read -r -a refs <<<"$2"
    shift 2
    tar=$(e2e_image_tar "cnf-$short" "${refs[0]}" --file "/$short=$short" "$@") || return 1
    push_ctr images import --local --no-unpack --platform linux/amd64 "$tar" >/dev/null || return 1
    for ref in "${refs[@]}"; do
        push_ctr images push --local --plain-http "127.0.0.1:$REGISTRY_PORT/${ref#*/}" "${refs[0]}" \
            >/dev/null || return 1
        PUSHED=$((PUSHED + 1))
    done
    push_ctr images rm "${refs[0]}" >/dev/null
}

push_images() {
    local nnp=$E2E_IMAGES_DIR/nonewprivs n user
    mkdir -p "$E2E_IMAGES_DIR" || return 1
    CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$nnp" "$here/conformance/nonewprivs.go" &&
        chmod 4755 "$nnp" || return 1
    push_image busybox "$E2E_IMAGES/busybox:1.29-2" --script "/bin/pgrep=$PGREP_SH" \
        --script "/bin/ipcs=$IPCS_SH" /bin/sh || return 1
    push_image pause "registry.k8s.io/pause:3.9 k8s.gcr.io/pause:3.9" "${E2E_PAUSE_CMD[@]}" || return 1
    push_image nginx "$E2E_IMAGES/nginx:1.14-2" "${WEB[@]}" \
        /usr/sbin/nginx 'nginx: master process' 80 || return 1
    push_image httpd "$E2E_IMAGES/httpd:2.4.39-4" "${WEB[@]}" \
        /usr/sbin/nginx 'nginx: master process' 80 || return 1
    push_image hostnet-nginx "$CRI_TOOLS/hostnet-nginx-amd64:latest" "${WEB[@]}" \
        /usr/sbin/nginx 'nginx: master process' 12003 || return 1
    push_image nonewprivs "$E2E_IMAGES/nonewprivs:1.3" --copy "$nnp=/usr/local/bin/nnp" \
        --user 1000 /usr/local/bin/nnp || return 1
    # critest's image-test, image-user and image-predefined-group images: busybox (with a
    # file named after the image, as all here), with a User, with a user in a group of the
    # image's /etc/group.
    push_image test-image-latest "$CRI_TOOLS/test-image-latest:latest" /bin/sh || return 1
    push_image test-image-tag "$CRI_TOOLS/test-image-tag:test $CRI_TOOLS/test-image-tag:all" /bin/sh ||
        return 1
    for n in 1 2 3; do
        push_image "test-image-$n" "$CRI_TOOLS/test-image-$n:latest" /bin/sh || return 1
    done
    push_image test-image-tags \
        "$CRI_TOOLS/test-image-tags:1 $CRI_TOOLS/test-image-tags:2 $CRI_TOOLS/test-image-tags:3" \
        /bin/sh || return 1
    for user in uid:1002 username:www-data uid-group:1003:1004 username-group:www-data:1004; do
        push_image "test-image-user-${user%%:*}" "$CRI_TOOLS/test-image-user-${user%%:*}:latest" \
            --user "${user#*:}" --file "/etc/passwd=$PASSWD" --file "/etc/group=$GROUP" /bin/sh ||
            return 1
    done
    push_image test-image-predefined-group "$CRI_TOOLS/test-image-predefined-group:latest" \
        --user 1000 \
        --file "/etc/passwd=${PASSWD}default-user:x:1000:1000::/home/default-user:/bin/sh"$'\n' \
        --file "/etc/group=${GROUP}default-user:x:1000:"$'\n'"group-defined-in-image:x:50000:default-user"$'\n' \
        /bin/sh || return 1
}

# --------------------------------------------------------------- registry ----
REGISTRY_PID=
start_registry() {
    mkdir -p "$E2E_ROOT/registry" || return 1
    cat >"$E2E_ROOT/registry.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $E2E_ROOT/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$REGISTRY_PORT
EOF
    OTEL_TRACES_EXPORTER=none "$E2E_REGISTRY" serve "$E2E_ROOT/registry.yml" \
        </dev/null >"$E2E_ROOT/registry.log" 2>&1 &
    REGISTRY_PID=$!
    local i
    for ((i = 0; i < 100; i++)); do
        curl -fsS --max-time 2 "http://127.0.0.1:$REGISTRY_PORT/v2/" >/dev/null 2>&1 && return 0
        _e2e_alive "$REGISTRY_PID" || break
        sleep 0.1
    done
    echo "registry not answering on 127.0.0.1:$REGISTRY_PORT; log tail:" >&2
    tail -20 "$E2E_ROOT/registry.log" >&2
    return 1
}

# containerd pulls what critest names on these registries from the local one.
write_registry_hosts() { # DIR
    local host
    for host in registry.k8s.io gcr.io k8s.gcr.io; do
        mkdir -p "$1/$host" || return 1
        printf 'server = "http://127.0.0.1:%s"\n' "$REGISTRY_PORT" >"$1/$host/hosts.toml"
    done
}

# ---------------------------------------------------------------- critest ----
SKIP_RE=$(IFS='|'; echo "${SKIPS[*]}")

# run_critest NAME [CRITEST_ARGS...]: one run of the suite (NODES parallel processes, SKIPS
# skipped) against the current containerd; output in LOGS/NAME.log, ginkgo's report in
# LOGS/NAME.json, and one line per test, "STATE<TAB>NAME", sorted, in LOGS/NAME.tsv.
run_critest() {
    local name=$1 rc=0
    shift
    rm -f "$LOGS/$name".{log,json,tsv}
    # critest -parallel runs the ginkgo CLI (built beside it) from PATH; their temporary
    # files (and the tests' host directories) go to ROOT, which is removed at the end.
    mkdir -p "$E2E_ROOT/tmp"
    TMPDIR=$E2E_ROOT/tmp PATH="$E2E_CRITEST_DIR:$PATH" timeout 1500 "$CRITEST" -parallel "$NODES" \
        -config "$E2E_ROOT/crictl.yaml" \
        -runtime-endpoint "unix://$E2E_CONTAINERD_SOCK" -image-endpoint "unix://$E2E_CONTAINERD_SOCK" \
        -nri-socket "$E2E_NRI_SOCK" -ginkgo.skip "$SKIP_RE" -ginkgo.no-color \
        -ginkgo.json-report "$LOGS/$name.json" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
    if [[ ! -s $LOGS/$name.json ]]; then
        echo "critest ($name) left no report (exit $rc); log tail:" >&2
        tail -30 "$LOGS/$name.log" >&2
        return 1
    fi
    jq -r '.[].SpecReports[] | select(.LeafNodeType == "It")
        | "\(.State)\t\((.ContainerHierarchyTexts + [.LeafNodeText]) | join(" "))"' \
        "$LOGS/$name.json" | sort -t$'\t' -k2 >"$LOGS/$name.tsv"
}

# counts NAME: "N passed, M failed, K skipped" of LOGS/NAME.tsv (failed: anything not passed,
# skipped or pending).
counts() {
    awk -F'\t' '$1 == "passed" { p++ } $1 == "skipped" || $1 == "pending" { s++ }
        $1 != "passed" && $1 != "skipped" && $1 != "pending" { f++ }
        END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' "$LOGS/$1.tsv"
}

names_in() { # NAME STATE: the tests of LOGS/NAME.tsv in STATE
    awk -F'\t' -v s="$2" '$1 == s { print $2 }' "$LOGS/$1.tsv"
}

# A -ginkgo.focus expression matching exactly the test NAME (ginkgo's text for a spec may
# start with a space, from an unnamed outer container).
# shellcheck disable=SC2016 # a sed expression
focus_of() { printf '(^| )%s$' "$(sed 's/[][\\.*^$(){}?+|/]/\\&/g' <<<"$1")"; }

# The skipped tests of LOGS/NAME.json with why: critest's own reason, or SKIPS.
skip_reasons() {
    jq -r '.[].SpecReports[] | select(.LeafNodeType == "It" and .State == "skipped")
        | "\((.ContainerHierarchyTexts + [.LeafNodeText]) | join(" ")): \(
            if (.Failure.Message // "") == "" then "not run (-ginkgo.skip)"
            else .Failure.Message | split("\n")[0] end)"' "$LOGS/$1.json" | sort
}

# --------------------------------------------------------------- the agent ----
AGENT_PID=
DRIVER_DIR=
metric() { # NAME{LABELS}: its value on the agent's /metrics
    e2e_agent_status "$PORT" metrics | awk -v m="$1" '$1 == m { print $2 }'
}

start_agent() {
    DRIVER_DIR=$(e2e_gpu_fakes "$(dirname "$BIN")") || return 1
    e2e_agent_launch "$BIN" "$PORT" "$DRIVER_DIR"
    AGENT_PID=$E2E_AGENT_PID
    e2e_agent_wait_healthy "$PORT" 15 || return 1
    grep -m1 'registered with the runtime' "$E2E_ROOT/agent.log"
}

# What the agent's metrics say of the run: AGENT_SAW, one line.
agent_figures() {
    local connected syncs pass refused
    connected=$(metric gpushare_nri_connected) || connected='?'
    syncs=$(metric gpushare_synchronize_total) || syncs='?'
    pass=$(metric 'gpushare_create_container_total{result="passthrough"}') || pass='?'
    refused=$(metric 'gpushare_create_container_total{result="refused"}') || refused='?'
    AGENT_SAW="connected $connected, registrations $syncs, creations passed through $pass, refused $refused"
    AGENT_OK=0
    if e2e_agent_status "$PORT" healthz >/dev/null 2>&1 && [[ $connected == 1 && $syncs == 1 &&
        $pass =~ ^[0-9]+$ && $pass -gt 0 && $refused == 0 ]]; then
        AGENT_OK=1
    fi
}

# critest's HostIpc tests make a 1 MiB shared memory segment on the host (ipcmk) and leave
# it: remove the unattached 1 MiB segments that appeared since SHM_BEFORE was taken.
shm_ids() { awk 'NR > 1 && $4 == 1048576 && $7 == 0 { print $2 }' /proc/sysvipc/shm | sort; }
SHM_BEFORE=
remove_left_shm() {
    local id
    [[ -n $SHM_BEFORE ]] || return 0
    for id in $(comm -13 "$SHM_BEFORE" <(shm_ids)); do ipcrm -m "$id" 2>/dev/null || true; done
    rm -f "$SHM_BEFORE"
}

# ------------------------------------------------------------------- main ----
cleanup() {
    remove_left_shm
    if [[ -n $AGENT_PID ]]; then
        kill -9 "$AGENT_PID" 2>/dev/null || true
        wait "$AGENT_PID" 2>/dev/null || true
    fi
    if [[ -n $REGISTRY_PID ]]; then
        kill "$REGISTRY_PID" 2>/dev/null || true
        wait "$REGISTRY_PID" 2>/dev/null || true
    fi
    if [[ -n ${E2E_ROOT:-} && -d $E2E_ROOT ]]; then
        mkdir -p "$LOGS"
        cp -f "$E2E_ROOT"/{agent,containerd,registry}.log "$LOGS/" 2>/dev/null || true
    fi
    e2e_stop_containerd || true
    [[ -z ${ROOT:-} || ! -d $ROOT ]] || rm -rf --one-file-system "$ROOT" # never started
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE" 2>/dev/null || true; fi
    [[ -z $DRIVER_DIR ]] || rm -rf "$DRIVER_DIR"
}
trap cleanup EXIT

T0=$SECONDS
echo "=== conformance: critest $E2E_CRICTL_VERSION on containerd $E2E_CONTAINERD2_VERSION, without and with the agent ==="
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log "$LOGS"/*.json "$LOGS"/*.tsv
e2e_require "critest, ginkgo and the registry are built" e2e_build_conformance_peers
e2e_require "CNI plugins are installed" e2e_ensure_cni_plugins
ROOT=$(mktemp -d /tmp/gpushare-cnf.XXXXXX)
write_registry_hosts "$ROOT/hosts"
export E2E_REGISTRY_HOSTS_DIR=$ROOT/hosts
e2e_write_cni_config "$ROOT" "$BRIDGE" "$SUBNET" "$ROOT/cni-ipam"
e2e_require "containerd 2 starts (NRI, CNI bridge $BRIDGE, registries served locally)" \
    e2e_start_containerd 2 "$ROOT"
e2e_require "the local registry starts on 127.0.0.1:$REGISTRY_PORT" start_registry
e2e_require "critest's images are built and pushed to the local registry" push_images
echo "    $PUSHED image references in the registry"
T_SETUP=$((SECONDS - T0))
SHM_BEFORE=$(mktemp)
shm_ids >"$SHM_BEFORE"

t=$SECONDS
e2e_require "critest runs without the agent" run_critest without
T_WITHOUT=$((SECONDS - t))
echo "    without the agent: $(counts without) (${T_WITHOUT} s)"
# critest's image tests remove images by id; the sandbox image must have survived them.
e2e_require "the sandbox image $E2E_PAUSE_IMAGE is still there" e2e_crictl inspecti "$E2E_PAUSE_IMAGE"

e2e_require "the agent registers over $E2E_NRI_SOCK" start_agent
t=$SECONDS
e2e_require "critest runs with the agent attached" run_critest with
T_WITH=$((SECONDS - t))
echo "    with the agent: $(counts with) (${T_WITH} s)"
agent_figures
e2e_check "the agent stayed attached (one registration) and saw critest's containers created, none refused ($AGENT_SAW)" \
    test "$AGENT_OK" = 1

# Tests that passed without the agent and not with it get one more try, with the agent.
mapfile -t LOST < <(comm -23 <(names_in without passed) <(names_in with passed))
RETRIED_OK=()
if ((${#LOST[@]})); then
    focus=()
    for n in "${LOST[@]}"; do focus+=(-ginkgo.focus "$(focus_of "$n")"); done
    echo "    ${#LOST[@]} passed without the agent only; running them once more with it"
    if run_critest with-retry "${focus[@]}"; then
        mapfile -t RETRIED_OK < <(comm -12 <(printf '%s\n' "${LOST[@]}" | sort) <(names_in with-retry passed))
        mapfile -t LOST < <(comm -23 <(printf '%s\n' "${LOST[@]}" | sort) <(names_in with-retry passed))
    fi
fi
mapfile -t GAINED < <(comm -13 <(names_in without passed) <(names_in with passed))

echo "=== conformance results ($((SECONDS - T0)) s: setup ${T_SETUP} s, without ${T_WITHOUT} s, with ${T_WITH} s) ==="
echo "without the agent: $(counts without); with: $(counts with)"
echo "skipped without the agent:"
skip_reasons without | sed 's/^/    /'
if ! cmp -s <(names_in without skipped) <(names_in with skipped); then
    echo "skipped with the agent:"
    skip_reasons with | sed 's/^/    /'
fi
NOT_PASSED=$(awk -F'\t' '$1 != "passed" && $1 != "skipped" && $1 != "pending" { print "    " $1 ": " $2 }' \
    "$LOGS/without.tsv")
if [[ -n $NOT_PASSED ]]; then
    echo "failed without the agent (nothing to compare):"
    echo "$NOT_PASSED"
fi
((${#GAINED[@]} == 0)) || printf 'passed with the agent only: %s\n' "${GAINED[@]}"
((${#RETRIED_OK[@]} == 0)) ||
    printf 'failed with the agent at first, passed on the second try: %s\n' "${RETRIED_OK[@]}"
((${#LOST[@]} == 0)) || printf 'passed without the agent, not with it: %s\n' "${LOST[@]}"
e2e_check "every test that passed without the agent passes with it (${#LOST[@]} did not)" \
    test "${#LOST[@]}" -eq 0
e2e_summary
