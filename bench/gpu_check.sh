#!/usr/bin/env bash
# The device check (issue 10): on a machine with an NVIDIA GPU, its driver and PyTorch, run
# what only a real GPU can show, with binaries built beforehand (`make build` on the CI
# machine, carried over): no containerd, no Kubernetes — `gpushare run` holds each workload.
#   bash bench/gpu_check.sh            (make gpu-check; root; ≤ 8 minutes)
# Writes $OUT (default target/gpu-check)/gpu-check.json (the summary) and gpu-check.log.
# Benchmarks, not gates: every step records what it saw; the script fails only when it
# cannot run at all.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
BIN=${GPUSHARE_BIN:-$repo/target/release/gpushare}
LIB=${GPUSHARE_LIMITER:-$(dirname "$BIN")/libgpushare_limiter.so}
OUT=${OUT:-$repo/target/gpu-check}
GPU=${GPUSHARE_CHECK_GPU:-0}
mkdir -p "$OUT"
LOG=$OUT/gpu-check.log
: >"$LOG"
exec 3>>"$LOG"
log() { echo "$*" | tee -a /dev/fd/3 >&2; }
die() { log "gpu-check: $*"; exit 1; }

((EUID == 0)) || die "needs root (cgroups)"
[[ -x $BIN ]] || die "$BIN not built (make build)"
[[ -f $LIB ]] || die "$LIB not built (make build)"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: no NVIDIA driver here"
python3 -c 'import torch; assert torch.cuda.is_available()' 2>>"$LOG" ||
    die "python3 with a CUDA-enabled torch is needed"

RUN=("$BIN" run --gpu-backend nvml --gpu "$GPU" --limiter-library "$LIB")
declare -A R # results: key → JSON value

record() { R[$1]=$2; log "$1: $2"; }
json_str() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }

# Python workloads, written once.
PY=$OUT/work.py
cat >"$PY" <<'PYEOF'
import json, os, sys, time
import torch
GiB = 1 << 30
what = sys.argv[1]
if what == "view":
    free, total = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(0).total_memory
    print(json.dumps({"mem_get_info_total": total, "mem_get_info_free": free, "total_memory": props}))
elif what == "alloc":
    # 1.5 GiB must allocate; 1 GiB more must raise OutOfMemoryError.
    a = torch.empty(int(1.5 * GiB), dtype=torch.uint8, device="cuda")
    try:
        b = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        print(json.dumps({"first": "ok", "second": "allocated"}))
    except torch.OutOfMemoryError:
        print(json.dumps({"first": "ok", "second": "OutOfMemoryError"}))
elif what == "hold":
    a = torch.empty(int(sys.argv[2]) << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    time.sleep(float(sys.argv[3]))
elif what == "try":
    try:
        b = torch.empty(int(sys.argv[2]) << 20, dtype=torch.uint8, device="cuda")
        print(json.dumps({"try": "allocated"}))
    except torch.OutOfMemoryError:
        print(json.dumps({"try": "OutOfMemoryError"}))
elif what == "matmul":
    # A fixed matmul loop for the given seconds; prints iterations per second.
    n, secs = 4096, float(sys.argv[2])
    x = torch.randn(n, n, device="cuda", dtype=torch.float16)
    y = torch.randn(n, n, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    t0, it = time.time(), 0
    while time.time() - t0 < secs:
        for _ in range(10):
            z = x @ y
        torch.cuda.synchronize()
        it += 10
    print(json.dumps({"rate": it / (time.time() - t0)}))
elif what == "bypass":
    # Allocate past the quota through the driver directly (no limiter): the backstop must act.
    a = torch.empty(int(sys.argv[2]) << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print(json.dumps({"allocated_at": time.time()}), flush=True)
    time.sleep(30)
PYEOF

last_json() { grep -E '^\{' | tail -1; }

log "== capacity (NVML)"
cap=$("$BIN" capacity --gpu-backend nvml 2>>"$LOG")
record capacity "$(json_str "$cap")"

log "== the view under a 2 GiB quota"
smi=$("${RUN[@]}" --memory 2GiB -- nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits \
    -i "$GPU" 2>>"$LOG" | tail -1)
record nvidia_smi_memory_total_mib "$(json_str "$smi")"
record torch_view "$("${RUN[@]}" --memory 2GiB -- python3 "$PY" view 2>>"$LOG" | last_json)"
record torch_alloc "$("${RUN[@]}" --memory 2GiB -- python3 "$PY" alloc 2>>"$LOG" | last_json)"
record torch_alloc_expandable "$(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    "${RUN[@]}" --memory 2GiB -- python3 "$PY" alloc 2>>"$LOG" | last_json)"
record two_processes_share "$("${RUN[@]}" --memory 2GiB -- sh -c \
    "python3 '$PY' hold 1536 20 & sleep 12; python3 '$PY' try 1024; wait" 2>>"$LOG" | last_json)"

log "== compute: a matmul loop alone, under --core 30, and 30 + 70 at once"
alone=$("${RUN[@]}" --memory 4GiB -- python3 "$PY" matmul 20 2>>"$LOG" | last_json)
record matmul_alone "$alone"
q30=$("${RUN[@]}" --memory 4GiB --core 30 --json -- python3 "$PY" matmul 20 2>>"$LOG")
record matmul_core30 "$(echo "$q30" | grep '"rate"' | last_json)"
record matmul_core30_report "$(echo "$q30" | grep '"achieved_percent"' | last_json)"
("${RUN[@]}" --memory 4GiB --core 30 -- python3 "$PY" matmul 20 >"$OUT/c30.out" 2>>"$LOG") &
("${RUN[@]}" --memory 4GiB --core 70 -- python3 "$PY" matmul 20 >"$OUT/c70.out" 2>>"$LOG") &
wait
record matmul_pair_30 "$(last_json <"$OUT/c30.out")"
record matmul_pair_70 "$(last_json <"$OUT/c70.out")"

PROBE=${GPUSHARE_PROBE:-$(dirname "$BIN")/gpu-probe}
if [[ -x $PROBE ]]; then
    log "== graph memory: a captured 1.5 GiB allocation freed in its graph, launched under 2 GiB"
    # After the launch the graph allocator holds 1.5 GiB: 1 GiB more must be refused (rc=2)
    # until the trim. graph-reserved (the driver's own figure) says when the driver took it:
    # at the launch call, or only by the synchronization.
    record graph_memory "$(json_str "$("${RUN[@]}" --memory 2GiB -- "$PROBE" dlopen init capture \
        stream-async:1536 free:0 capture-end info alloc:1024 graph-reserved graph-launch \
        graph-reserved info sync graph-reserved info alloc:1024 graph-trim graph-reserved info \
        alloc:1024 2>>"$LOG" | paste -sd';')")"
    log "== graph launch cost: an empty graph launched 20000 times, with and without the limiter"
    steps=(dlopen init capture capture-end graph-launches:20000)
    record graph_launch_limiter "$(json_str "$("${RUN[@]}" --memory 2GiB -- "$PROBE" "${steps[@]}" \
        2>>"$LOG" | tail -1)")"
    record graph_launch_no_limiter "$(json_str "$("$BIN" run --gpu-backend nvml --gpu "$GPU" \
        --no-limiter --memory 2GiB -- "$PROBE" "${steps[@]}" 2>>"$LOG" | tail -1)")"
else
    log "== graph memory: skipped, no $PROBE (make build builds it)"
fi

log "== limiter overhead: the same loop without the limiter"
record matmul_no_limiter "$("$BIN" run --gpu-backend nvml --gpu "$GPU" --no-limiter --memory 4GiB \
    -- python3 "$PY" matmul 20 2>>"$LOG" | last_json)"

log "== backstop: 3 GiB past the limiter under a 2 GiB quota is killed"
"$BIN" run --gpu-backend nvml --gpu "$GPU" --no-limiter --memory 2GiB --json \
    -- python3 "$PY" bypass 3072 >"$OUT/bypass.out" 2>>"$LOG"
t1=$(date +%s.%N)
record backstop_report "$(last_json <"$OUT/bypass.out")"
# From the moment the over-quota memory was held to the end of the run (the kill).
t0=$(grep -o '"allocated_at": [0-9.]*' "$OUT/bypass.out" | awk '{print $2}')
record backstop_seconds "$(python3 -c "print(round($t1 - ${t0:-$t1}, 2) if '${t0}' else None)" |
    sed 's/None/null/')"

{
    echo "{"
    echo "  \"date\": $(json_str "$(date -u +%FT%TZ)"),"
    echo "  \"gpu\": $(json_str "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i "$GPU")"),"
    first=1
    for k in "${!R[@]}"; do
        ((first)) || echo ","
        first=0
        printf '  "%s": %s' "$k" "${R[$k]:-null}"
    done
    echo
    echo "}"
} >"$OUT/gpu-check.json"
log "wrote $OUT/gpu-check.json and $LOG"
