#!/usr/bin/env python3
"""Paired estimate of what "with" adds over "without" in bench/crictl_overhead.sh's raw files.

Usage: paired_stats.py RAW [RAW...]   (several files: runs of the same configuration, pooled)

Input lines: MODE ROUND CREATE_US START_US PAIR (MODE on|off; the two pods of a pair ran back
to back). Each run is split into its first and second half of the rounds: on the NRI path the
agent serves instance A in the first half and B in the second, so a difference between the
two instances adds to one half's differences and subtracts from the other's. The estimate is
therefore the mean over the halves of each half's mean difference (with − without), which
cancels it, and its 95 % interval is a bootstrap that resamples pairs within each half
(10,000 times, fixed seed: a rerun on the same files prints the same figures). Printed for
create+start, create and start: that mean difference in ms, the median difference, the ratio
of the means (with the same interval method) and the halves' own mean differences (pooled
over the files).
Prints numbers only; gates nothing.
"""

import random
import statistics
import sys

RESAMPLES = 10_000


def load(paths):
    """The complete pairs of every file, grouped by (file, half): lists of (on, off) tuples of
    (create_ms, start_ms)."""
    strata = {}
    for k, path in enumerate(paths):
        pairs = {}
        for line in open(path, encoding="utf-8"):
            f = line.split()
            if len(f) < 5 or line.startswith("#"):
                continue
            mode, rnd, create, start, pair = f[0], int(f[1]), int(f[2]), int(f[3]), int(f[4])
            pairs.setdefault(pair, {"round": rnd})[mode] = (create / 1000, start / 1000)
        complete = [p for p in pairs.values() if "on" in p and "off" in p]
        if len(complete) != len(pairs):
            sys.exit(f"paired_stats: {len(pairs) - len(complete)} pairs of {path} lack a mode")
        rounds = sorted({p["round"] for p in complete})
        half = rounds[len(rounds) // 2] if len(rounds) > 1 else rounds[0] + 1
        for p in complete:
            strata.setdefault((k, p["round"] >= half), []).append((p["on"], p["off"]))
    return strata


def estimate(strata, pick):
    """(mean difference over the strata's means, ratio of the summed means)."""
    diffs = [statistics.fmean(pick(a) - pick(b) for a, b in s) for s in strata]
    on = sum(statistics.fmean(pick(a) for a, _ in s) for s in strata)
    off = sum(statistics.fmean(pick(b) for _, b in s) for s in strata)
    return statistics.fmean(diffs), on / off


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: paired_stats.py RAW [RAW...]")
    by = load(sys.argv[1:])
    strata = list(by.values())
    n = sum(len(s) for s in strata)
    if any(len(s) < 2 for s in strata):
        sys.exit("paired_stats: fewer than 2 pairs in a half")
    files = len(sys.argv) - 1
    print(
        f"paired estimate over {n} pairs{f' from {files} runs' if files > 1 else ''} "
        "(with − without, the halves weighted alike; 95 % bootstrap interval):"
    )
    print(f"{'':14} {'mean diff ms':>24} {'median diff':>12} {'ratio of means':>24} {'halves ms':>16}")
    for name, pick in (
        ("create+start", lambda v: v[0] + v[1]),
        ("create", lambda v: v[0]),
        ("start", lambda v: v[1]),
    ):
        rng = random.Random(1)
        diff, ratio = estimate(strata, pick)
        boots = []
        for _ in range(RESAMPLES):
            sample = [[s[rng.randrange(len(s))] for _ in s] for s in strata]
            boots.append(estimate(sample, pick))
        d = sorted(b[0] for b in boots)
        r = sorted(b[1] for b in boots)
        lo, hi = int(0.025 * RESAMPLES), int(0.975 * RESAMPLES) - 1
        halves = " / ".join(
            f"{statistics.fmean(pick(a) - pick(b) for k, s in by.items() if k[1] == second for a, b in s):+.2f}"
            for second in (False, True)
            if any(k[1] == second for k in by)
        )
        median = statistics.median(pick(a) - pick(b) for s in strata for a, b in s)
        mean = f"{diff:+.2f} [{d[lo]:+.2f}, {d[hi]:+.2f}]"
        ratio_s = f"{ratio:.3f} [{r[lo]:.3f}, {r[hi]:.3f}]"
        print(f"{name:14} {mean:>24} {median:>+12.2f} {ratio_s:>24} {halves:>16}")


if __name__ == "__main__":
    main()
