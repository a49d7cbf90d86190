#!/usr/bin/env bash
# The Grafana dashboard (install/grafana/gpushare.json) as a picture, from real scrapes:
#   bench/dashboard_png.sh [SCRAPE_DIR] [OUT.png]     (make dashboard-png)
# SCRAPE_DIR (default target/e2e-k8s/scrapes) holds what tests/e2e-k8s/run.sh saved while the
# walkthrough ran: the agent's and the extender's /metrics every 2 s. They are loaded into a
# real Prometheus (Debian's prometheus 2.42: `promtool tsdb create-blocks-from openmetrics`,
# then `prometheus` serving those blocks on loopback), and bench/render_dashboard.py sends
# every panel's queries to it as Grafana would and draws the answers where the panel's
# gridPos puts them. Writes OUT.png (default target/bench/dashboard.png); prints a line per
# panel with its series count and last values. Needs root only to apt-get what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scrapes=${1:-target/e2e-k8s/scrapes}
out=${2:-target/bench/dashboard.png}
[[ -d $scrapes/agent && -d $scrapes/extender ]] ||
    { echo "dashboard-png: no scrapes in $scrapes (run make e2e-k8s first)" >&2; exit 1; }
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    echo "dashboard-png: installing prometheus (apt)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
mkdir -p "$(dirname "$out")" target/bench
if [[ ! -x target/bench/venv/bin/python ]] || ! target/bench/venv/bin/python -c 'import matplotlib' 2>/dev/null; then
    python3 -m venv target/bench/venv
    target/bench/venv/bin/pip -q install matplotlib
fi
work=$(mktemp -d /tmp/gpushare-dashboard.XXXXXX)
prom_pid=
cleanup() {
    [[ -z $prom_pid ]] || { kill "$prom_pid" 2>/dev/null; wait "$prom_pid" 2>/dev/null; } || true
    rm -rf "$work"
}
trap cleanup EXIT

target/bench/venv/bin/python bench/render_dashboard.py convert "$scrapes" "$work/scrapes.om"
promtool tsdb create-blocks-from openmetrics "$work/scrapes.om" "$work/tsdb" >"$work/promtool.log" 2>&1 ||
    { cat "$work/promtool.log" >&2; exit 1; }
first=$(find "$scrapes" -name '*.prom' -printf '%f\n' | sort -n | head -1)
last=$(find "$scrapes" -name '*.prom' -printf '%f\n' | sort -n | tail -1)
start=$((${first%.prom} / 1000)) end=$((${last%.prom} / 1000))
echo 'global: {scrape_interval: 2s}' >"$work/prometheus.yml"
port=$((20000 + RANDOM % 20000))
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --storage.tsdb.retention.time=100y --web.listen-address="127.0.0.1:$port" \
    >"$work/prometheus.log" 2>&1 &
prom_pid=$!
for _ in $(seq 60); do
    curl -fsS "127.0.0.1:$port/-/ready" >/dev/null 2>&1 && break
    sleep 0.5
done
curl -fsS "127.0.0.1:$port/-/ready" >/dev/null || { tail -20 "$work/prometheus.log" >&2; exit 1; }
target/bench/venv/bin/python bench/render_dashboard.py render install/grafana/gpushare.json \
    "http://127.0.0.1:$port" "$start" "$end" "$out"
