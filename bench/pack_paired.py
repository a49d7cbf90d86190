#!/usr/bin/env python3
"""Seed-by-seed comparison of two placement policies in `gpushare simulate --out` results.

Usage: pack_paired.py [--policy gpushare] [--against fgd] [--against-dir DIR2] [--json OUT] DIR [DIR...]

Every `*.json` of each DIR is one trace (or trace+variant); its `unallocated_pct[LOAD].per_seed`
holds each seed's unallocated GPU % (seeds in `seeds`). Both policies replay the same arrivals
per seed, so their difference is paired by seed. Per trace and load (90, 95, 100, 110, 130 %):
the two medians over seeds (what the simulate table prints), the mean paired difference
(policy − against; > 0: the policy leaves more GPU unallocated) with a 95 % bootstrap interval
(seeds resampled 10,000 times, fixed seed: a rerun prints the same figures) and the number of
seeds on which the policy is worse by ≥ 0.01 points. A difference of medians over a few seeds is
mostly which seeds were drawn; the interval says whether a gap is the policy's.

With --against-dir DIR2, the `against` policy's results come from the file of the same name in
DIR2 (the same traces and seeds replayed another way, e.g. `gpushare simulate --search-nodes 100`
in DIR against every node in DIR2: `--against gpushare --against-dir DIR2`).

Prints the cells where the median is above, or the interval lies above 0, then a summary.
Prints numbers only; gates nothing.
"""

import argparse
import glob
import json
import os
import random
import statistics
import sys

RESAMPLES = 10_000
LOADS = ["90", "95", "100", "110", "130"]


def per_seed(result, load):
    """{seed: value} of one policy's result at `load` (seeds the run never reached: left out)."""
    cell = result["unallocated_pct"].get(load)
    if cell is None or "per_seed" not in cell:
        return {}
    return {s: v for s, v in zip(result["seeds"], cell["per_seed"]) if v is not None}


def interval(diffs, rng):
    means = sorted(
        statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(RESAMPLES)
    )
    return means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default="gpushare")
    ap.add_argument("--against", default="fgd")
    ap.add_argument("--against-dir", help="read the against policy from the same file in this DIR")
    ap.add_argument("--json", help="write every cell's figures here")
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    rng = random.Random(20261203)
    cells = []
    for d in args.dirs:
        files = sorted(glob.glob(os.path.join(d, "*.json")))
        if not files:
            sys.exit(f"pack_paired: no simulate results (*.json) in {d}")
        for path in files:
            doc = json.load(open(path, encoding="utf-8"))
            by = {r["policy"]: r for r in doc.get("results", [])}
            other = by
            if args.against_dir:
                twin = os.path.join(args.against_dir, os.path.basename(path))
                if not os.path.exists(twin):
                    continue
                other = {r["policy"]: r for r in json.load(open(twin, encoding="utf-8")).get("results", [])}
            if args.policy not in by or args.against not in other:
                continue
            if "seeds" not in by[args.policy] or "seeds" not in other[args.against]:
                sys.exit(f"pack_paired: {path} has no per-seed values (written by an older gpushare)")
            for load in LOADS:
                a, b = per_seed(by[args.policy], load), per_seed(other[args.against], load)
                seeds = sorted(set(a) & set(b))
                if not seeds:
                    continue
                diffs = [a[s] - b[s] for s in seeds]
                lo, hi = interval(diffs, rng)
                cells.append(
                    {
                        "dir": os.path.basename(os.path.normpath(d)),
                        "trace": doc["trace"],
                        "load": int(load),
                        "seeds": len(seeds),
                        "median": statistics.median(a[s] for s in seeds),
                        "median_against": statistics.median(b[s] for s in seeds),
                        "mean_diff": statistics.fmean(diffs),
                        "ci95": [lo, hi],
                        "worse_seeds": sum(x >= 0.005 for x in diffs),
                    }
                )
    if not cells:
        sys.exit(f"pack_paired: no trace has both {args.policy} and {args.against}")
    print(
        f"{args.policy} vs {args.against}: unallocated GPU %, median over seeds and mean paired "
        f"difference [95 % interval]; cells where the median is above or the interval > 0"
    )
    for c in cells:
        above = c["median"] - c["median_against"] >= 0.005
        if above or c["ci95"][0] > 0:
            print(
                f"  {c['dir']:>14} {c['trace']:<46} {c['load']:>3} %  "
                f"{c['median']:6.2f} vs {c['median_against']:6.2f} "
                f"({c['median'] - c['median_against']:+.2f})  "
                f"diff {c['mean_diff']:+.3f} [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]  "
                f"worse on {c['worse_seeds']}/{c['seeds']} seeds"
            )
    for label, pick in (("published", lambda c: "+" not in c["trace"]), ("variants", lambda c: "+" in c["trace"])):
        sel = [c for c in cells if pick(c)]
        if not sel:
            continue
        above = sum(c["median"] - c["median_against"] >= 0.005 for c in sel)
        sig_above = sum(c["ci95"][0] > 0 for c in sel)
        sig_below = sum(c["ci95"][1] < 0 for c in sel)
        print(
            f"{label}: {len(sel)} cells; median above {args.against}: {above}; "
            f"interval above 0 (the policy worse): {sig_above}; below 0 (better): {sig_below}; "
            f"worst mean difference {max(c['mean_diff'] for c in sel):+.3f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(cells, f, indent=1)


if __name__ == "__main__":
    main()
