#!/usr/bin/env python3
"""Where the unallocated GPU capacity sits: a summary of `gpushare simulate --state-at` files.

Usage: pack_state.py [--cpu-min MILLI] [--mean] STATE.csv [STATE.csv...]

Each file is one replay's node states (`<trace>.<policy>.<seed>.state.csv`). Per node kind
(GPUs, model, CPU) and file: the free GPU capacity in GPUs, and how much of it sits on nodes
whose free CPU is below --cpu-min (default 2000 milli: stranded by CPU, not by GPU
fragments), then the totals per file; then per node kind the nodes whose every GPU is idle
(what a multi-GPU pod needs). Files of the same trace and seed under two policies
side by side show where one policy leaves capacity the other uses. With --mean, one column per
trace and policy: the mean over its files (seeds).

Prints numbers only; gates nothing.
"""

import argparse
import csv
import os
import sys
from collections import defaultdict


def summarize(path, cpu_min):
    """{(gpus, model, cpu_milli): [nodes, free GPUs, free GPUs on CPU-starved nodes,
    nodes with every GPU idle]}."""
    kinds = defaultdict(lambda: [0, 0.0, 0.0, 0])
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f)
        need = {"gpus", "model", "cpu_milli", "cpu_free_milli", "gpu_free_milli"}
        missing = need - set(rows.fieldnames or [])
        if missing:
            sys.exit(f"pack_state: {path}: columns {sorted(missing)} missing from the header")
        for line, row in enumerate(rows, start=2):
            try:
                key = (int(row["gpus"]), row["model"], int(row["cpu_milli"]))
                cells = row["gpu_free_milli"]
                per_gpu = [int(x) for x in cells.split(";")] if cells else []
                free = sum(per_gpu) / 1000
                idle = bool(per_gpu) and all(x >= 1000 for x in per_gpu)
                starved = int(row["cpu_free_milli"]) < cpu_min
            except ValueError as e:
                sys.exit(f"pack_state: {path} line {line}: {e}")
            k = kinds[key]
            k[0] += 1
            k[1] += free
            if starved:
                k[2] += free
            if idle:
                k[3] += 1
    return kinds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-min", type=int, default=2000)
    ap.add_argument("--mean", action="store_true", help="one column per trace and policy")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    per_file = [(os.path.basename(p).removesuffix(".state.csv"), summarize(p, args.cpu_min))
                for p in args.files]
    if args.mean:
        groups = defaultdict(list)
        for name, s in per_file:
            groups[name.rsplit(".", 1)[0]].append(s)
        per_file = []
        for name, runs in groups.items():
            mean = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
            for s in runs:
                for k, v in s.items():
                    for i in range(4):
                        mean[k][i] += v[i] / len(runs)
            per_file.append((f"{name} (mean of {len(runs)})", mean))
    keys = sorted({k for _, s in per_file for k in s})
    names = [n for n, _ in per_file]
    width = max(len(n) for n in names)
    empty = [0, 0.0, 0.0, 0]

    def table(title, cell, total, blank):
        """One row per node kind (cell(counts) of each file), skipping rows that read blank in
        every file, then the totals (total(summary) of each file)."""
        print(title)
        print(f"{'node kind':<28}" + "".join(f"  {n:>{width}}" for n in names))
        for k in keys:
            cells = [cell(s.get(k, empty)) for _, s in per_file]
            if all(c == blank for c in cells):
                continue
            label = f"{k[0]} x {k[1] or '-'}, {k[2] // 1000} cores"
            print(f"{label:<28}" + "".join(f"  {c:>{width}}" for c in cells))
        totals = [total(s) for _, s in per_file]
        print(f"{'total':<28}" + "".join(f"  {c:>{width}}" for c in totals))

    table(
        f"free GPU capacity in GPUs (of it: on nodes with < {args.cpu_min} milli CPU free)",
        lambda v: f"{v[1]:.2f} ({v[2]:.2f})",
        lambda s: f"{sum(v[1] for v in s.values()):.2f} ({sum(v[2] for v in s.values()):.2f})",
        "0.00 (0.00)",
    )
    print()
    table(
        "nodes with every GPU idle",
        lambda v: f"{v[3]:.2f}",
        lambda s: f"{sum(v[3] for v in s.values()):.2f}",
        "0.00",
    )

if __name__ == "__main__":
    main()
