#!/usr/bin/env python3
"""Renders install/grafana/gpushare.json to a PNG from real scrapes, through a real Prometheus.

    render_dashboard.py convert SCRAPE_DIR OUT.om
        SCRAPE_DIR/<job>/<epoch_ms>.prom (Prometheus text, one scrape each, as saved by
        tests/e2e-k8s/run.sh) -> one OpenMetrics file with timestamps, for
        `promtool tsdb create-blocks-from openmetrics`. Each series gets the labels a
        Prometheus scrape would add: job=<job>, instance=<job>.
    render_dashboard.py render DASHBOARD PROM_URL START END OUT.png
        Every panel's queries, as Grafana would send them ($instance = .*,
        $__rate_interval = 8 scrape intervals, 16 s:
        the saving loop's 2 s is not exact), over [START, END] (unix seconds) by
        /api/v1/query_range, drawn where the panel's gridPos puts it. Prints one line per
        panel: the number of series and the last value of each query.

Nothing here interprets PromQL: Prometheus evaluates every expression.
"""
import json
import math
import os
import re
import sys
import urllib.parse
import urllib.request

SCRAPE_INTERVAL_S = 2
RATE_INTERVAL = f"{8 * SCRAPE_INTERVAL_S}s"

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)\s*$")


def convert(scrape_dir, out):
    series = {}  # name -> {labels: [(ts, value)]}
    n_scrapes = 0
    for job in sorted(os.listdir(scrape_dir)):
        jdir = os.path.join(scrape_dir, job)
        if not os.path.isdir(jdir):
            continue
        for f in sorted(os.listdir(jdir)):
            if not f.endswith(".prom"):
                continue
            ts = int(f[: -len(".prom")]) / 1000.0
            n_scrapes += 1
            with open(os.path.join(jdir, f)) as fh:
                for line in fh:
                    if line.startswith("#") or not line.strip():
                        continue
                    m = SAMPLE.match(line.strip())
                    if not m:
                        raise SystemExit(f"{jdir}/{f}: not a sample line: {line.strip()!r}")
                    name, labels, value = m.group(1), m.group(2) or "{}", m.group(3)
                    inner = labels[1:-1]
                    extra = f'job="{job}",instance="{job}"'
                    labels = "{" + (inner + "," if inner else "") + extra + "}"
                    series.setdefault(name, {}).setdefault(labels, []).append((ts, value))
    if not n_scrapes:
        raise SystemExit(f"{scrape_dir}: no scrapes (<job>/<epoch_ms>.prom)")
    with open(out, "w") as fh:
        for name in sorted(series):
            for labels in sorted(series[name]):
                for ts, value in sorted(series[name][labels]):
                    fh.write(f"{name}{labels} {value} {ts:.3f}\n")
        fh.write("# EOF\n")
    print(f"convert: {n_scrapes} scrapes, {sum(len(s) for s in series.values())} series -> {out}")


def query_range(prom, expr, start, end, step):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise SystemExit(f"query {expr!r}: {body}")
    return body["data"]["result"]


def legend(fmt, metric):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt or "") or str(metric)


def render(dashboard, prom, start, end, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(dashboard) as fh:
        d = json.load(fh)
    panels = d["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_h = 0.42  # inches per grid row
    fig = plt.figure(figsize=(24, rows * unit_h + 0.8))
    fig.suptitle(f"{d['title']} — rendered from real scrapes ({int(end - start)} s)", fontsize=16, y=0.999)
    top = 1 - 0.8 / (rows * unit_h + 0.8)
    step = SCRAPE_INTERVAL_S
    for p in panels:
        g = p["gridPos"]
        x0, w = g["x"] / 24, g["w"] / 24
        y_top = top * (1 - g["y"] / rows)
        h = top * g["h"] / rows
        if p["type"] == "row":
            fig.text(x0 + 0.005, y_top - h / 2, p["title"], fontsize=14, weight="bold", va="center")
            continue
        ax = fig.add_axes([x0 + 0.03 * w + 0.008, y_top - h + 0.16 * h, w * 0.92 - 0.012, h * 0.68])
        ax.set_title(p["title"], fontsize=10, loc="left")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        n_series, lasts = 0, []
        for t in p.get("targets", []):
            expr = t["expr"].replace("$__rate_interval", RATE_INTERVAL).replace("$instance", ".*")
            result = query_range(prom, expr, start, end, step)
            for s in result:
                xs = [float(v[0]) - start for v in s["values"]]
                ys = [float(v[1]) if v[1] not in ("NaN", "+Inf", "-Inf") else math.nan for v in s["values"]]
                ax.plot(xs, ys, linewidth=1.2, label=legend(t.get("legendFormat"), s["metric"]))
                n_series += 1
            last = [float(s["values"][-1][1]) for s in result if s["values"]]
            lasts.append(f"{t['refId']}={','.join(f'{v:g}' for v in last[:6])}{'…' if len(last) > 6 else ''}")
        ax.set_xlim(0, end - start)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if unit:
            ax.set_ylabel(unit, fontsize=7)
        if n_series:
            # At most 10 legend entries (a panel per container can hold dozens of series).
            handles, labels = ax.get_legend_handles_labels()
            if len(handles) > 10:
                labels = labels[:9] + [f"… +{len(handles) - 9} more series"]
                handles = handles[:10]
            ax.legend(handles, labels, fontsize=6, loc="upper left", ncol=2 if n_series > 5 else 1, framealpha=0.6)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
        print(f"panel {p.get('id')} {p['title']!r}: {n_series} series; last {' '.join(lasts)}")
    fig.savefig(out, dpi=70)
    print(f"render: {out}")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "convert":
        convert(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 7 and sys.argv[1] == "render":
        render(sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), sys.argv[6])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
