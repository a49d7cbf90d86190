#!/usr/bin/env bash
# shellcheck disable=SC2015 # "A && B || die": B is an assignment or a test
# install/bootstrap-node.sh — sets up the gpushare node agent on one node, as root, without
# Kubernetes objects; idempotent, and undone byte for byte by --uninstall.
#
#   install/bootstrap-node.sh [--preinstalled | --systemd] [OPTIONS] [BINARY]
#   install/bootstrap-node.sh --uninstall [OPTIONS]
#
# What an install does (each step only when something differs from what is there):
#   1. the binary BINARY (default target/release/gpushare) as BIN_DIR/gpushare, gpushare-runtime
#      beside it when built, and the in-container limiter libgpushare_limiter.so (taken from
#      beside BINARY) as LIB_DIR/libgpushare_limiter.so;
#   2. NRI enabled in containerd's config: 1.7 (config version 2, NRI off by default) gets
#      `disable = false` in [plugins."io.containerd.nri.v1.nri"] (the table, or the config
#      file, is written when missing); 2.x (NRI on by default) is only changed when its config
#      says `disable = true`. The file is edited as text: only that table's one line changes,
#      every other byte stays as it was. The version comes from `containerd --version`;
#   3. the agent: --systemd (the default where systemd is PID 1): the external plugin, the unit
#      UNIT_DIR/gpushare-node.service running `BIN_DIR/gpushare node --config ETC_DIR/node.toml`;
#      --preinstalled: containerd launches NRI_PLUGIN_DIR/10-gpushare with
#      NRI_CONF_DIR/10-gpushare.conf as its config (the directories default to the nri table's
#      plugin_path and plugin_config_path, else /opt/nri/plugins and /etc/nri/conf.d).
#      The node config is --config FILE, else install/node.toml; an existing node config is
#      kept unless --config is given. Without `status_listen` in it, the installed copy gets
#      `status_listen = "127.0.0.1:PORT"` (PORT: --status-port, default 9402) as its first line;
#   4. containerd restarted (RESTART_CMD) only when its config changed or the pre-installed
#      plugin (binary or config) is new or changed, then waited for until its socket answers;
#   5. waited for until the agent's /healthz (on status_listen) says ok — registered with
#      containerd and synchronized — at most --timeout seconds; otherwise it fails and says
#      where the agent's log is.
# Whatever fails (bad input, a refusal, a restart or health check that does not succeed), the
# run undoes what it changed — files, containerd's config, the restart — and exits non-zero:
# the node is never left half-installed. Every file as it was before the first install (or the
# fact that there was none) is kept in STATE_DIR, with the list of what was installed.
#
# --uninstall puts back containerd's config byte for byte (or removes it if bootstrap wrote
# it), restarts containerd if the config changed or a pre-installed plugin was removed, stops
# and disables the unit, and removes every file and directory bootstrap added (binary,
# library, unit, plugin, configs, STATE_DIR) and nothing else; files that were there before are
# put back as they were. It reads what to undo from STATE_DIR; a second run finds nothing to do.
# A containerd config edited since bootstrap wrote it is not overwritten without --force.
#
# Options (paths must be absolute; every default below is prefixed by --root):
#   --preinstalled            containerd launches the agent (pre-installed NRI plugin)
#   --systemd                 external plugin under systemd (default when systemd is PID 1;
#                             refused when it is not)
#   --uninstall               undo an install (see above)
#   --force                   --uninstall: restore containerd's config even if edited since
#   --dry-run                 print the plan (and the diff of containerd's config); change nothing
#   --bin FILE, BINARY        the gpushare binary to install (default target/release/gpushare)
#   --config FILE             node config to install (default install/node.toml)
#   --containerd-bin FILE     containerd, for its version (default: containerd on PATH)
#   --containerd-version V    skip detection (1.7.x or 2.x)
#   --containerd-config FILE  containerd's config (default /etc/containerd/config.toml)
#   --containerd-socket FILE  containerd's socket (default: its config's [grpc] address, else
#                             /run/containerd/containerd.sock), polled with ctr after a restart
#   --restart-cmd CMD         how to restart containerd, run with bash -c
#                             (default `systemctl restart containerd`)
#   --root DIR                prefix of every default path below (default empty: /)
#   --bin-dir DIR             /usr/local/bin
#   --lib-dir DIR             /usr/lib/gpushare (the node config's [limiter] library must name
#                             the library there; install/node.toml's default does)
#   --etc-dir DIR             /etc/gpushare (node.toml, --systemd)
#   --unit-dir DIR            /etc/systemd/system (--systemd)
#   --nri-plugin-dir DIR      containerd's plugin_path, else /opt/nri/plugins (--preinstalled)
#   --nri-conf-dir DIR        containerd's plugin_config_path, else /etc/nri/conf.d
#   --state-dir DIR           /var/lib/gpushare/bootstrap
#   --status-port PORT        where /healthz is polled (127.0.0.1:PORT) when the node config
#                             has no status_listen (default 9402); must agree with it otherwise
#   --timeout SECONDS         for containerd's socket and for /healthz, each (default 60)
#   --systemctl CMD           systemctl to call (default systemctl)
#   -h, --help                this text
#
# Without systemd as PID 1 (containers, other init systems) --systemd is refused: use
# --preinstalled with --restart-cmd, or run `gpushare node --config …` under your init system.
# tests/e2e/bootstrap.sh (`make e2e-bootstrap`) runs --preinstalled on real containerd 1.7.35
# and 2.4.2; the --systemd mode is tested there only for its refusal without systemd.
set -euo pipefail
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PLUGIN_NAME=10-gpushare
UNIT_NAME=gpushare-node.service
NRI_ID=io.containerd.nri.v1.nri

say() { echo "bootstrap: $*"; }
warn() { echo "bootstrap: warning: $*" >&2; }
# Exits; the EXIT trap undoes what this run changed.
die() {
    echo "bootstrap: $*" >&2
    exit 1
}
usage() { sed -n '/^# install\/bootstrap-node.sh —/,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# ------------------------------------------------------------------ arguments ----
ACTION=install MODE='' FORCE=0 DRY=0
BIN_SRC='' CONFIG_SRC='' CONFIG_GIVEN=0
CTD_BIN='' CTD_VERSION='' CTD_CONFIG='' CTD_SOCKET='' RESTART_CMD=''
ROOT='' BIN_DIR='' LIB_DIR='' ETC_DIR='' UNIT_DIR='' NRI_PLUGIN_DIR='' NRI_CONF_DIR='' STATE_DIR=''
STATUS_PORT='' TIMEOUT=60 SYSTEMCTL=systemctl SYSTEMCTL_GIVEN=0

need_value() { # FLAG VALUE_OR_EMPTY ARGC
    (($3 >= 2)) || die "$1 needs a value (see --help)"
    [[ -n $2 ]] || die "$1 '': needs a non-empty value"
}
abs_path() { # FLAG VALUE
    [[ $2 == /* ]] || die "$1 '$2': must be an absolute path"
    [[ $2 != *$'\n'* && $2 != *$'\t'* && $2 != *'|'* ]] ||
        die "$1 '$2': newlines, tabs and '|' are not supported in paths"
}

while (($#)); do
    case $1 in
    --preinstalled | --systemd)
        [[ -z $MODE || $MODE == "${1#--}" ]] || die "$1: --preinstalled and --systemd exclude each other"
        MODE=${1#--}
        shift
        ;;
    --uninstall) ACTION=uninstall; shift ;;
    --force) FORCE=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h | --help)
        usage || true
        exit 0
        ;;
    --bin | --config | --containerd-bin | --containerd-version | --containerd-config | \
        --containerd-socket | --restart-cmd | --root | --bin-dir | --lib-dir | --etc-dir | \
        --unit-dir | --nri-plugin-dir | --nri-conf-dir | --state-dir | --status-port | \
        --timeout | --systemctl)
        need_value "$1" "${2-}" $#
        flag=$1 val=$2
        shift 2
        case $flag in
        --bin) BIN_SRC=$val ;;
        --config) CONFIG_SRC=$val CONFIG_GIVEN=1 ;;
        --containerd-bin) CTD_BIN=$val ;;
        --containerd-version) CTD_VERSION=$val ;;
        --containerd-config) abs_path "$flag" "$val" && CTD_CONFIG=$val ;;
        --containerd-socket) abs_path "$flag" "$val" && CTD_SOCKET=$val ;;
        --restart-cmd) RESTART_CMD=$val ;;
        --root) abs_path "$flag" "$val" && ROOT=${val%/} ;;
        --bin-dir) abs_path "$flag" "$val" && BIN_DIR=${val%/} ;;
        --lib-dir) abs_path "$flag" "$val" && LIB_DIR=${val%/} ;;
        --etc-dir) abs_path "$flag" "$val" && ETC_DIR=${val%/} ;;
        --unit-dir) abs_path "$flag" "$val" && UNIT_DIR=${val%/} ;;
        --nri-plugin-dir) abs_path "$flag" "$val" && NRI_PLUGIN_DIR=${val%/} ;;
        --nri-conf-dir) abs_path "$flag" "$val" && NRI_CONF_DIR=${val%/} ;;
        --state-dir) abs_path "$flag" "$val" && STATE_DIR=${val%/} ;;
        --status-port)
            [[ $val =~ ^[0-9]{1,5}$ ]] && ((10#$val >= 1 && 10#$val <= 65535)) ||
                die "--status-port '$val': not a port number (1-65535)"
            STATUS_PORT=$((10#$val))
            ;;
        --timeout)
            [[ $val =~ ^[0-9]{1,4}$ ]] && ((10#$val >= 1)) ||
                die "--timeout '$val': not a number of seconds (1-9999)"
            TIMEOUT=$((10#$val))
            ;;
        --systemctl) SYSTEMCTL=$val SYSTEMCTL_GIVEN=1 ;;
        esac
        ;;
    --*) die "unknown option '$1' (see --help)" ;;
    *)
        [[ -z $BIN_SRC ]] || die "'$1': only one BINARY (already $BIN_SRC)"
        BIN_SRC=$1
        shift
        ;;
    esac
done

if [[ $ACTION == uninstall ]]; then
    [[ -z $MODE ]] || die "--uninstall takes no $([[ $MODE == preinstalled ]] && echo --preinstalled || echo --systemd): the mode comes from the state dir"
fi
((FORCE == 0)) || [[ $ACTION == uninstall ]] || die "--force goes with --uninstall only"

BIN_DIR=${BIN_DIR:-$ROOT/usr/local/bin}
LIB_DIR=${LIB_DIR:-$ROOT/usr/lib/gpushare}
ETC_DIR=${ETC_DIR:-$ROOT/etc/gpushare}
UNIT_DIR=${UNIT_DIR:-$ROOT/etc/systemd/system}
STATE_DIR=${STATE_DIR:-$ROOT/var/lib/gpushare/bootstrap}
CTD_CONFIG=${CTD_CONFIG:-$ROOT/etc/containerd/config.toml}
DEFAULT_RESTART=0
[[ -n $RESTART_CMD ]] || { RESTART_CMD="$(printf %q "$SYSTEMCTL") restart containerd" && DEFAULT_RESTART=1; }
MANIFEST=$STATE_DIR/manifest

((EUID == 0)) || ((DRY)) || die "run as root"

systemd_booted() { [[ -d /run/systemd/system ]]; }
pid1() { cat /proc/1/comm 2>/dev/null || echo '?'; }

# One bootstrap at a time (the lock is this script file, so nothing is created for it).
if command -v flock >/dev/null && ((DRY == 0)); then
    exec 9<"${BASH_SOURCE[0]}"
    flock -n 9 || die "another install/bootstrap-node.sh is running"
fi

# ------------------------------------------------------------ TOML, as text ----
# The config is read into TL (lines, without their "\n"; a "\r" stays part of its line) and
# TL_EOL (1 when the file ends with a newline). Tables are found by their header lines; a
# multi-line string or array whose lines begin with "[" would confuse this, which no key of
# the tables read here has.
TL=() TL_EOL=1
toml_load() { # FILE
    TL=() TL_EOL=1 TL_FILE=$1
    [[ -e $1 ]] || return 0
    mapfile -t TL <"$1"
    if [[ -s $1 && $(tail -c1 "$1" | od -An -tx1 | tr -d ' ') != 0a ]]; then TL_EOL=0; fi
}
toml_write() { # FILE: TL as it was read (a missing final newline stays missing)
    local i n=${#TL[@]}
    {
        for ((i = 0; i < n; i++)); do
            if ((i == n - 1 && TL_EOL == 0)); then printf '%s' "${TL[i]}"; else printf '%s\n' "${TL[i]}"; fi
        done
    } >"$1"
}
is_header() { [[ $1 =~ ^[[:space:]]*\[ ]]; }
is_comment() { [[ $1 =~ ^[[:space:]]*(#|$) ]]; }
# Index of the line of table header NAME_RE (an ERE for what is between the brackets), or -1;
# dies if there are two.
toml_find_table() { # NAME_RE
    local i found=-1 re="^[[:space:]]*\[[[:space:]]*($1)[[:space:]]*\][[:space:]]*(#.*)?$"
    for ((i = 0; i < ${#TL[@]}; i++)); do
        if [[ ${TL[i]} =~ $re ]]; then
            ((found < 0)) || die "${TL_FILE:-?}: table [${BASH_REMATCH[1]}] appears twice (lines $((found + 1)), $((i + 1)))"
            found=$i
        fi
    done
    echo "$found"
}
# End (exclusive) of the table whose header is at line H: the next header.
toml_table_end() { # H
    local i
    for ((i = $1 + 1; i < ${#TL[@]}; i++)); do is_header "${TL[i]}" && break; done
    echo "$i"
}
# Index of the line `KEY = …` in lines [FROM, TO), or -1.
toml_key_line() { # FROM TO KEY
    local i re="^[[:space:]]*$3[[:space:]]*="
    for ((i = $1; i < $2; i++)); do [[ ${TL[i]} =~ $re ]] && { echo "$i"; return; }; done
    echo -1
}
# The string value of the line (basic "…" without escapes, or literal '…').
toml_string_value() { # LINE
    if [[ $1 =~ =[[:space:]]*\"([^\"\\]*)\" || $1 =~ =[[:space:]]*\'([^\']*)\' ]]; then
        echo "${BASH_REMATCH[1]}"
    else
        return 1
    fi
}
# KEY's string value in the table at header H (-1: the top level, before the first header).
toml_get() { # H KEY
    local from to k
    if (($1 < 0)); then
        from=0
        for ((to = 0; to < ${#TL[@]}; to++)); do is_header "${TL[to]}" && break; done
    else
        from=$(($1 + 1)) to=$(toml_table_end "$1")
    fi
    k=$(toml_key_line "$from" "$to" "$2")
    ((k >= 0)) || return 1
    toml_string_value "${TL[k]}"
}
NRI_HEADER_RE="plugins[[:space:]]*\.[[:space:]]*(\"$NRI_ID\"|'$NRI_ID')"

# ------------------------------------------------------------ containerd's config ----
# Sets CTD_MAJOR (1 for 1.7, 2 for 2.x) from --containerd-version or `containerd --version`.
detect_containerd() {
    local v=$CTD_VERSION out
    if [[ -z $v ]]; then
        local bin=${CTD_BIN:-containerd}
        if [[ -n $CTD_BIN ]]; then
            [[ -x $CTD_BIN && -f $CTD_BIN ]] || die "--containerd-bin '$CTD_BIN': not an executable file"
        else
            command -v containerd >/dev/null ||
                die "containerd not found on PATH: pass --containerd-bin FILE or --containerd-version V"
        fi
        out=$("$bin" --version 2>&1) || die "'$bin --version' failed: $out"
        [[ $out =~ v?([0-9]+\.[0-9]+\.[0-9]+[^[:space:]]*) ]] ||
            die "cannot read a version from '$bin --version': $out (pass --containerd-version)"
        v=${BASH_REMATCH[1]}
        CTD_VERSION_FROM="$bin --version"
    else
        CTD_VERSION_FROM=--containerd-version
    fi
    [[ $v =~ ^v?([0-9]+)\.([0-9]+) ]] || die "--containerd-version '$v': not a version (1.7.x or 2.x)"
    local major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
    if ((major == 1 && minor == 7)); then
        CTD_MAJOR=1
    elif ((major == 2)); then
        CTD_MAJOR=2
    elif ((major == 1 && minor < 7)); then
        die "containerd $v ($CTD_VERSION_FROM) has no NRI: use the runtime wrapper gpushare-runtime instead (README, 'Runtimes without NRI')"
    else
        die "containerd $v ($CTD_VERSION_FROM): only 1.7.x and 2.x are supported"
    fi
    CTD_VERSION=${v#v}
}

# Computes containerd's config with NRI enabled into NEW_CTD_CONFIG (a temp file) and sets
# CTD_CHANGE (empty: none; else what changes), NRI_PLUGIN_PATH, NRI_CONF_PATH, NRI_SOCKET,
# CTD_GRPC_ADDRESS from the config.
plan_containerd_config() {
    local h end d i line v re
    CTD_EXISTS=0 CTD_CHANGE='' NRI_PLUGIN_PATH='' NRI_CONF_PATH='' NRI_SOCKET='' CTD_GRPC_ADDRESS=''
    if [[ -L $CTD_CONFIG ]]; then
        local target
        target=$(readlink -f "$CTD_CONFIG") || die "--containerd-config '$CTD_CONFIG': dangling symlink"
        say "containerd config $CTD_CONFIG is a link to $target; editing that"
        CTD_CONFIG=$target
    fi
    if [[ -e $CTD_CONFIG ]]; then
        [[ -f $CTD_CONFIG && -r $CTD_CONFIG ]] || die "--containerd-config '$CTD_CONFIG': not a readable file"
        CTD_EXISTS=1
    fi
    toml_load "$CTD_CONFIG"
    # The NRI plugin named anywhere but in its own table's header (disabled_plugins, a dotted
    # key, an inline table) is beyond a careful textual edit.
    re="^[[:space:]]*\[[[:space:]]*${NRI_HEADER_RE}[[:space:]]*\]"
    for ((i = 0; i < ${#TL[@]}; i++)); do
        line=${TL[i]}
        [[ $line == *"$NRI_ID"* ]] || continue
        is_comment "$line" && continue
        [[ $line =~ $re ]] && continue
        if [[ $line =~ ^[[:space:]]*disabled_plugins ]]; then
            die "$CTD_CONFIG line $((i + 1)): NRI is in disabled_plugins; take $NRI_ID out of it by hand, then rerun"
        fi
        die "$CTD_CONFIG line $((i + 1)): NRI ($NRI_ID) is configured in a form this script does not edit (only a [plugins.\"$NRI_ID\"] table): '$line'"
    done
    h=$(toml_find_table "$NRI_HEADER_RE")
    local grpc
    grpc=$(toml_find_table grpc)
    if ((grpc >= 0)); then CTD_GRPC_ADDRESS=$(toml_get "$grpc" address || true); fi
    if ((h >= 0)); then
        NRI_PLUGIN_PATH=$(toml_get "$h" plugin_path || true)
        NRI_CONF_PATH=$(toml_get "$h" plugin_config_path || true)
        NRI_SOCKET=$(toml_get "$h" socket_path || true)
        end=$(toml_table_end "$h")
        d=$(toml_key_line $((h + 1)) "$end" disable_connections)
        if ((d >= 0)) && [[ ${TL[d]} =~ =[[:space:]]*true ]] && [[ $MODE == systemd ]]; then
            die "$CTD_CONFIG line $((d + 1)): disable_connections = true keeps external plugins out; use --preinstalled or set it to false"
        fi
        d=$(toml_key_line $((h + 1)) "$end" disable)
    fi
    # The version-2 schema 1.7 needs for this table's name.
    if ((CTD_MAJOR == 1)); then
        local ver=
        for ((i = 0; i < ${#TL[@]}; i++)); do
            is_header "${TL[i]}" && break
            if [[ ${TL[i]} =~ ^[[:space:]]*version[[:space:]]*=[[:space:]]*([0-9]+) ]]; then ver=${BASH_REMATCH[1]}; fi
        done
        if [[ -z $ver ]] && ((CTD_EXISTS)); then
            for ((i = 0; i < ${#TL[@]}; i++)); do
                [[ ${TL[i]} =~ ^[[:space:]]*\[+[[:space:]]*plugins ]] &&
                    die "$CTD_CONFIG has plugin tables but no 'version = 2': a version-1 containerd config; migrate it (containerd config migrate) first"
            done
        elif [[ -n $ver && $ver != 2 ]]; then
            die "$CTD_CONFIG is config version $ver; containerd $CTD_VERSION reads version 2 (containerd config migrate)"
        fi
    fi

    if ((h >= 0 && d >= 0)); then
        if [[ ${TL[d]} =~ ^([[:space:]]*disable[[:space:]]*=[[:space:]]*)true(.*)$ ]]; then
            TL[d]="${BASH_REMATCH[1]}false${BASH_REMATCH[2]}"
            CTD_CHANGE="line $((d + 1)): disable = true → false"
        elif ! [[ ${TL[d]} =~ =[[:space:]]*false([[:space:]]|#|$) ]]; then
            die "$CTD_CONFIG line $((d + 1)): cannot read '${TL[d]}' (want disable = true or false)"
        fi
    elif ((CTD_MAJOR == 1)); then
        if ((h >= 0)); then
            [[ ${TL[h]} =~ ^([[:space:]]*) ]]
            TL=("${TL[@]:0:h+1}" "${BASH_REMATCH[1]}  disable = false" "${TL[@]:h+1}")
            CTD_CHANGE="line $((h + 2)): disable = false added to [plugins.\"$NRI_ID\"]"
        elif ((CTD_EXISTS)); then
            TL_EOL=1 # the new lines end the file, with their newline
            [[ -z $ver ]] && TL=("version = 2" "${TL[@]}")
            TL+=("" "[plugins.\"$NRI_ID\"]" "  disable = false")
            CTD_CHANGE="[plugins.\"$NRI_ID\"] disable = false appended${ver:-; version = 2 added}"
        else
            TL=("# written by gpushare's install/bootstrap-node.sh: NRI on (containerd 1.7)" "version = 2" ""
                "[plugins.\"$NRI_ID\"]" "  disable = false")
            TL_EOL=1
            CTD_CHANGE="new file with [plugins.\"$NRI_ID\"] disable = false"
        fi
    fi
    NEW_CTD_CONFIG=$TMP/containerd-config.toml
    if [[ -n $CTD_CHANGE ]]; then toml_write "$NEW_CTD_CONFIG"; fi
}

# ------------------------------------------------------------ the node config ----
# Prepares the node config to install in NEW_NODE_CONFIG (or keeps the installed one) and
# sets STATUS_ADDR (host:port /healthz is polled on) and AGENT_LOG.
plan_node_config() {
    local dest=$1 src listen kept=0 log
    if ((CONFIG_GIVEN)); then
        [[ -f $CONFIG_SRC && -r $CONFIG_SRC ]] || die "--config '$CONFIG_SRC': not a readable file"
        src=$CONFIG_SRC
    elif [[ -e $dest ]]; then
        src=$dest kept=1
    else
        src=$HERE/node.toml
    fi
    [[ -f $src ]] || die "node config $src not found"
    toml_load "$src"
    listen=$(toml_get -1 status_listen || true)
    if [[ -z $listen ]]; then
        ((kept == 0)) || die "$dest (kept as it is, no --config) sets no status_listen, where bootstrap checks /healthz: set it there, or pass --config FILE to replace it"
        listen=127.0.0.1:${STATUS_PORT:-9402}
        TL=("status_listen = \"$listen\"   # added by install/bootstrap-node.sh (its /healthz check)" "${TL[@]}")
    fi
    [[ $listen =~ ^(.*):([0-9]+)$ ]] || die "$src: status_listen '$listen' is not HOST:PORT"
    local host=${BASH_REMATCH[1]} port=${BASH_REMATCH[2]}
    if [[ -n $STATUS_PORT && $port != "$STATUS_PORT" ]]; then
        die "--status-port '$STATUS_PORT': $src says status_listen = \"$listen\"; drop the flag or make them agree"
    fi
    case $host in 0.0.0.0 | '' | '[::]') host=127.0.0.1 ;; esac
    STATUS_ADDR=$host:$port
    local lh
    lh=$(toml_find_table log)
    log=
    if ((lh >= 0)); then log=$(toml_get "$lh" file || true); fi
    AGENT_LOG=$log
    NEW_NODE_CONFIG=$TMP/node.toml
    NODE_CONFIG_SRC=$src
    if ((kept)); then cp "$src" "$NEW_NODE_CONFIG"; else toml_write "$NEW_NODE_CONFIG"; fi
    local lib
    lib=$(toml_get "$(toml_find_table limiter)" library 2>/dev/null || true)
    if [[ -n $lib && $lib != "$LIB_DIR/libgpushare_limiter.so" ]]; then
        warn "$src: [limiter] library = \"$lib\", not the library installed at $LIB_DIR/libgpushare_limiter.so"
    fi
}

# ------------------------------------------------------------ manifest and journal ----
# STATE_DIR/manifest: what the first install found and what it added, one entry a line:
#   key<TAB>value                  mode, containerd-config, containerd-socket, ...
#   file<TAB>PATH<TAB>created      bootstrap created PATH (uninstall removes it)
#   file<TAB>PATH<TAB>saved<TAB>N  PATH was there: its bytes are in STATE_DIR/orig/N
#   dir<TAB>PATH                   bootstrap created the directory
#   wrote<TAB>PATH<TAB>SHA256      what bootstrap last wrote to containerd's config
MAN=()
manifest_load() {
    MAN=()
    [[ -f $MANIFEST ]] && mapfile -t MAN <"$MANIFEST"
    return 0
}
manifest_get() { # KEY
    local e
    for e in "${MAN[@]}"; do [[ $e == "$1"$'\t'* ]] && { echo "${e#*$'\t'}"; return 0; }; done
    return 1
}
manifest_has() { # PATH: a file or dir entry for PATH
    local e
    for e in "${MAN[@]}"; do [[ $e == file$'\t'"$1"$'\t'* || $e == dir$'\t'"$1" ]] && return 0; done
    return 1
}
manifest_set() { # KEY VALUE (replaces; for keys with one value, and wrote by path)
    local key=$1 val=$2 e out=() prefix=$1$'\t'
    [[ $key == wrote ]] && prefix=$key$'\t'${val%%$'\t'*}$'\t'
    for e in "${MAN[@]}"; do [[ $e == "$prefix"* ]] || out+=("$e"); done
    MAN=("${out[@]}" "$key"$'\t'"$val")
    manifest_save
}
manifest_add() { MAN+=("$1") && manifest_save; }
manifest_save() {
    journal_file "$MANIFEST"
    printf '%s\n' "${MAN[@]}" >"$MANIFEST.tmp" && mv -f "$MANIFEST.tmp" "$MANIFEST"
}

# This run's undo list (in memory): "file<TAB>PATH<TAB>COPY|-" (PATH as it was before this
# run: a copy, or absent), "dir<TAB>PATH", "unit<TAB>enabled", "restarted".
J=() RUN_DIR='' COMMITTED=0 RESTARTED=0
journal_file() { # PATH: keep PATH's state before this run, once
    local e n
    for e in "${J[@]}"; do [[ $e == file$'\t'"$1"$'\t'* ]] && return 0; done
    if [[ -e $1 || -L $1 ]]; then
        n=$RUN_DIR/${#J[@]}
        cp -a "$1" "$n" || die "cannot keep a copy of $1 in $RUN_DIR"
        J+=("file"$'\t'"$1"$'\t'"$n")
    else
        J+=("file"$'\t'"$1"$'\t'-)
    fi
}
# mkdir -p that records every directory it creates (manifest and journal).
mkdirs() { # DIR
    local d=$1 todo=()
    while [[ ! -d $d ]]; do
        [[ ! -e $d ]] || die "$d exists and is not a directory"
        todo=("$d" "${todo[@]}")
        d=$(dirname "$d")
    done
    for d in "${todo[@]}"; do
        mkdir "$d" || die "cannot create $d"
        J+=("dir"$'\t'"$d")
        # The state dir's own chain is recorded once the manifest can be written.
        if [[ -n $RUN_DIR ]]; then manifest_add "dir"$'\t'"$d"; else STATE_DIRS_CREATED+=("$d"); fi
    done
}
STATE_DIRS_CREATED=()
# Before bootstrap changes PATH for the first time: note what was there (manifest).
first_touch() { # PATH
    manifest_has "$1" && return 0
    if [[ -e $1 || -L $1 ]]; then
        local n=0
        while [[ -e $STATE_DIR/orig/$n ]]; do n=$((n + 1)); done
        mkdirs "$STATE_DIR/orig"
        journal_file "$STATE_DIR/orig/$n"
        cp -a "$1" "$STATE_DIR/orig/$n" || die "cannot keep the original $1 in $STATE_DIR/orig"
        manifest_add "file"$'\t'"$1"$'\t'"saved"$'\t'"$n"
    else
        manifest_add "file"$'\t'"$1"$'\t'"created"
    fi
}
# The mode DEST gets: MODE, or DEST's own when MODE is "keep" (644 for a new file).
want_mode() { # DEST MODE
    if [[ $2 != keep ]]; then echo "$2"; elif [[ -f $1 ]]; then stat -c %a "$1"; else echo 644; fi
}
# Succeeds when placing SRC at DEST would change DEST (bytes or mode).
differs() { # SRC DEST MODE
    local want
    want=$(want_mode "$2" "$3")
    ! { [[ -f $2 && ! -L $2 ]] && cmp -s "$1" "$2" && [[ $(stat -c %a "$2") == "${want#0}" ]]; }
}
# Puts SRC at DEST (see want_mode) unless DEST already has those bytes and that mode; sets
# CHANGED to 1 or 0.
place() { # SRC DEST MODE
    local src=$1 dest=$2 want
    CHANGED=0
    differs "$src" "$dest" "$3" || return 0
    CHANGED=1
    want=$(want_mode "$dest" "$3")
    mkdirs "$(dirname "$dest")"
    first_touch "$dest"
    journal_file "$dest"
    local tmp=$dest.gpushare-tmp.$$
    cp "$src" "$tmp" && chmod "$want" "$tmp" || { rm -f "$tmp"; die "cannot write $dest"; }
    [[ -f $dest ]] && chown --reference="$dest" "$tmp" 2>/dev/null
    mv -f "$tmp" "$dest" || { rm -f "$tmp"; die "cannot write $dest"; }
    say "installed $dest"
}

restart_containerd() { # WHY
    say "restarting containerd ($1): $RESTART_CMD"
    RESTARTED=1
    # (fd 9, the lock, is not passed on: a containerd started by the command would hold it.)
    bash -c "$RESTART_CMD" 9<&- || die "restarting containerd failed: '$RESTART_CMD' exited $?"
    wait_containerd
}

wait_containerd() {
    local sock=${CTD_SOCKET:-${CTD_GRPC_ADDRESS:-/run/containerd/containerd.sock}} ctr='' deadline
    sock=${sock#unix://}
    if [[ -n $CTD_BIN && -x $(dirname "$CTD_BIN")/ctr ]]; then
        ctr=$(dirname "$CTD_BIN")/ctr
    else
        ctr=$(command -v ctr || true)
    fi
    deadline=$((SECONDS + TIMEOUT))
    while :; do
        if [[ -S $sock ]]; then
            if [[ -z $ctr ]] || timeout 5 "$ctr" --address "$sock" version >/dev/null 2>&1; then
                say "containerd answers on $sock"
                return 0
            fi
        fi
        ((SECONDS < deadline)) || die "containerd does not answer on $sock ${TIMEOUT} s after the restart${ctr:+ ($ctr version)}"
        sleep 0.2
    done
}

http_get() { # HOST:PORT PATH -> body; fails unless 200
    local hp=$1 path=$2
    if command -v curl >/dev/null; then
        curl -fsS --max-time 2 "http://$hp$path" 2>/dev/null
        return
    fi
    local host=${hp%:*} port=${hp##*:} status body
    host=${host#[}
    host=${host%]}
    exec 8<>"/dev/tcp/$host/$port" 2>/dev/null || return 1
    printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$hp" >&8
    status=$(timeout 2 head -1 <&8) || { exec 8>&-; return 1; }
    body=$(timeout 2 cat <&8 | sed '1,/^\r\{0,1\}$/d')
    exec 8>&-
    [[ $status == *" 200 "* ]] && echo "$body"
}

wait_healthy() {
    local deadline=$((SECONDS + TIMEOUT)) body
    while :; do
        body=$(http_get "$STATUS_ADDR" /healthz || true)
        if [[ $body == ok* ]]; then
            say "agent registered with containerd (http://$STATUS_ADDR/healthz: ok)"
            return 0
        fi
        if ((SECONDS >= deadline)); then
            local where
            if [[ -n $AGENT_LOG ]]; then
                where="its log: $AGENT_LOG"
                [[ $MODE == systemd ]] || where+=" (a config the agent rejects is reported in containerd's log, not there)"
            elif [[ $MODE == systemd ]]; then
                where="its log: journalctl -u $UNIT_NAME"
            else
                where="no [log] file in its config, and a pre-installed plugin's stderr is not kept: set [log] file; containerd's log says whether it launched $NRI_PLUGIN_DIR/$PLUGIN_NAME"
            fi
            body=$(curl -sS --max-time 2 "http://$STATUS_ADDR/healthz" 2>&1 || true)
            die "the agent did not register within ${TIMEOUT} s: http://$STATUS_ADDR/healthz said '${body%%$'\n'*}'; $where"
        fi
        sleep 0.25
    done
}

# ------------------------------------------------------------ undo on failure ----
TMP=
on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    if ((rc != 0 && COMMITTED == 0)) && [[ $ACTION == install ]] && ((DRY == 0)) && [[ -n $RUN_DIR ]]; then
        rollback || true
    fi
    [[ -z $TMP ]] || rm -rf "$TMP"
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rollback() {
    local i e path copy changed_ctd=0 enabled=0 started=0
    echo "bootstrap: undoing what this run changed" >&2
    for e in "${J[@]}"; do
        [[ $e == unit$'\t'enabled ]] && enabled=1
        [[ $e == unit$'\t'started ]] && started=1
    done
    ((enabled == 0)) || "$SYSTEMCTL" disable --now "$UNIT_NAME" >&2 || true
    for ((i = ${#J[@]} - 1; i >= 0; i--)); do
        e=${J[i]}
        [[ $e == file$'\t'* ]] || continue
        path=${e#file$'\t'} copy=${path##*$'\t'} path=${path%$'\t'*}
        [[ $path == "$CTD_CONFIG" ]] && changed_ctd=1
        [[ $path == "$NRI_PLUGIN_DIR/"* || $path == "$NRI_CONF_DIR/"* ]] && changed_ctd=1
        if [[ $copy == - ]]; then
            rm -f "$path"
        else
            cp -a "$copy" "$path.gpushare-tmp.$$" && mv -f "$path.gpushare-tmp.$$" "$path" ||
                echo "bootstrap: could not put back $path (its copy: $copy)" >&2
        fi
    done
    for e in "${J[@]}"; do [[ $e == reload ]] && { "$SYSTEMCTL" daemon-reload >&2 || true; }; done
    # A unit that ran before this run runs again, on the files put back.
    if ((started && !enabled)) && [[ -e $UNIT_DIR/$UNIT_NAME ]]; then "$SYSTEMCTL" restart "$UNIT_NAME" >&2 || true; fi
    rm -rf "$RUN_DIR"
    for ((i = ${#J[@]} - 1; i >= 0; i--)); do
        e=${J[i]}
        [[ $e == dir$'\t'* ]] && { rmdir "${e#dir$'\t'}" 2>/dev/null || true; }
    done
    if ((RESTARTED && changed_ctd)); then
        echo "bootstrap: restarting containerd again, as it was: $RESTART_CMD" >&2
        bash -c "$RESTART_CMD" >&2 9<&- && (wait_containerd >&2) ||
            echo "bootstrap: containerd did not come back: restart it by hand" >&2
    fi
}

# ------------------------------------------------------------ uninstall ----
uninstall() {
    manifest_load
    if ((${#MAN[@]} == 0)); then
        say "nothing to uninstall (no $MANIFEST)"
        return 0
    fi
    MODE=$(manifest_get mode || true)
    CTD_CONFIG=$(manifest_get containerd-config || true)
    CTD_SOCKET=${CTD_SOCKET:-$(manifest_get containerd-socket || true)}
    [[ -n $CTD_BIN ]] || CTD_BIN=$(manifest_get containerd-bin || true)
    NRI_PLUGIN_DIR=$(manifest_get nri-plugin-dir || true)
    NRI_CONF_DIR=$(manifest_get nri-conf-dir || true)
    UNIT_DIR=$(manifest_get unit-dir || true)
    say "uninstalling ($MODE mode, as recorded in $MANIFEST)"
    local e n path how orig wrote cur restart=0 todo=()
    # First what is to be done, so that a refusal changes nothing.
    for ((n = ${#MAN[@]} - 1; n >= 0; n--)); do
        e=${MAN[n]}
        [[ $e == file$'\t'* ]] || continue
        path=${e#file$'\t'} how=${path#*$'\t'} path=${path%%$'\t'*}
        case $how in
        created)
            [[ -e $path || -L $path ]] || continue
            todo+=("rm"$'\t'"$path")
            ;;
        saved$'\t'*)
            orig=$STATE_DIR/orig/${how#saved$'\t'}
            [[ -e $orig || -L $orig ]] || die "the original of $path is missing ($orig); nothing was changed"
            if cmp -s "$orig" "$path" 2>/dev/null &&
                [[ $(stat -c %a:%u:%g "$orig") == "$(stat -c %a:%u:%g "$path" 2>/dev/null)" ]]; then
                continue
            fi
            todo+=("restore"$'\t'"$path"$'\t'"$orig")
            ;;
        *) die "$MANIFEST: cannot read the entry '$e'; nothing was changed" ;;
        esac
        [[ $path == "$CTD_CONFIG" || $path == "$NRI_PLUGIN_DIR/$PLUGIN_NAME" ||
            $path == "$NRI_CONF_DIR/$PLUGIN_NAME.conf" ]] && restart=1
    done
    # containerd's config is only put back over the bytes bootstrap wrote (unless --force).
    wrote=''
    for e in "${MAN[@]}"; do
        if [[ $e == wrote$'\t'"$CTD_CONFIG"$'\t'* ]]; then wrote=${e##*$'\t'}; fi
    done
    if [[ -n $wrote && -e $CTD_CONFIG ]]; then
        cur=$(sha256sum "$CTD_CONFIG" | cut -d' ' -f1)
        if [[ $cur != "$wrote" ]] && ((FORCE == 0)); then
            die "$CTD_CONFIG changed since bootstrap wrote it (sha256 $cur, not $wrote): --uninstall --force puts back the original anyway, losing the later edits; nothing was changed"
        fi
    fi
    if ((restart && DEFAULT_RESTART && SYSTEMCTL_GIVEN == 0)) && ! systemd_booted; then
        die "containerd must be restarted (its config or pre-installed plugin changes back) but systemd is not running (PID 1 is $(pid1)): pass --restart-cmd CMD; nothing was changed"
    fi

    if [[ $MODE == systemd && -e $UNIT_DIR/$UNIT_NAME ]]; then
        "$SYSTEMCTL" disable --now "$UNIT_NAME" || warn "systemctl disable --now $UNIT_NAME failed"
    fi
    for e in "${todo[@]}"; do
        case $e in
        rm$'\t'*)
            path=${e#rm$'\t'}
            rm -f "$path" || die "cannot remove $path"
            say "removed $path"
            ;;
        restore$'\t'*)
            path=${e#restore$'\t'} orig=${path#*$'\t'} path=${path%%$'\t'*}
            cp -a "$orig" "$path.gpushare-tmp.$$" && mv -f "$path.gpushare-tmp.$$" "$path" ||
                die "cannot put back $path from $orig"
            say "put back $path as it was before bootstrap"
            ;;
        esac
    done
    if [[ $MODE == systemd ]]; then "$SYSTEMCTL" daemon-reload || warn "systemctl daemon-reload failed"; fi
    if ((restart)); then
        restart_containerd "its config or pre-installed plugin changed back"
    else
        say "containerd: no restart needed"
    fi
    # Directories bootstrap created, latest (deepest) first: the state dir's own come last.
    local dirs=() keep=()
    for e in "${MAN[@]}"; do [[ $e == dir$'\t'* ]] && dirs=("${e#dir$'\t'}" "${dirs[@]}"); done
    rm -rf "${STATE_DIR:?}/orig" "$STATE_DIR"/.run.* && rm -f "$MANIFEST" "$MANIFEST.tmp"
    for path in "${dirs[@]}"; do
        [[ -d $path ]] || continue
        rmdir "$path" 2>/dev/null || keep+=("$path")
    done
    ((${#keep[@]} == 0)) || warn "kept directories bootstrap created that are not empty now: ${keep[*]}"
    say "uninstalled"
}

# ------------------------------------------------------------ install ----
install_node() {
    manifest_load
    local prev c
    if prev=$(manifest_get mode); then
        [[ -n $MODE ]] || MODE=$prev
        [[ $MODE == "$prev" ]] || die "--$MODE: installed in $prev mode (see $MANIFEST); --uninstall first"
        c=$(manifest_get containerd-config || true)
        [[ -z $c || $c == "$CTD_CONFIG" || $c == "$(readlink -f "$CTD_CONFIG" 2>/dev/null)" ]] ||
            die "--containerd-config '$CTD_CONFIG': installed against $c (see $MANIFEST); --uninstall first"
    fi
    if [[ -z $MODE ]]; then
        systemd_booted || ((SYSTEMCTL_GIVEN)) ||
            die "systemd is not running here (PID 1 is $(pid1)), so the default --systemd mode cannot run the agent: use --preinstalled (containerd launches it; with --restart-cmd CMD to restart containerd)"
        MODE=systemd
    fi
    if [[ $MODE == systemd ]] && ! systemd_booted && ((SYSTEMCTL_GIVEN == 0)); then
        die "--systemd: systemd is not running here (PID 1 is $(pid1)); use --preinstalled, or run '$BIN_DIR/gpushare node --config $ETC_DIR/node.toml' under your init system"
    fi

    # The artifacts.
    BIN_SRC=${BIN_SRC:-$HERE/../target/release/gpushare}
    [[ -f $BIN_SRC && -x $BIN_SRC ]] || die "--bin '$BIN_SRC': not an executable file (make build)"
    local lib_src runtime_src
    lib_src=$(dirname "$BIN_SRC")/libgpushare_limiter.so
    [[ -f $lib_src ]] || die "limiter library $lib_src (beside the binary) not found (make build)"
    runtime_src=$(dirname "$BIN_SRC")/gpushare-runtime
    [[ -f $runtime_src && -x $runtime_src ]] || runtime_src=

    # The plan: nothing is changed before it is complete.
    detect_containerd
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpushare-bootstrap.XXXXXX")
    plan_containerd_config
    CTD_SOCKET=${CTD_SOCKET:-${CTD_GRPC_ADDRESS:-/run/containerd/containerd.sock}}
    NRI_PLUGIN_DIR=${NRI_PLUGIN_DIR:-${NRI_PLUGIN_PATH:-$ROOT/opt/nri/plugins}}
    NRI_CONF_DIR=${NRI_CONF_DIR:-${NRI_CONF_PATH:-$ROOT/etc/nri/conf.d}}
    local conf_dest
    if [[ $MODE == preinstalled ]]; then conf_dest=$NRI_CONF_DIR/$PLUGIN_NAME.conf; else conf_dest=$ETC_DIR/node.toml; fi
    plan_node_config "$conf_dest"
    if [[ $MODE == systemd ]]; then
        sed -e "s|/usr/local/bin/gpushare|$BIN_DIR/gpushare|g" -e "s|/etc/gpushare/node.toml|$ETC_DIR/node.toml|g" \
            "$HERE/systemd/$UNIT_NAME" >"$TMP/unit"
        local sock
        toml_load "$NEW_NODE_CONFIG"
        sock=$(toml_get -1 nri_socket || echo /var/run/nri/nri.sock)
        [[ -z $NRI_SOCKET || $NRI_SOCKET == "$sock" ]] ||
            warn "containerd's NRI socket is $NRI_SOCKET but the node config's nri_socket is $sock"
    fi
    local files=("$lib_src" "$LIB_DIR/libgpushare_limiter.so" 644 "$BIN_SRC" "$BIN_DIR/gpushare" 755)
    [[ -z $runtime_src ]] || files+=("$runtime_src" "$BIN_DIR/gpushare-runtime" 755)
    files+=("$NEW_NODE_CONFIG" "$conf_dest" 644)
    if [[ $MODE == preinstalled ]]; then
        files+=("$BIN_SRC" "$NRI_PLUGIN_DIR/$PLUGIN_NAME" 755)
    else
        files+=("$TMP/unit" "$UNIT_DIR/$UNIT_NAME" 644)
    fi
    local i will_restart='' agent_new=0
    if [[ -n $CTD_CHANGE ]] && differs "$NEW_CTD_CONFIG" "$CTD_CONFIG" keep; then will_restart="its config changed"; fi
    for ((i = 0; i < ${#files[@]}; i += 3)); do
        differs "${files[i]}" "${files[i + 1]}" "${files[i + 2]}" || continue
        case ${files[i + 1]} in
        "$conf_dest" | "$NRI_PLUGIN_DIR/$PLUGIN_NAME")
            agent_new=1
            [[ $MODE == preinstalled ]] && will_restart=${will_restart:-"the pre-installed plugin is new or changed"}
            ;;
        "$BIN_DIR/gpushare" | "$UNIT_DIR/$UNIT_NAME") agent_new=1 ;;
        esac
    done

    say "containerd $CTD_VERSION ($CTD_VERSION_FROM), config $CTD_CONFIG: ${CTD_CHANGE:-NRI on already, no change}"
    say "mode $MODE; node config $conf_dest (from $NODE_CONFIG_SRC); /healthz on $STATUS_ADDR"
    if ((DRY)); then
        if [[ -n $CTD_CHANGE ]]; then
            if ((CTD_EXISTS)); then diff -u "$CTD_CONFIG" "$NEW_CTD_CONFIG" || true; else cat "$NEW_CTD_CONFIG"; fi
        fi
        for ((i = 0; i < ${#files[@]}; i += 3)); do
            if differs "${files[i]}" "${files[i + 1]}" "${files[i + 2]}"; then say "would install ${files[i + 1]}"; fi
        done
        say "would restart containerd: ${will_restart:-no}"
        say "dry run: nothing changed"
        return 0
    fi
    if [[ -n $will_restart ]] && ((DEFAULT_RESTART && SYSTEMCTL_GIVEN == 0)) && ! systemd_booted; then
        die "containerd must be restarted ($will_restart) but systemd is not running (PID 1 is $(pid1)): pass --restart-cmd CMD; nothing was changed"
    fi

    # The state dir first: everything after it is recorded in its manifest.
    mkdirs "$STATE_DIR"
    RUN_DIR=$(mktemp -d "$STATE_DIR/.run.XXXXXX")
    local d
    for d in "${STATE_DIRS_CREATED[@]}"; do manifest_add "dir"$'\t'"$d"; done
    manifest_get mode >/dev/null || manifest_set mode "$MODE"
    manifest_set containerd-config "$CTD_CONFIG"
    manifest_set containerd-socket "$CTD_SOCKET"
    [[ -z $CTD_BIN ]] || manifest_set containerd-bin "$CTD_BIN"
    manifest_set nri-plugin-dir "$NRI_PLUGIN_DIR"
    manifest_set nri-conf-dir "$NRI_CONF_DIR"
    manifest_set unit-dir "$UNIT_DIR"

    local any=0
    for ((i = 0; i < ${#files[@]}; i += 3)); do
        place "${files[i]}" "${files[i + 1]}" "${files[i + 2]}"
        any=$((any | CHANGED))
        if ((CHANGED)) && [[ ${files[i + 1]} == "$UNIT_DIR/$UNIT_NAME" ]]; then
            J+=(reload)
            "$SYSTEMCTL" daemon-reload || die "systemctl daemon-reload failed"
        fi
    done
    if [[ -n $CTD_CHANGE ]]; then
        place "$NEW_CTD_CONFIG" "$CTD_CONFIG" keep
        any=$((any | CHANGED))
        manifest_set wrote "$CTD_CONFIG"$'\t'"$(sha256sum "$CTD_CONFIG" | cut -d' ' -f1)"
    fi

    if [[ -n $will_restart ]]; then
        restart_containerd "$will_restart"
    else
        say "containerd: no restart needed"
    fi
    if [[ $MODE == systemd ]]; then
        if ! "$SYSTEMCTL" is-enabled --quiet "$UNIT_NAME" 2>/dev/null; then
            J+=("unit"$'\t'enabled)
            "$SYSTEMCTL" enable "$UNIT_NAME" || die "systemctl enable $UNIT_NAME failed"
        fi
        if ((agent_new)) || ! "$SYSTEMCTL" is-active --quiet "$UNIT_NAME" 2>/dev/null; then
            J+=("unit"$'\t'started)
            say "starting $UNIT_NAME"
            "$SYSTEMCTL" restart "$UNIT_NAME" || die "systemctl restart $UNIT_NAME failed: journalctl -u $UNIT_NAME"
        fi
    fi
    wait_healthy
    COMMITTED=1
    rm -rf "$RUN_DIR"
    if ((any)); then say "installed ($MODE mode)"; else say "already installed: nothing changed"; fi
}

if [[ $ACTION == uninstall ]]; then uninstall; else install_node; fi
