#!/usr/bin/env bash
# Install or upgrade depositd from the source tree this script lives in.
#
#   deploy/install.sh [--prefix DIR] [--root DIR] [--python PY] [--system-site-packages]
#                     [--pip-args "ARGS"] [--no-systemctl]
#
# Idempotent: run it again to upgrade. It never overwrites the configuration, rules, profiles or
# credentials a merchant may have edited; the shipped versions are kept in PREFIX/share to
# compare with. See deploy/README.md.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: install.sh [options]
  --prefix DIR            install under DIR (default /opt/depositd; virtualenv in DIR/venv)
  --root DIR              stage the files under DIR (DIR/opt/depositd, DIR/etc/...) for a package
                          or an image, not to run them there: the unit, depositctl and the config
                          name the final system's paths (/etc/depositd, the prefix), so check and
                          start only once DIR's contents are at /; implies --no-systemctl
  --python PY             interpreter for the virtualenv (default python3; needs 3.11+)
  --system-site-packages  let the virtualenv see the interpreter's packages (distro packages)
  --pip-args "ARGS"       extra arguments for pip install, e.g. "--no-index --find-links DIR"
  --no-systemctl          do not run systemctl daemon-reload (also skipped when systemd is not
                          running, e.g. in an image build)
  -h, --help              this help
USAGE
}

die() {
    echo "install.sh: $*" >&2
    exit 2
}

log() { echo "install.sh: $*"; }

PREFIX=/opt/depositd
ROOT=
PYTHON=python3
SYSTEM_SITE=0
PIP_ARGS=
RUN_SYSTEMCTL=1

while [[ $# -gt 0 ]]; do
    case "$1" in
        --prefix) [[ $# -ge 2 ]] || die "--prefix needs a value"; PREFIX=$2; shift 2 ;;
        --prefix=*) PREFIX=${1#*=}; shift ;;
        --root) [[ $# -ge 2 ]] || die "--root needs a value"; ROOT=$2; shift 2 ;;
        --root=*) ROOT=${1#*=}; shift ;;
        --python) [[ $# -ge 2 ]] || die "--python needs a value"; PYTHON=$2; shift 2 ;;
        --python=*) PYTHON=${1#*=}; shift ;;
        --system-site-packages) SYSTEM_SITE=1; shift ;;
        --pip-args) [[ $# -ge 2 ]] || die "--pip-args needs a value"; PIP_ARGS=$2; shift 2 ;;
        --pip-args=*) PIP_ARGS=${1#*=}; shift ;;
        --no-systemctl) RUN_SYSTEMCTL=0; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done

[[ $PREFIX == /* ]] || die "--prefix must be an absolute path: $PREFIX"
# The prefix is written into the unit file, where blanks and quotes would need escaping.
[[ $PREFIX =~ ^[A-Za-z0-9_./+-]+$ ]] || die "--prefix may only hold letters, digits and _./+-"
PREFIX=${PREFIX%/}
if [[ -n $ROOT ]]; then
    mkdir -p "$ROOT"
    ROOT=$(cd "$ROOT" && pwd)
    RUN_SYSTEMCTL=0
fi
if [[ $RUN_SYSTEMCTL == 1 ]] && ! command -v systemctl >/dev/null 2>&1; then
    RUN_SYSTEMCTL=0
fi
# In an image build or a container without systemd as PID 1, systemctl is there but has no
# manager to talk to: daemon-reload would fail after every file is in place.
if [[ $RUN_SYSTEMCTL == 1 && ! -d /run/systemd/system ]]; then
    log "systemd is not running here (no /run/systemd/system): skipped systemctl daemon-reload"
    RUN_SYSTEMCTL=0
fi

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ -f $SRC/pyproject.toml && -d $SRC/worker ]] || die "not a depositd source tree: $SRC"
command -v "$PYTHON" >/dev/null 2>&1 || die "python not found: $PYTHON"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$PYTHON is older than Python 3.11"

# The service's dynamic user gets this static group as a supplementary group: it opens
# /etc/depositd (mode 0750) to the service only, since payer profiles are personal data.
GROUP=depositd-config
VENV=$ROOT$PREFIX/venv
SHARE=$ROOT$PREFIX/share
ETC=$ROOT/etc/depositd
UNIT_DIR=$ROOT/etc/systemd/system

BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT

# Copy SRC to DEST unless DEST exists: a merchant's edits always win.
install_new() {
    local src=$1 dest=$2
    if [[ ! -e $dest ]]; then
        install -m 0644 "$src" "$dest"
        log "installed $dest"
    elif ! cmp -s "$src" "$dest"; then
        log "kept $dest (the shipped version is $src)"
    fi
}

# 1. The virtualenv and the package. Built from a copy, so the source tree gets no build/ or
#    *.egg-info and a read-only checkout works.
mkdir -p "$ROOT$PREFIX"
if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    venv_args=()
    if [[ $SYSTEM_SITE == 1 ]]; then venv_args+=(--system-site-packages); fi
    "$PYTHON" -m venv --clear "${venv_args[@]}" "$VENV"
    log "created virtualenv $VENV"
fi
(
    cd "$SRC"
    files=(pyproject.toml worker)
    for extra in README.md LICENSE; do
        if [[ -e $extra ]]; then files+=("$extra"); fi
    done
    tar --exclude=__pycache__ --exclude='*.pyc' -cf - "${files[@]}"
) | tar -C "$BUILD" -xf -
# The dependencies exactly as tested: every one pinned with its hashes in requirements/runtime.txt
# (pip refuses any other version, file or package), wheels only; then the package itself,
# built with the locked setuptools and no download.
LOCK=$SRC/requirements/runtime.txt
[[ -f $LOCK ]] || die "missing $LOCK"
# shellcheck disable=SC2086 # PIP_ARGS is a list of arguments on purpose
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes \
    --only-binary :all: ${ROOT:+--no-compile} $PIP_ARGS -r "$LOCK"
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation ${ROOT:+--no-compile} $PIP_ARGS "$BUILD"
version=$("$VENV/bin/depositd" --version) # also proves the installed program starts
log "installed $version into ${VENV#"$ROOT"}${ROOT:+ (staged under $ROOT)}"

# 2. Shipped files under the prefix, replaced on every run: documentation (the unit's
#    Documentation= points here), the example config and the default rules to compare with.
rm -rf "$SHARE.new"
install -d -m 0755 "$SHARE.new/doc" "$SHARE.new/rules"
install -m 0644 "$SRC/deploy/README.md" "$SHARE.new/doc/deploy.md"
if [[ -f $SRC/README.md ]]; then install -m 0644 "$SRC/README.md" "$SHARE.new/doc/README.md"; fi
install -m 0644 "$SRC/deploy/depositd.example.yaml" "$SHARE.new/depositd.example.yaml"
if [[ -d $SRC/rules ]]; then cp -R "$SRC/rules/." "$SHARE.new/rules/"; fi
find "$SHARE.new" -name __pycache__ -prune -exec rm -rf {} +
# The JSON Schemas of the installed version, for editors: every shipped YAML file's
# `# yaml-language-server: $schema=` line names its schema here instead of in the source tree.
install -d -m 0755 "$SHARE.new/schemas"
# One process for the three (`depositd schema KIND` prints one).
"$VENV/bin/python" - "$SHARE.new/schemas" <<'PY'
import pathlib, sys
from worker.commands.schema import KINDS, text_of
for kind in KINDS:
    (pathlib.Path(sys.argv[1]) / f"{kind}.schema.json").write_text(text_of(kind), encoding="utf-8")
PY
find "$SHARE.new" -name '*.yaml' -exec sed -i -E \
    "s#^(\# yaml-language-server: [$]schema=).*/([a-z]+[.]schema[.]json)\$#\1$PREFIX/share/schemas/\2#" {} +
# The group and the modes of /etc/depositd, for systemd-sysusers and systemd-tmpfiles, which
# depositd-setup.service runs on the target before the first start: a staged tree (--root) has
# no /etc/group to add to, and its owners are the build's. Kept here, not in /etc/sysusers.d or
# /etc/tmpfiles.d, so that nothing acts on them at boot before that unit runs.
cat >"$SHARE.new/sysusers.conf" <<SYSUSERS
# The group that opens /etc/depositd to depositd.service (SupplementaryGroups=).
g $GROUP -
SYSUSERS
cat >"$SHARE.new/tmpfiles.conf" <<TMPFILES
# /etc/depositd: root and the service only (payer profiles are personal data).
d /etc/depositd 0750 root $GROUP -
d /etc/depositd/credentials 0700 root root -
TMPFILES
chmod 0644 "$SHARE.new/sysusers.conf" "$SHARE.new/tmpfiles.conf"
rm -rf "$SHARE"
mv "$SHARE.new" "$SHARE"

# 2b. A staged tree runs where it lands, not where it was built: pip and venv write the path
#     they install to into every script's #! line, pyvenv.cfg and the activate scripts, and
#     byte code names its source files by it. Rewritten to the final path (the interpreter is
#     found relative to the script, so the staged copy keeps working for the steps below).
if [[ -n $ROOT ]]; then
    staged=$ROOT$PREFIX
    sed_staged=$(printf '%s' "$staged" | sed 's/[#\\&.*^$[]/\\&/g')
    { grep -rlIF -e "$staged" "$VENV/bin" "$VENV/pyvenv.cfg" || true; } | while IFS= read -r file; do
        sed -i "s#$sed_staged#$PREFIX#g" "$file"
    done
    find "$VENV" -name __pycache__ -prune -exec rm -rf {} +
    PYTHONDONTWRITEBYTECODE=1 "$VENV/bin/python" -m compileall -q -j 0 -s "$ROOT" -p / \
        "$VENV/lib" >/dev/null
    log "rewrote the staged virtualenv for $PREFIX/venv"
fi

# 3. Configuration, rules and profiles, installed only where missing. Secrets are credentials
#    (root only; systemd hands them over) or environment variables.
if [[ -z $ROOT ]] && ! getent group "$GROUP" >/dev/null; then
    groupadd --system "$GROUP"
    log "created group $GROUP"
fi
install -d -m 0750 "$ETC"
if [[ -z $ROOT ]]; then chgrp "$GROUP" "$ETC"; fi
# The shipped rule sets go in on the first install only: a rule set the merchant removed must
# not come back (and act) with the next upgrade. The current ones are always in $SHARE/rules.
first_install=0
if [[ ! -d $ETC/rules ]]; then first_install=1; fi
install -d -m 0755 "$ETC/rules"
install -d -m 0700 "$ETC/credentials"
# The operator console's login token: random, created once, never printed (cat it as root).
# Never in a staged tree: every host built from it would share one token. There
# depositd-setup.service makes it on the target before the first start.
if [[ -z $ROOT && ! -s $ETC/credentials/console_token ]]; then
    (
        umask 077
        head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$ETC/credentials/console_token"
    )
    log "created $ETC/credentials/console_token (the console's login token)"
fi
install_new "$SHARE/depositd.example.yaml" "$ETC/depositd.yaml"
if [[ ! -e $ETC/depositd.env ]]; then
    (
        umask 077
        cat >"$ETC/depositd.env" <<'ENV'
# Environment of depositd.service, for ${VAR} in depositd.yaml (read by systemd as root).
#PROVIDER_API_KEY=
#SMTP_USER=
ENV
    )
    log "installed $ETC/depositd.env"
fi
shopt -s nullglob
for file in "$SHARE"/rules/*.yaml; do  # the loader reads *.yaml only
    name=$(basename "$file")
    # The demo's profiles (fictitious payers) are never installed; examples are for reference
    # only, outside the rules folder, so that they never act.
    case $name in
        profiles.yaml) ;;
        *example*)
            install -d -m 0755 "$ETC/examples"
            install_new "$file" "$ETC/examples/$name"
            ;;
        *) if [[ $first_install == 1 ]]; then install_new "$file" "$ETC/rules/$name"; fi ;;
    esac
done
if [[ ! -e $ETC/profiles.yaml ]]; then
    {
        printf '# yaml-language-server: $schema=%s/share/schemas/profiles.schema.json\n' "$PREFIX"
        cat <<'PROFILES'
# Payer profiles: none yet, so submit_profile finds none and alerts instead.
# See examples/profiles.example.yaml; `depositd check` validates this file.
profiles: {}
PROFILES
    } >"$ETC/profiles.yaml"
    chmod 0644 "$ETC/profiles.yaml"
    log "installed $ETC/profiles.yaml"
fi
for file in "$SHARE"/rules/examples/*; do
    if [[ -f $file ]]; then
        install -d -m 0755 "$ETC/examples"
        install_new "$file" "$ETC/examples/$(basename "$file")"
    fi
done
shopt -u nullglob

# 3b. depositctl: other depositd commands run as the service's dynamic user (User=depositd names
#     the same one), with its credentials and environment, so that no SQLite file ends up owned
#     by root. Replaced on every run.
install -d -m 0755 "$ROOT$PREFIX/bin"
cat >"$BUILD/depositctl" <<CTL
#!/bin/sh
# Run a depositd command the way depositd.service runs: depositctl ledger --json
# It loads the credentials depositd.service loads (the unit and its drop-ins, as
# "systemctl cat" shows them), no more and no fewer, so that "depositctl check" passes only when
# the service can start with the same files.
set -eu
unit=\$(systemctl cat depositd.service) || {
    echo "depositctl: depositd.service is not installed (run install.sh)" >&2
    exit 2
}
# The command sees neither /home nor /root, and has a /tmp of its own that is gone when it ends:
# refuse such paths rather than fail to read them or write a file nobody will find.
for arg in "\$@"; do
    case \$arg in
    /home/* | /root/* | /tmp/* | /var/tmp/* | *=/home/* | *=/root/* | *=/tmp/* | *=/var/tmp/*)
        echo "depositctl: \$arg: commands run like the service, without /home, /root and the" \\
            "host's /tmp; use a path under /etc/depositd or /var/lib/depositd" >&2
        exit 2
        ;;
    esac
done
set -- $PREFIX/venv/bin/depositd "\$@"
for cred in \$(printf '%s\\n' "\$unit" | awk '
    /^[[:space:]]*LoadCredential=/ {
        value = substr(\$0, index(\$0, "=") + 1)
        if (value == "") n = 0; else list[++n] = value
    }
    END { for (i = 1; i <= n; i++) print list[i] }'); do
    set -- -p "LoadCredential=\$cred" "\$@"
done
# The token is made by depositd-setup.service before the first start; a command run before
# that start needs it as well (a credential whose file is missing stops the command).
if [ ! -e /etc/depositd/credentials/console_token ]; then
    systemctl start depositd-setup.service >/dev/null
fi
# The service's protections that apply to a one-shot command (depositd.service lists them),
# and the state folder's mode: a transient unit's default (0755) would open the database.
exec systemd-run --quiet --pipe --wait --collect \\
    -p DynamicUser=yes -p User=depositd -p SupplementaryGroups=$GROUP \\
    -p StateDirectory=depositd -p StateDirectoryMode=0700 -p UMask=0077 \\
    -p ProtectSystem=strict -p ProtectHome=yes -p PrivateTmp=yes -p PrivateDevices=yes \\
    -p NoNewPrivileges=yes -p CapabilityBoundingSet= -p AmbientCapabilities= \\
    -p "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX" -p RestrictNamespaces=yes \\
    -p RestrictRealtime=yes -p RestrictSUIDSGID=yes -p LockPersonality=yes \\
    -p ProtectKernelTunables=yes -p ProtectKernelModules=yes -p ProtectKernelLogs=yes \\
    -p ProtectControlGroups=yes -p ProtectClock=yes -p ProtectHostname=yes \\
    -p ProtectProc=invisible -p ProcSubset=pid -p PrivateMounts=yes \\
    -p SystemCallArchitectures=native -p SystemCallFilter=@system-service \\
    -p "SystemCallFilter=~@privileged @resources" -p SystemCallErrorNumber=EPERM \\
    -p EnvironmentFile=-/etc/depositd/depositd.env \\
    -E DEPOSITD_CONFIG=/etc/depositd/depositd.yaml "\$@"
CTL
install -m 0755 "$BUILD/depositctl" "$ROOT$PREFIX/bin/depositctl"

# 4. The units, rewritten for the prefix. Replaced on every run: local changes belong in
#    drop-ins (systemctl edit depositd). The backup timer is installed, not enabled.
install -d -m 0755 "$UNIT_DIR"
for unit in depositd.service depositd.socket depositd-setup.service depositd-backup.service \
    depositd-backup.timer; do
    sed "s#/opt/depositd/#$PREFIX/#g" "$SRC/deploy/$unit" >"$BUILD/$unit"
    install -m 0644 "$BUILD/$unit" "$UNIT_DIR/$unit"
    log "installed $UNIT_DIR/$unit"
done
# Nothing staged may name the staging directory: checked, not assumed.
if [[ -n $ROOT ]]; then
    leaked=$(grep -rlF -e "$ROOT$PREFIX" -e "$ROOT/etc" "$ROOT$PREFIX" "$ETC" "$UNIT_DIR" |
        head -5 || true)
    [[ -z $leaked ]] || die "the staged tree names $ROOT, where it was built: $leaked"
fi
if [[ $RUN_SYSTEMCTL == 1 ]]; then
    systemctl daemon-reload
    log "ran systemctl daemon-reload"
fi

# What is left to do. Every credential the installed config reads must exist and be loaded by
# the unit: the provider's and the webhook's by the unit itself, Slack's and SMTP's (optional
# channels) and PostgreSQL's password (storage.url) by a drop-in, since a LoadCredential= whose
# file is missing stops the unit.
missing=()
for name in api_secret webhook_secret; do
    if [[ ! -s $ETC/credentials/$name ]]; then missing+=("$ETC/credentials/$name"); fi
done
unloaded=()
for name in slack_webhook_url smtp_password db_password; do
    grep -Eq "^[^#]*[$][{]CREDENTIALS_DIRECTORY[}]/$name([^A-Za-z0-9_]|$)" "$ETC/depositd.yaml" ||
        continue
    if [[ ! -s $ETC/credentials/$name ]]; then missing+=("$ETC/credentials/$name"); fi
    if ! cat "$UNIT_DIR"/depositd.service.d/*.conf 2>/dev/null |
        grep -Eq "^[[:space:]]*LoadCredential=$name:"; then
        unloaded+=("$name")
    fi
done
step=next:
if [[ -n $ROOT ]]; then
    log "staged under $ROOT: the unit, depositctl and the config name the paths of the final"
    log "      system ($PREFIX, /etc/depositd), so nothing here runs or checks from $ROOT;"
    log "      it holds no console token: depositd-setup.service makes"
    log "      /etc/depositd/credentials/console_token on each host before the first start"
    log "      (with the depositd-config group and the modes of /etc/depositd);"
    log "      copy the tree to / and there, as on any host:"
    step="     "
fi
if [[ ${#missing[@]} -gt 0 ]]; then
    log "$step create ${missing[*]#"$ROOT"} (mode 0600);"
    step="     "
fi
if [[ ${#unloaded[@]} -gt 0 ]]; then
    log "$step depositd.yaml reads ${unloaded[*]}: load each in a drop-in"
    log "      (systemctl edit depositd), or remove that notify channel from the config:"
    log "      [Service]"
    for name in "${unloaded[@]}"; do
        log "      LoadCredential=$name:/etc/depositd/credentials/$name"
    done
    step="     "
fi
if [[ $step == next: ]]; then
    log "next: $PREFIX/bin/depositctl check; systemctl restart depositd (migrations run at start)"
else
    log "      edit /etc/depositd/depositd.yaml and /etc/depositd/depositd.env;"
    log "      $PREFIX/bin/depositctl check; systemctl enable --now depositd"
fi
