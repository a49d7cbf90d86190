#!/usr/bin/env bash
# Build a tiny OCI image-layout tarball from the host's static busybox.
#
#   tests/e2e/mkimage.sh OUT_TAR NAME [OPTION]... [--] CMD...
#
#   OUT_TAR  path of the tarball to write (parent dir is created)
#   NAME     full image reference, e.g. docker.io/gpushare/busybox:e2e; stored
#            in index.json as the `io.containerd.image.name` annotation (what
#            `ctr images import` names the image after) and its tag as
#            `org.opencontainers.image.ref.name`
#   OPTION   --user USER: the image config's User (e.g. 1002, www-data, 1003:1004);
#            --file PATH=CONTENT: a file (mode 0644) at PATH in the image holding CONTENT;
#            --script PATH=CONTENT: the same with mode 0755;
#            --copy SRC=PATH: the host's file SRC at PATH, its mode kept (e.g. setuid);
#            --env NAME=VALUE: an entry of the config's Env (PATH=... replaces the default
#            PATH=/bin:/usr/bin; without --env the Env is that default alone).
#            Files are added last, so they may replace /etc/passwd or /etc/group.
#   CMD...   the image config's Cmd (one argv element per argument)
#
# The image has a single uncompressed layer: /bin/busybox plus one symlink per
# applet (`busybox --list`) in /bin, /etc/passwd + /etc/group with root, and
# empty /tmp /dev /proc /sys /root /usr/bin directories. Output is
# deterministic (fixed mtime, sorted entries, numeric owner 0) so the same
# busybox binary always yields the same digests.
#
# Environment: BUSYBOX (default /bin/busybox) must be a statically linked
# busybox (Debian: busybox-static). Needs only bash, tar (GNU), sha256sum,
# stat, jq.
set -euo pipefail
export LC_ALL=C # the order of the layer's top-level entries (a glob) is part of its digest

usage() {
    echo "usage: $0 OUT_TAR NAME [--user USER | --file PATH=CONTENT | --script PATH=CONTENT |" \
        "--copy SRC=PATH | --env NAME=VALUE]... [--] CMD..." >&2
    exit 2
}
[[ $# -ge 3 ]] || usage

out=$1
name=$2
shift 2
user=
adds=() # MODE PATH=CONTENT, or copy SRC=PATH
envs=() # NAME=VALUE
while [[ ${1:-} == --* ]]; do
    [[ $1 == -- || $# -ge 2 ]] || usage
    case $1 in
    --user) user=$2 ;;
    --file) [[ $2 == /?*=* ]] || usage; adds+=("0644 $2") ;;
    --script) [[ $2 == /?*=* ]] || usage; adds+=("0755 $2") ;;
    --copy) [[ $2 == ?*=/?* && -f ${2%%=*} ]] || usage; adds+=("copy $2") ;;
    --env) [[ $2 == [A-Za-z_]*=* ]] || usage; envs+=("$2") ;;
    --) shift; break ;;
    *) usage ;;
    esac
    shift 2
done
[[ $# -ge 1 ]] || usage

busybox=${BUSYBOX:-/bin/busybox}
if [[ ! -x $busybox ]]; then
    echo "mkimage: $busybox not found (apt-get install busybox-static)" >&2
    exit 1
fi
if command -v file >/dev/null 2>&1 \
    && ! LC_ALL=C file -L "$busybox" | grep -q 'statically linked'; then
    echo "mkimage: $busybox is not statically linked (need busybox-static)" >&2
    exit 1
fi

tag=${name##*:}
if [[ $tag == "$name" || $tag == */* ]]; then
    tag=latest
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/e2e-mkimage.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Deterministic tar of the current directory's listed members.
dtar() { # dtar OUT_FILE MEMBERS...
    local outf=$1
    shift
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        --format=gnu --no-acls --no-xattrs --no-selinux -cf "$outf" "$@"
}

# ---------------------------------------------------------------- rootfs ----
rootfs=$work/rootfs
mkdir -p "$rootfs"/{bin,etc,dev,proc,sys,tmp,root,usr/bin}
cp "$busybox" "$rootfs/bin/busybox"
chmod 0755 "$rootfs/bin/busybox"
while IFS= read -r applet; do
    [[ -n $applet && $applet != busybox && $applet != */* ]] || continue
    ln -sf busybox "$rootfs/bin/$applet"
done < <("$busybox" --list)
[[ -e $rootfs/bin/sh && -e $rootfs/bin/sleep ]] || {
    echo "mkimage: $busybox lacks sh/sleep applets" >&2
    exit 1
}
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' \
    >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"
chmod 0755 "$rootfs"/{bin,etc,dev,proc,sys,usr,usr/bin}
chmod 0700 "$rootfs/root"
chmod 1777 "$rootfs/tmp"
for a in "${adds[@]}"; do
    how=${a%% *}
    a=${a#* }
    if [[ $how == copy ]]; then path=$rootfs${a#*=}; else path=$rootfs${a%%=*}; fi
    mkdir -p "$(dirname "$path")"
    rm -f "$path" # an applet's symlink is replaced, not written through
    if [[ $how == copy ]]; then
        cp -p "${a%%=*}" "$path"
    else
        printf '%s' "${a#*=}" >"$path"
        chmod "$how" "$path"
    fi
done

layout=$work/layout
mkdir -p "$layout/blobs/sha256"

# Store a file as a blob; prints "<hex> <size>".
put_blob() {
    local f=$1 hex size
    hex=$(sha256sum "$f" | cut -d' ' -f1)
    size=$(stat -c %s "$f")
    mv "$f" "$layout/blobs/sha256/$hex"
    echo "$hex $size"
}

(cd "$rootfs" && dtar "$work/layer.tar" -- *)
read -r layer_hex layer_size < <(put_blob "$work/layer.tar")

# ---------------------------------------------------------------- config ----
# (jq keeps parsing options after --args, so build the Cmd array arg by arg.)
cmd_json=$(for a in "$@"; do jq -n --arg a "$a" '$a'; done | jq -cs .)
env_json='["PATH=/bin:/usr/bin"]'
for e in "${envs[@]}"; do
    env_json=$(jq -c --arg e "$e" '[.[] | select(split("=")[0] != ($e | split("=")[0]))] + [$e]' <<<"$env_json")
done
jq -cn --arg diff "sha256:$layer_hex" --argjson cmd "$cmd_json" --arg user "$user" \
    --argjson env "$env_json" '
    {
      architecture: "amd64",
      os: "linux",
      config: ({ Env: $env, Cmd: $cmd, WorkingDir: "/" }
               + if $user == "" then {} else { User: $user } end),
      rootfs: { type: "layers", diff_ids: [$diff] },
      history: [ { created_by: "gpushare tests/e2e/mkimage.sh" } ]
    }' >"$work/config.json"
read -r config_hex config_size < <(put_blob "$work/config.json")

# -------------------------------------------------------------- manifest ----
jq -cn --arg ch "sha256:$config_hex" --argjson cs "$config_size" \
    --arg lh "sha256:$layer_hex" --argjson ls "$layer_size" '
    {
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: $ch, size: $cs },
      layers: [ { mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $lh, size: $ls } ]
    }' >"$work/manifest.json"
read -r manifest_hex manifest_size < <(put_blob "$work/manifest.json")

# ----------------------------------------------------------------- index ----
jq -cn --arg mh "sha256:$manifest_hex" --argjson ms "$manifest_size" \
    --arg name "$name" --arg tag "$tag" '
    {
      schemaVersion: 2,
      mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: [ {
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        digest: $mh,
        size: $ms,
        platform: { architecture: "amd64", os: "linux" },
        annotations: {
          "io.containerd.image.name": $name,
          "org.opencontainers.image.ref.name": $tag
        }
      } ]
    }' >"$layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
chmod -R u=rwX,go=rX "$layout"

mkdir -p "$(dirname "$out")"
(cd "$layout" && dtar "$work/image.tar" oci-layout index.json blobs)
mv -f "$work/image.tar" "$out"
echo "mkimage: wrote $out ($name, manifest sha256:$manifest_hex)" >&2
