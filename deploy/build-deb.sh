#!/usr/bin/env bash
# Build the Debian package of depositd (`make deb`): dist/depositd_VERSION_amd64.deb.
#
#   deploy/build-deb.sh [--out DIR] [--version VERSION] [--python PY] [--pip-args "ARGS"]
#                       [--compress xz|gzip]
#
# The tree is what `install.sh --root` stages (the virtualenv at its final path
# /opt/depositd/venv from the hash-locked requirements, depositctl, the units), laid out as a
# package: units in /lib/systemd/system, sysusers and tmpfiles entries in /usr/lib, the files
# of /etc/depositd as conffiles, maintainer scripts from deploy/debian/. Built with dpkg-deb
# alone (no debhelper): the tree is already staged and the scripts are short. The
# virtualenv holds compiled wheels and links to the build host's interpreter, so build on the
# Debian release the package is for (Debian 12: python3.11). See deploy/README.md.
set -euo pipefail

die() {
    echo "build-deb.sh: $*" >&2
    exit 2
}

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$SRC/dist
VERSION=
PYTHON=/usr/bin/python3
PIP_ARGS=
COMPRESS=xz
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --version) VERSION=$2; shift 2 ;;
        --python) PYTHON=$2; shift 2 ;;
        --pip-args) PIP_ARGS=$2; shift 2 ;;
        --compress) COMPRESS=$2; shift 2 ;;
        -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
        *) die "unknown option: $1" ;;
    esac
done
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (Debian's dpkg package)"
if [[ -z $VERSION ]]; then
    VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$SRC/worker/__init__.py")
fi
[[ $VERSION =~ ^[0-9][A-Za-z0-9.+~-]*$ ]] || die "not a Debian version: $VERSION"
ARCH=$(dpkg --print-architecture)
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/root
"$SRC/deploy/install.sh" --root "$ROOT" --python "$PYTHON" --pip-args "$PIP_ARGS" >/dev/null

# The package runs the program, it installs nothing: no pip in its virtualenv. Library files
# are not programs (wheels mark some executable).
"$ROOT/opt/depositd/venv/bin/python" -m pip uninstall --quiet --yes pip >/dev/null
find "$ROOT/opt/depositd/venv/lib" -type f -perm /111 -exec chmod 0644 {} +

# Laid out as a package. The units where packages put them (/etc/systemd/system is the
# administrator's); the group and the modes of /etc/depositd for systemd-sysusers and
# systemd-tmpfiles, which postinst runs (and systemd at boot).
install -d "$ROOT/lib/systemd/system" "$ROOT/usr/lib/sysusers.d" "$ROOT/usr/lib/tmpfiles.d"
mv "$ROOT"/etc/systemd/system/* "$ROOT/lib/systemd/system/"
rm -r "$ROOT/etc/systemd"
install -m 0644 "$ROOT/opt/depositd/share/sysusers.conf" "$ROOT/usr/lib/sysusers.d/depositd.conf"
install -m 0644 "$ROOT/opt/depositd/share/tmpfiles.conf" "$ROOT/usr/lib/tmpfiles.d/depositd.conf"
install -d -m 0755 "$ROOT/usr/share/doc/depositd"
install -m 0644 "$SRC/deploy/debian/copyright" "$ROOT/usr/share/doc/depositd/copyright"
# lintian's findings that hold for a program in a virtualenv of its own, each explained there.
install -d -m 0755 "$ROOT/usr/share/lintian/overrides"
install -m 0644 "$SRC/deploy/debian/lintian-overrides" "$ROOT/usr/share/lintian/overrides/depositd"
{
    echo "depositd ($VERSION) unstable; urgency=medium"
    echo
    echo "  * Built from the depositd source tree; see /opt/depositd/share/doc/."
    echo
    echo " -- depositd maintainers <depositd@example.com>  $(date -R -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}")"
} | gzip -9n >"$ROOT/usr/share/doc/depositd/changelog.gz"
chmod 0644 "$ROOT/usr/share/doc/depositd/changelog.gz"

install -d -m 0755 "$ROOT/DEBIAN"
for script in postinst prerm postrm; do
    install -m 0755 "$SRC/deploy/debian/$script" "$ROOT/DEBIAN/$script"
done
# Every file under /etc is a conffile: dpkg keeps the administrator's edits on upgrades and
# removes them on purge only.
(cd "$ROOT" && find etc -type f | sort | sed 's#^#/#') >"$ROOT/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
cat >"$ROOT/DEBIAN/control" <<CONTROL
Package: depositd
Version: $VERSION
Architecture: $ARCH
Maintainer: depositd maintainers <depositd@example.com>
Installed-Size: $size
Depends: python$PYVER, libc6 (>= 2.34), systemd
Section: net
Priority: optional
Description: webhook receiver and Travel Rule deposit worker
 depositd receives the payment provider's webhooks, tracks deposits, submits
 Travel Rule data and books credited deposits exactly once. This package holds
 the program in its own virtualenv (/opt/depositd/venv), the systemd units
 (depositd.service, depositd.socket, the backup timer) and the configuration
 in /etc/depositd. The service starts once its credentials are in place.
CONTROL

mkdir -p "$OUT"
deb=$OUT/depositd_${VERSION}_$ARCH.deb
dpkg-deb --root-owner-group "-Z$COMPRESS" --build "$ROOT" "$deb" >/dev/null
echo "$deb"
