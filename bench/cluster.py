#!/usr/bin/env python3
"""Helper of bench/cluster.sh (`make bench-cluster`): writes the KWOK nodes of the openb
cluster, the benchmark's pods, creates them against the API server with parallel requests
while a watch stamps each pod's binding, and checks the written assignments.

Standard library only. Subcommands:
  nodes MODE UNIT OUT          the openb node list as KWOK Nodes (JSON lines) with the GPU
                               allocatable and the gpushare.io/gpus annotation the device
                               plugin publishes; MODE: ack.node.gpu.schedule value; UNIT:
                               GiB|MiB (the memory resource's unit)
  pods-share N OUT [--plain]   N one-GPU-share pods (gpu-mem 2048 MiB + core 30 %); --plain:
                               the same pods without GPU limits
  pods-trace SEED LOAD OUT     the openb pod list BENCH_TRACE (default: default) in the arrival order of
                               `gpushare simulate` for SEED (src/simulate/replay.rs:
                               Trace::arrivals) up to LOAD % arrived GPU demand, as
                               memory-only GPU-share pods in MiB (see bench/cluster.sh)
  run PODS RESULT [--parallel P]  create PODS (JSON lines) in namespace `bench`, P at a time
                               (1: strictly in order; 0: in order, each bound or refused
                               before the next is created), until each is bound or the
                               scheduler has tried it; writes timings to RESULT
  create DOCS [--parallel P]   create the Nodes / Pods of DOCS (JSON lines)
  check-share NODES PODS OUT   over-committed GPUs from the pods' gpushare.io/assignment
                               annotations (NODES, PODS: `kubectl get -o json` output)
  check-trace META PODS NODES OUT  the allocated and unallocated GPU % of a trace replay
Connection settings come from the environment: BENCH_API, BENCH_CA, BENCH_CERT, BENCH_KEY.
"""

import csv
import http.client
import json
import os
import queue
import ssl
import sys
import threading
import time
import urllib.parse

TRACE_DIR = os.environ.get("BENCH_TRACE_DIR", "")
# The simulator's trace GPU has 16,000 MiB, 16 MiB per milli (src/simulate/trace.rs); so do
# these nodes' GPUs, and a whole GPU asks all of its 16,000 MiB. (The API server stores such a
# quantity as "16k", its canonical form, which the extender reads since 0f925c3.)
MIB_PER_MILLI = 16
GPU_MEMORY_MIB = 1000 * MIB_PER_MILLI
WHOLE_GPU_MIB = GPU_MEMORY_MIB
NS = "bench"
M64 = (1 << 64) - 1


# ------------------------------------------------ src/simulate/rng.rs, bit for bit ----
class SplitMix64:
    def __init__(self, s):
        self.s = s & M64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Rng:
    def __init__(self, seed, stream):
        sm = SplitMix64(seed ^ ((stream * 0xD1B54A32D192ED03) & M64))
        self.s = [sm.next() for _ in range(4)]

    def next(self):
        s = self.s
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(self, n):
        m = self.next() * n
        if (m & M64) < n:
            threshold = ((1 << 64) - n) % n
            while (m & M64) < threshold:
                m = self.next() * n
        return m >> 64

    def shuffle(self, v):
        for i in range(len(v) - 1, 0, -1):
            j = self.below(i + 1)
            v[i], v[j] = v[j], v[i]


def selftest():
    s = SplitMix64(0)
    assert s.next() == 0xE220A8397B1DCDAF and s.next() == 0x6E789E6AA1B965F4


# ------------------------------------------------------------------- trace ----
def read_csv(path):
    with open(path, newline="") as f:
        return [{k.strip(): (v or "").strip() for k, v in r.items()} for r in csv.DictReader(f)]


def read_nodes():
    return read_csv(os.path.join(TRACE_DIR, "openb_node_list_gpu_node.csv"))


def node_doc(r, mode, unit):
    gpus = int(r["gpu"])
    per_gpu = GPU_MEMORY_MIB // (1024 if unit == "GiB" else 1)
    inv = {
        "version": 1,
        "gpus": [
            {"index": i, "uuid": f"GPU-{r['sn']}-{i}", "model": r["model"],
             "memoryMiB": GPU_MEMORY_MIB, "healthy": True}
            for i in range(gpus)
        ],
    }
    res = {
        "cpu": f"{int(r['cpu_milli'])}m",
        "memory": f"{int(r['memory_mib'])}Mi",
        "pods": "1000",
        "aliyun.com/gpu-mem": str(per_gpu * gpus),
        "aliyun.com/gpu-core.percentage": str(100 * gpus),
        "aliyun.com/gpu-count": str(gpus),
    }
    labels = {"type": "kwok", "kubernetes.io/hostname": r["sn"],
              "gpushare.io/model": r["model"]}
    if mode:
        labels["ack.node.gpu.schedule"] = mode
    if mode == "core_mem":
        labels["ack.node.gpu.placement"] = "binpack"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": r["sn"], "labels": labels,
                     "annotations": {"kwok.x-k8s.io/node": "fake",
                                     "gpushare.io/gpus": json.dumps(inv, separators=(",", ":"))}},
        "spec": {},
        "status": {"allocatable": res, "capacity": res},
    }


def pod_doc(name, cpu_milli, memory_mib, limits, labels=None):
    res = {}
    if cpu_milli:
        res["cpu"] = f"{cpu_milli}m"
    if memory_mib:
        res["memory"] = f"{memory_mib}Mi"
    resources = {}
    if res:
        resources["requests"] = dict(res)
    if limits:
        resources["limits"] = dict(limits)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {"app": "bench"}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "containers": [{"name": "main", "image": "bench.invalid/none:0",
                            "resources": resources}],
        },
    }


def write_lines(out, docs):
    with open(out, "w") as f:
        for d in docs:
            f.write(json.dumps(d, separators=(",", ":")) + "\n")


def cmd_nodes(mode, unit, out):
    write_lines(out, (node_doc(r, mode, unit) for r in read_nodes()))


def cmd_pods_share(n, out, plain=False):
    lim = {} if plain else {"aliyun.com/gpu-mem": "2048", "aliyun.com/gpu-core.percentage": "30"}
    write_lines(out, (pod_doc(f"share-{i:05d}", 0, 0, lim) for i in range(int(n))))


def arrivals(pods, capacity, seed, max_load):
    """src/simulate/replay.rs: Trace::arrivals (pods sorted by name)."""
    rng = Rng(seed, 0)
    seq = list(range(len(pods)))
    rng.shuffle(seq)
    demand = [p["num_gpu"] * p["gpu_milli"] for p in pods]
    limit = capacity * max_load
    total = sum(demand) * 100
    if not pods or all(d == 0 for d in demand):
        return seq
    while total < limit:
        i = rng.below(len(pods))
        d = demand[i] * 100
        if total + d > limit:
            break
        total += d
        seq.append(i)
    return seq


def cmd_pods_trace(seed, load, out):
    selftest()
    seed, load = int(seed), int(load)
    nodes = read_nodes()
    capacity = sum(int(r["gpu"]) for r in nodes) * 1000
    pods = []
    trace = os.environ.get("BENCH_TRACE", "default")
    for r in read_csv(os.path.join(TRACE_DIR, f"openb_pod_list_{trace}.csv")):
        pods.append({"name": r["name"], "cpu_milli": int(r["cpu_milli"]),
                     "memory_mib": int(r["memory_mib"]), "num_gpu": int(r["num_gpu"]),
                     "gpu_milli": min(int(r["gpu_milli"]), 1000)})
    pods.sort(key=lambda p: p["name"])
    seq = arrivals(pods, capacity, seed, load)
    docs, meta = [], []
    arrived = 0
    for k, i in enumerate(seq):
        p = pods[i]
        # Below 100 % the sequence is every pod of the list; the pods past LOAD % (bin LOAD)
        # change nothing at LOAD, so they are left out.
        arrived += p["num_gpu"] * p["gpu_milli"]
        if round(arrived / capacity * 100) > load:
            break
        name = f"t{k:05d}-{p['name']}"
        lim = {}
        if p["num_gpu"] == 1 and p["gpu_milli"] < 1000:
            # One GPU shared: the fraction of its memory (as the simulator takes it);
            # memory-only, see bench/cluster.sh for why.
            lim = {"aliyun.com/gpu-mem": str(p["gpu_milli"] * MIB_PER_MILLI)}
        elif p["num_gpu"] >= 1:
            # Whole GPUs: all of each GPU's memory (nobody else fits beside it).
            lim = {"aliyun.com/gpu-count": str(p["num_gpu"]),
                   "aliyun.com/gpu-mem": str(p["num_gpu"] * WHOLE_GPU_MIB)}
        docs.append(pod_doc(name, p["cpu_milli"], p["memory_mib"], lim))
        meta.append({"name": name, "demand": p["num_gpu"] * p["gpu_milli"]})
    write_lines(out, docs)
    with open(out + ".meta.json", "w") as f:
        json.dump({"seed": seed, "max_load": load, "capacity_milli": capacity,
                   "pods": meta}, f)
    print(f"{len(docs)} pods, arrived demand "
          f"{sum(m['demand'] for m in meta) / capacity * 100:.2f} % of {capacity // 1000} GPUs")


# -------------------------------------------------------------------- API ----
def ssl_ctx():
    ctx = ssl.create_default_context(cafile=os.environ["BENCH_CA"])
    ctx.load_cert_chain(os.environ["BENCH_CERT"], os.environ["BENCH_KEY"])
    return ctx


def conn():
    u = urllib.parse.urlparse(os.environ["BENCH_API"])
    return http.client.HTTPSConnection(u.hostname, u.port, context=ssl_ctx(), timeout=120)


def request(c, method, path, body=None):
    hdr = {"Content-Type": "application/json", "Accept": "application/json"}
    c.request(method, path, body=body, headers=hdr)
    r = c.getresponse()
    data = r.read()
    return r.status, data


class Watch(threading.Thread):
    """Stamps each pod's first event with spec.nodeName (bound) and the scheduler's first
    Unschedulable verdict."""

    def __init__(self, rv):
        super().__init__(daemon=True)
        self.rv = rv
        self.bound = {}
        self.unsched = {}
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.error = None

    def note(self, obj, now):
        name = obj.get("metadata", {}).get("name")
        if obj.get("spec", {}).get("nodeName") and name not in self.bound:
            self.bound[name] = now
            self.cond.notify_all()
        for cnd in obj.get("status", {}).get("conditions", []) or []:
            if (cnd.get("type") == "PodScheduled" and cnd.get("status") == "False"
                    and name not in self.unsched):
                self.unsched[name] = now
                self.cond.notify_all()

    def relist(self):
        c = conn()
        st, data = request(c, "GET", f"/api/v1/namespaces/{NS}/pods")
        if st != 200:
            raise RuntimeError(f"list: HTTP {st}")
        lst = json.loads(data)
        now = time.monotonic()
        with self.cond:
            for obj in lst["items"]:
                self.note(obj, now)
        self.rv = lst["metadata"]["resourceVersion"]

    def run(self):
        # The API server closes a watch whose reader falls behind: watch again from the last
        # resource version seen (or re-list when that is too old); `reconnects` counts it.
        self.reconnects = 0
        while True:
            try:
                c = conn()
                path = (f"/api/v1/namespaces/{NS}/pods?watch=1&allowWatchBookmarks=true"
                        f"&resourceVersion={self.rv}&timeoutSeconds=3600")
                c.request("GET", path, headers={"Accept": "application/json"})
                r = c.getresponse()
                if r.status != 200:
                    raise RuntimeError(f"watch: HTTP {r.status}: {r.read()[:300]!r}")
                while True:
                    line = r.readline()
                    if not line:
                        break
                    ev = json.loads(line)
                    obj = ev.get("object", {})
                    if ev.get("type") == "ERROR":
                        self.relist()
                        break
                    self.rv = obj.get("metadata", {}).get("resourceVersion", self.rv)
                    if ev.get("type") == "BOOKMARK":
                        continue
                    now = time.monotonic()
                    with self.cond:
                        self.note(obj, now)
            except (OSError, http.client.HTTPException, ValueError) as e:
                self.last_error = e
            except Exception as e:  # noqa: BLE001 - reported by the waiter
                with self.cond:
                    self.error = e
                    self.cond.notify_all()
                return
            self.reconnects += 1
            time.sleep(0.1)


def cmd_run(pods_file, result, parallel=8, timeout=1800):
    parallel = int(parallel)
    # 0: one at a time, each waited for (bound or refused) before the next is created.
    serial = parallel == 0
    docs = [line.rstrip("\n") for line in open(pods_file) if line.strip()]
    names = [json.loads(d)["metadata"]["name"] for d in docs]
    c = conn()
    st, data = request(c, "GET", f"/api/v1/namespaces/{NS}/pods?limit=1")
    if st != 200:
        sys.exit(f"list pods: HTTP {st}: {data[:300]!r}")
    w = Watch(json.loads(data)["metadata"]["resourceVersion"])
    w.start()
    time.sleep(0.5)
    q = queue.Queue()
    for d in docs:
        q.put(d)
    errors = []
    created = [0]
    lk = threading.Lock()

    def worker():
        cc = conn()
        while True:
            try:
                d = q.get_nowait()
            except queue.Empty:
                return
            for attempt in range(5):
                try:
                    st, data = request(cc, "POST", f"/api/v1/namespaces/{NS}/pods", d)
                except (OSError, http.client.HTTPException):
                    cc = conn()
                    continue
                if st == 429 or st >= 500:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                break
            with lk:
                if st != 201:
                    errors.append(f"HTTP {st}: {data[:200]!r}")
                created[0] += 1
            if serial and st == 201:
                # Each pod bound or refused before the next is created (10 s at most).
                name = json.loads(d)["metadata"]["name"]
                until = time.monotonic() + 10
                with w.cond:
                    while (name not in w.bound and name not in w.unsched
                           and time.monotonic() < until and not w.error):
                        w.cond.wait(0.5)

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(max(1, parallel))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t_created = time.monotonic()
    if errors:
        sys.exit(f"{len(errors)} pods not created, first: {errors[0]}")
    want = set(names)
    deadline = time.monotonic() + timeout
    settle = None
    with w.cond:
        while True:
            done = want & (set(w.bound) | set(w.unsched))
            if w.error:
                sys.exit(f"watch: {w.error}")
            if len(done) == len(want):
                # A pod refused once may still be retried and bound: wait a little for that
                # when some were refused.
                if len(want & set(w.bound)) == len(want):
                    break
                settle = settle or time.monotonic() + 10
                if time.monotonic() >= settle:
                    break
            if time.monotonic() >= deadline:
                break
            w.cond.wait(1)
        bound = {n: w.bound[n] for n in names if n in w.bound}
        unsched = [n for n in names if n not in w.bound]
    last = max(bound.values()) if bound else t0
    out = {
        "pods": len(names), "bound": len(bound), "unbound": len(unsched),
        "parallel": parallel,
        "create_s": round(t_created - t0, 3),
        "first_created_to_last_bound_s": round(last - t0, 3),
        "pods_per_s": round(len(bound) / (last - t0), 1) if bound and last > t0 else None,
        "timed_out": time.monotonic() >= deadline,
        "watch_reconnects": w.reconnects,
    }
    with open(result, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out))


def cmd_create(docs_file, parallel=8):
    """Creates the objects of DOCS_FILE (Nodes or Pods of namespace bench), P at a time."""
    docs = [line for line in open(docs_file) if line.strip()]
    q = queue.Queue()
    for d in docs:
        q.put(d)
    errors = []

    def worker():
        cc = conn()
        while True:
            try:
                d = q.get_nowait()
            except queue.Empty:
                return
            kind = json.loads(d)["kind"]
            path = "/api/v1/nodes" if kind == "Node" else f"/api/v1/namespaces/{NS}/pods"
            st, data = request(cc, "POST", path, d)
            if st not in (201, 409):
                errors.append(f"HTTP {st}: {data[:200]!r}")

    threads = [threading.Thread(target=worker) for _ in range(int(parallel))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"{len(errors)} objects not created, first: {errors[0]}")
    print(f"created {len(docs)} objects from {docs_file}")


# ------------------------------------------------------------------ checks ----
def assignments(pods_json):
    for p in json.load(open(pods_json))["items"]:
        a = (p["metadata"].get("annotations") or {}).get("gpushare.io/assignment")
        node = p["spec"].get("nodeName")
        yield p, node, (json.loads(a) if a else None)


def cmd_check_share(nodes_json, pods_json, out):
    caps = {}
    for n in json.load(open(nodes_json))["items"]:
        inv = json.loads(n["metadata"]["annotations"]["gpushare.io/gpus"])
        for g in inv["gpus"]:
            caps[(n["metadata"]["name"], g["index"])] = g["memoryMiB"]
    used = {}
    bound = with_assignment = 0
    for p, node, a in assignments(pods_json):
        if not node:
            continue
        bound += 1
        if not a:
            continue
        with_assignment += 1
        for shares in a["containers"].values():
            for s in shares:
                k = (node, s["gpuIndex"])
                m, c = used.get(k, (0, 0))
                used[k] = (m + s["memoryMiB"], c + (s.get("corePercent") or 0))
    over = [(k, v) for k, v in used.items() if v[0] > caps.get(k, 0) or v[1] > 100]
    res = {"bound": bound, "with_assignment": with_assignment, "gpus_used": len(used),
           "overcommitted_gpus": len(over),
           "examples": [f"{k[0]}/{k[1]}: {v[0]} MiB, {v[1]} %" for k, v in over[:5]]}
    json.dump(res, open(out, "w"), indent=1)
    print(json.dumps(res))


def cmd_check_trace(meta_file, pods_json, nodes_json, out):
    meta = json.load(open(meta_file))
    cap = meta["capacity_milli"]
    demand = {m["name"]: m["demand"] for m in meta["pods"]}
    caps = {}
    for n in json.load(open(nodes_json))["items"]:
        inv = json.loads(n["metadata"]["annotations"]["gpushare.io/gpus"])
        for g in inv["gpus"]:
            caps[(n["metadata"]["name"], g["index"])] = g["memoryMiB"]
    arrived = sum(demand.values())
    allocated = failed = 0
    used = {}
    for p, node, a in assignments(pods_json):
        name = p["metadata"]["name"]
        if name not in demand:
            continue
        if node:
            allocated += demand[name]
        else:
            failed += 1
        for shares in (a or {}).get("containers", {}).values():
            for s in shares:
                used[(node, s["gpuIndex"])] = used.get((node, s["gpuIndex"]), 0) + s["memoryMiB"]
    over = sum(1 for k, v in used.items() if v > caps.get(k, 0))
    reasons = {}
    for p, node, _ in assignments(pods_json):
        if node or p["metadata"]["name"] not in demand:
            continue
        msg = next((c.get("message", "") for c in p.get("status", {}).get("conditions") or []
                    if c.get("type") == "PodScheduled"), "no verdict")
        msg = msg.split(": ", 1)[-1][:160]
        key = f"demand {demand[p['metadata']['name']]}: {msg}"
        reasons[key] = reasons.get(key, 0) + 1
    # The simulator's measure (replay.rs): after each attempt, in arrival order, the allocated
    # share of capacity is recorded against the arrived demand, binned by whole percent; the
    # value at a load is the mean over its bin. Pods never leave, so a pod's outcome here is
    # the same whenever the scheduler got to it.
    is_bound = {p["metadata"]["name"]: bool(node) for p, node, _ in assignments(pods_json)}
    bins = {}
    arr = alloc = 0
    for m in meta["pods"]:
        arr += m["demand"]
        if is_bound.get(m["name"]):
            alloc += m["demand"]
        b = min(round(arr / cap * 100), meta["max_load"] + 1)
        s, k = bins.get(b, (0.0, 0))
        bins[b] = (s + alloc / cap * 100, k + 1)
    at = {str(load): round(100 - bins[load][0] / bins[load][1], 2)
          for load in sorted({90, 95, 100, 110, 130, meta["max_load"]}) if load in bins}
    res = {
        "seed": meta["seed"], "max_load": meta["max_load"], "pods": len(demand),
        "unallocated_at_load_pct": at,
        "failed": failed,
        "arrived_pct": round(arrived / cap * 100, 2),
        "allocated_pct": round(allocated / cap * 100, 2),
        "unallocated_pct": round(100 - allocated / cap * 100, 2),
        "overcommitted_gpus": over,
        "unbound_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:15]),
    }
    json.dump(res, open(out, "w"), indent=1)
    print(json.dumps(res))


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cmd, args = argv[1], argv[2:]
    opts = {}
    pos = []
    it = iter(args)
    for a in it:
        if a == "--plain":
            opts["plain"] = True
        elif a == "--parallel":
            opts["parallel"] = next(it)
        elif a == "--timeout":
            opts["timeout"] = int(next(it))
        else:
            pos.append(a)
    {
        "nodes": cmd_nodes, "pods-share": cmd_pods_share, "pods-trace": cmd_pods_trace,
        "run": cmd_run, "create": cmd_create, "check-share": cmd_check_share, "check-trace": cmd_check_trace,
    }[cmd](*pos, **opts)


if __name__ == "__main__":
    main(sys.argv)
