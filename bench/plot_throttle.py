#!/usr/bin/env python3
"""Plots the compute-quota benchmark (`cargo bench --bench throttle`).

Reads target/bench/throttle.json (or the file given as the first argument) and writes
target/bench/throttle.png (or the second argument):

* left: achieved vs requested for the `alone` case, median with p5-p95 error bars, the ideal
  diagonal and the +-2 point band of the goal;
* right: each container's share of the combined rate in the `contention` sets (bars: median,
  error bars: p5-p95, markers: the quota; the uncapped neighbour's marker is what is left).

Needs matplotlib (the make recipe installs it in target/bench/venv).
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def alone_points(cases: list[dict]) -> list[dict]:
    return sorted(
        (c for c in cases if c["case"] == "alone" and c["quota"] is not None),
        key=lambda c: c["quota"],
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default=os.path.join(REPO, "target/bench/throttle.json"))
    ap.add_argument("dst", nargs="?", default=os.path.join(REPO, "target/bench/throttle.png"))
    ap.add_argument("--overlay", metavar="JSON",
                    help="a second run (e.g. THROTTLE_BENCH_START=created) whose alone points "
                         "are drawn too, as hollow markers")
    args = ap.parse_args()
    src, dst = args.src, args.dst
    with open(src) as f:
        data = json.load(f)
    cases = data["cases"]

    alone = alone_points(cases)
    sets: dict[str, list[dict]] = {}
    for c in cases:
        if c["case"] == "contention":
            name, _, _ = c["container"].partition("/")
            sets.setdefault(name, []).append(c)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [1, 1.2]})

    # Alone: achieved vs requested.
    ax1.fill_between([0, 100], [-2, 98], [2, 102], color="tab:green", alpha=0.12, label="goal: ±2 points")
    ax1.plot([0, 100], [0, 100], color="grey", lw=1, ls="--", label="ideal (achieved = quota)")
    if alone:
        q = [c["quota"] for c in alone]
        med = [c["achieved_median"] for c in alone]
        lo = [max(0.0, c["achieved_median"] - c["achieved_p5"]) for c in alone]
        hi = [max(0.0, c["achieved_p95"] - c["achieved_median"]) for c in alone]
        ax1.errorbar(q, med, yerr=[lo, hi], fmt="o", color="tab:blue", ecolor="tab:blue",
                     capsize=3, ms=5, label="achieved (median, p5–p95 of 1 s windows)")
        for c in alone:
            err = c["achieved_median"] - c["quota"]
            if abs(err) > 2:
                ax1.annotate(f"{c['achieved_median']:.1f}", (c["quota"], c["achieved_median"]),
                             textcoords="offset points", xytext=(6, 6), fontsize=8, color="tab:red")
    if args.overlay:
        with open(args.overlay) as f:
            extra = alone_points(json.load(f)["cases"])
        if extra:
            ax1.errorbar([c["quota"] for c in extra], [c["achieved_median"] for c in extra],
                         yerr=[[max(0.0, c["achieved_median"] - c["achieved_p5"]) for c in extra],
                               [max(0.0, c["achieved_p95"] - c["achieved_median"]) for c in extra]],
                         fmt="s", mfc="none", color="tab:orange", capsize=3, ms=7,
                         label=f"{os.path.basename(args.overlay)}")
    ax1.set_xlim(0, 100)
    ax1.set_ylim(0, 105)
    ax1.set_xlabel("requested quota (% of the sim GPU)")
    ax1.set_ylabel("achieved (% of the unthrottled rate R0)")
    ax1.set_title("One busy container alone (policy hard)")
    ax1.grid(alpha=0.3)
    ax1.legend(loc="upper left", fontsize=8)

    # Contention: share of the combined rate per container, grouped by set.
    x = 0.0
    ticks, labels = [], []
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:purple"]
    for si, (name, members) in enumerate(sets.items()):
        capped = sum(m["quota"] for m in members if m["quota"] is not None)
        for i, m in enumerate(members):
            want = m["quota"] if m["quota"] is not None else max(0, 100 - capped)
            med = m["achieved_median"]
            err = [[max(0.0, med - m["achieved_p5"])], [max(0.0, m["achieved_p95"] - med)]]
            ax2.bar(x, med, width=0.8, color=colors[i % len(colors)], alpha=0.75)
            ax2.errorbar([x], [med], yerr=err, fmt="none", ecolor="black", capsize=3)
            ax2.plot([x - 0.4, x + 0.4], [want, want], color="black", lw=2)
            ax2.text(x, med + 2, f"{med:.1f}", ha="center", fontsize=8)
            cname = m["container"].partition("/")[2]
            q = f"{m['quota']}%" if m["quota"] is not None else "no cap"
            ticks.append(x)
            labels.append(f"{cname}\n{q}")
            x += 1
        ax2.text(x - (len(members) + 1) / 2, -17, name, ha="center", fontsize=9, fontweight="bold")
        x += 0.8
    ax2.set_xticks(ticks, labels, fontsize=8)
    ax2.set_ylim(0, 100)
    ax2.set_ylabel("share of the combined rate (%)")
    ax2.set_title("Busy containers sharing one sim GPU (bar: median, black line: quota)")
    ax2.grid(axis="y", alpha=0.3)

    cpu = data.get("controller_cpu_pct") or {}
    if cpu:
        txt = "controller thread CPU, % of one core, by managed containers: " + ", ".join(
            f"{k}: {v:.2f} %" for k, v in sorted(cpu.items(), key=lambda kv: int(kv[0]))
        ) + "  (utime+stime over 10 s: 0.1 % resolution)"
        fig.text(0.5, 0.01, txt, ha="center", fontsize=9)
    fig.suptitle("gpushare compute quotas on the sim backend (production controller, period 100 ms)")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
