#!/usr/bin/env bash
# Every metric name install/grafana/gpushare.json queries must be one the components export.
# Usage: tests/dashboard_metrics.sh DASHBOARD SCRAPE...  (SCRAPE: Prometheus text from
# `gpushare node`'s and `gpushare scheduler`'s /metrics). Exported = the sample names and the
# `# TYPE` families of the scrapes (a family whose container has no sample yet still counts).
# Prints the names checked; exits 1 naming each missing one.
set -euo pipefail
dash=$1
shift
used=$(jq -r '.. | objects | select(has("expr")) | .expr' "$dash" | grep -oE 'gpushare_[a-z0-9_]+' | sort -u)
[[ -n $used ]] || { echo "dashboard $dash queries no gpushare metric" >&2; exit 1; }
exported=$(for f in "$@"; do
    [[ -s $f ]] || { echo "scrape $f is empty" >&2; exit 1; }
    sed -n 's/^# TYPE \([a-z0-9_]*\) .*/\1/p; s/^\(gpushare_[a-z0-9_]*\)[{ ].*/\1/p' "$f"
done | sort -u)
missing=$(comm -23 <(echo "$used") <(echo "$exported"))
echo "dashboard metrics: $(wc -l <<<"$used") names, exported by the scrapes: $(comm -12 <(echo "$used") <(echo "$exported") | wc -l)"
if [[ -n $missing ]]; then
    echo "not exported:" $missing >&2
    exit 1
fi
