#!/bin/sh
# The agent pod's `limiter` init container (gpushare chart): copies the in-container limiter
# library from the image onto the host (LIMITER_HOST_PATH, mounted at the same path), where
# the agent's NRI adjustments bind-mount it into GPU containers.
#
# Never rewrites the file in place: running GPU containers have it mapped. A changed library
# (an upgrade) is written beside it and renamed over it, so they keep the old inode and new
# containers get the new one; an unchanged one is left alone.
set -eu
src=${LIMITER_IMAGE_PATH:-/usr/lib/gpushare/libgpushare_limiter.so}
dst=${LIMITER_HOST_PATH:?}
mkdir -p "$(dirname "$dst")"
if [ -f "$dst" ] && cmp -s "$src" "$dst"; then
    echo "gpushare limiter: $dst is up to date" >&2
    exit 0
fi
tmp=$dst.new.$$
cp "$src" "$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$dst"
echo "gpushare limiter: installed $dst" >&2
