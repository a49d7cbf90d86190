#!/usr/bin/env bash
# Fails when the shared object FILE needs a glibc symbol version newer than MAX (e.g. 2.31):
# the in-container limiter is loaded into CUDA images with old glibc (Ubuntu 20.04: 2.31).
#   bash tests/glibc_baseline.sh FILE MAX
set -euo pipefail
file=$1 max=$2
newest=$(objdump -T "$file" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -1)
too_new=$(objdump -T "$file" | grep -oE '(GLIBC_[0-9.]+)\)? +[A-Za-z_0-9]+$' |
    awk -v max="$max" '{v=$1; sub(/GLIBC_/, "", v); sub(/\)/, "", v); print v, $2}' |
    while read -r v sym; do
        [[ $(printf '%s\n%s\n' "$v" "$max" | sort -V | tail -1) == "$max" ]] || echo "$sym@GLIBC_$v"
    done)
if [[ -n $too_new ]]; then
    echo "glibc baseline: $file needs glibc newer than $max: $too_new" >&2
    exit 1
fi
echo "glibc baseline: $file needs at most GLIBC_$newest (limit $max)"
