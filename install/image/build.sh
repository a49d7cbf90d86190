#!/usr/bin/env bash
# The gpushare image without a container engine: the release binaries (`make build`) in an
# OCI image-layout tarball, importable with `ctr -n k8s.io images import FILE` (or
# `skopeo copy oci-archive:FILE docker://REGISTRY/...` to push it).
#
#   install/image/build.sh [OUT_TAR]     (default target/image/gpushare-VERSION.tar)
#
# Image: docker.io/gpushare/gpushare:VERSION (VERSION from Cargo.toml; GPUSHARE_IMAGE=NAME:TAG
# names it otherwise), what install/image/Containerfile builds with an engine:
#   /usr/local/bin/gpushare          agent (gpushare node), extender (gpushare scheduler),
#                                    inspect, guardian
#   /usr/local/bin/gpushare-runtime  the OCI runtime wrapper (runtimes without NRI)
#   /usr/lib/gpushare/libgpushare_limiter.so   the in-container limiter; the chart's init
#                                    container copies it onto the host, where NRI mounts it
#                                    into GPU containers
#   busybox (static, Debian's busybox-static) for the chart's init and clean-up steps, and
#   the glibc libraries the binaries link (from this host, as ldd lists them).
# Built by tests/e2e/mkimage.sh: one uncompressed layer, deterministic (fixed mtimes, sorted,
# owner 0), so the same binaries give the same digest.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
[[ -n $version ]] || { echo "build.sh: no version in Cargo.toml" >&2; exit 1; }
name=${GPUSHARE_IMAGE:-docker.io/gpushare/gpushare:$version}
out=${1:-$target/image/gpushare-$version.tar}

bin=$target/release/gpushare
runtime=$target/release/gpushare-runtime
limiter=$target/release/libgpushare_limiter.so
for f in "$bin" "$runtime" "$limiter"; do
    [[ -f $f ]] || { echo "build.sh: $f missing (make build)" >&2; exit 1; }
done

args=(--env PATH=/usr/local/bin:/usr/bin:/bin
    --copy "$bin=/usr/local/bin/gpushare"
    --copy "$runtime=/usr/local/bin/gpushare-runtime"
    --copy "$limiter=/usr/lib/gpushare/libgpushare_limiter.so")
# The shared libraries of both binaries (and the dynamic loader), at the paths ldd names.
while IFS= read -r lib; do
    args+=(--copy "$lib=$lib")
done < <(ldd "$bin" "$runtime" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $1 !~ /:$/ { print $1 }' | sort -u)

mkdir -p "$(dirname "$out")"
"$repo/tests/e2e/mkimage.sh" "$out.tmp$$" "$name" "${args[@]}" -- gpushare --help
mv -f "$out.tmp$$" "$out"
echo "$out"
