"""The Debian package under a real systemd: a fresh minimal Debian 12 (tests/support/machine.py).

The package is built inside the container by deploy/build-deb.sh (what `make deb` runs) from
this working tree and the locked wheels, so it is the package for that release. The previous
release is the same script's package of PREVIOUS, a commit whose database schema is older
(taken out of this repository with `git archive` into the test's scratch space), versioned
below this one. One test walks the package's life in order: install the previous release
without credentials (nothing starts), configure and start it, upgrade to this release under
steady signed load (the schema migrated, nothing lost), remove, purge, then install this
release afresh (its own first install: nothing starts without credentials).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.installed import (
    FIGURES,
    PYTHON,
    Host,
    assert_booked_once,
    assert_nothing_lost,
    configure,
    under_load,
)
from tests.support.machine import REPO, Machine, MachineError, missing_requirements, rootfs, wheels
from worker.schedule.leaderjobs import STOP_GRACE_S

pytestmark = [pytest.mark.timeout(1500), pytest.mark.xdist_group("systemd")]

# The newest commit whose SCHEMA_VERSION (worker/store/schema.py) is below this tree's: 12, where
# this tree has 13 (`git log -p worker/store/schema.py`: MIGRATIONS grew by
# _migrate_submissions_unpurged after it). Its deploy/ is this tree's but for the example
# configuration, which gained the retention block.
PREVIOUS = "4d355f7b49550013568a4cdb0bcf2145379b9a71"
DIST = "/root/dist"
WHEELS = "--pip-args '--no-index --find-links /wheels'"
BUILD = f"/src/deploy/build-deb.sh --out {DIST} {WHEELS}"
APT = "DEBIAN_FRONTEND=noninteractive apt-get -y -q"
# An unattended upgrade keeps the administrator's configuration without asking: the previous
# release shipped another depositd.yaml, and /etc/depositd/depositd.yaml was edited.
KEEP_CONFFILES = "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
STATE = "/var/lib/private/depositd"
# The sandbox (the provider) runs from a copy of the first virtualenv: an upgrade of depositd
# leaves the provider as it was.
PROVIDER = "/root/provider-venv"
SCHEMA = f"{PYTHON} -c 'from worker.store.schema import SCHEMA_VERSION; print(SCHEMA_VERSION)'"
STORED_SCHEMA = (
    f"import sqlite3; db = sqlite3.connect('{STATE}/depositd.db');"
    " print(db.execute(\"select value from meta where key = 'schema_version'\").fetchone()[0])"
)


def previous_tree(into: Path) -> Path:
    """PREVIOUS's files, from this repository's history (its working tree untouched)."""
    tree = into / "previous"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", PREVIOUS],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if archive.returncode != 0:
        raise MachineError(
            f"commit {PREVIOUS} (the previous schema's release) is not in {REPO}: a full clone"
            f" holds it (git fetch --unshallow). git: {archive.stderr.decode()[-500:]}"
        )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=120)
    return tree


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    """A fresh container (nothing of depositd installed), PREVIOUS's tree at /previous."""
    problems = missing_requirements()
    if problems:
        pytest.fail("tests/deploy cannot run here; missing: " + "; ".join(problems), pytrace=False)
    scratch = tmp_path_factory.mktemp("m")
    try:
        tree, wheel_dir = rootfs(), wheels()
        previous = previous_tree(scratch)
        machine = Machine(
            tree, {REPO: "/src", previous: "/previous", wheel_dir: "/wheels"}, scratch / "log"
        )
    except MachineError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        machine.run("systemctl is-system-running --wait", timeout=120, check=False)
        yield machine
    finally:
        machine.close()


def stored_schema(machine: Machine) -> int:
    """The schema_version the database records."""
    return int(machine.run("python3 -", stdin=STORED_SCHEMA).stdout)


def assert_installed_not_started(machine: Machine, out: str) -> None:
    """A first install without credentials (apt-get's output `out`): the host is set up (the
    group, the modes of /etc/depositd, the programs at their final paths), nothing is started
    or enabled, and the output says why."""
    assert "not started: it needs its credentials first" in out, out
    for unit in ("depositd.service", "depositd.socket"):
        state = machine.show(unit, "ActiveState", "UnitFileState")
        assert state == {"ActiveState": "inactive", "UnitFileState": "disabled"}, (unit, state)
    modes = machine.run("stat -c '%a %U:%G' /etc/depositd /etc/depositd/credentials").stdout
    assert modes.split("\n")[:2] == ["750 root:depositd-config", "700 root:root"], modes
    assert machine.run("head -1 /opt/depositd/venv/bin/depositd").stdout.startswith(
        "#!/opt/depositd/venv/bin/python"
    )


def test_package_install_upgrade_remove_purge(machine: Machine) -> None:
    figures: dict[str, object] = {}
    started = time.monotonic()
    deb = machine.run(BUILD, timeout=900).stdout.strip().splitlines()[-1]
    figures["build-deb.sh, s"] = round(time.monotonic() - started, 1)
    version = machine.run(f"dpkg-deb -f {deb} Version").stdout.strip()
    # The previous release: PREVIOUS's own version, marked as coming before it (~), so that
    # apt takes this tree's package for an upgrade of it.
    source = machine.path("/previous/worker/__init__.py").read_text()
    match = re.search(r'^__version__ = "(.*)"$', source, re.M)
    assert match is not None, source
    old_version = f"{match[1]}~git{PREVIOUS[:7]}"
    machine.run(f"dpkg --compare-versions {old_version} lt {version}")
    old = machine.run(
        f"/previous/deploy/build-deb.sh --out /root/dist-previous --version {old_version} {WHEELS}",
        timeout=900,
    ).stdout.strip()
    old = old.splitlines()[-1]

    # Install, offline, without credentials: the host is set up, nothing is started or enabled.
    out = machine.run(f"{APT} install {old}", timeout=300).stdout
    assert_installed_not_started(machine, out)
    old_schema = int(machine.run(SCHEMA).stdout)

    # Credentials and configuration in place: it starts (the socket holding the port).
    machine.run(f"cp -a /opt/depositd/venv {PROVIDER}")
    init, webhook = configure(machine, provider=f"{PROVIDER}/bin/python -m worker")
    machine.run(
        "systemctl daemon-reload && systemctl enable --now depositd.socket depositd.service",
        timeout=120,
    )
    host = Host(machine, out, init, webhook)
    first = host.wait_for("running", lambda s: s["SubState"] == "running")
    config = machine.path("/etc/depositd/depositd.yaml").read_text()
    assert stored_schema(machine) == old_schema

    # Upgrade under steady signed load: nothing refused or lost, the service restarted on the
    # new release, deposits injected before, during and after booked once.
    upgrade = under_load(
        host, "upgrade", f"{APT} {KEEP_CONFFILES} install {deb}", ("51.10", "51.20", "51.30")
    )
    figures["upgrade under 50/s"] = {k: upgrade[k] for k in FIGURES if k in upgrade}
    print(f"\nupgrade under load: {json.dumps(upgrade)}")
    assert_nothing_lost(upgrade)
    assert machine.run("dpkg-query -W -f '${Version}' depositd").stdout == version
    after = host.wait_for("running", lambda s: s["SubState"] == "running")
    assert after["MainPID"] != first["MainPID"], (first, after)
    assert machine.path("/etc/depositd/depositd.yaml").read_text() == config
    # The database went from the previous release's schema to this one's (serve migrates at
    # start).
    new_schema = int(machine.run(SCHEMA).stdout)
    assert old_schema < new_schema, (old_schema, new_schema)
    assert stored_schema(machine) == new_schema
    figures["schema_version"] = f"{old_schema} -> {new_schema}"
    assert_booked_once(host, [upgrade])

    # The next upgrade, from this release (this tree's package with its version bumped): the
    # previous release's stop could wait its 5 s grace for a poll; this one's does not, so the
    # longest time without an answer is this release's stop and start.
    bumped = f"{version}+1"
    newer = f"{DIST}/depositd_{bumped}_amd64.deb"
    machine.run(
        f"dpkg-deb -R {deb} /root/next && sed -i 's/^Version: .*/Version: {bumped}/'"
        f" /root/next/DEBIAN/control && dpkg-deb --root-owner-group -Zgzip -b /root/next {newer}"
        " >/dev/null && rm -rf /root/next",
        timeout=300,
    )
    again = under_load(
        host,
        "upgrade-again",
        f"{APT} {KEEP_CONFFILES} install {newer}",
        ("52.10", "52.20", "52.30"),
    )
    figures["upgrade from this release under 50/s"] = {k: again[k] for k in FIGURES if k in again}
    print(f"\nupgrade from this release under load: {json.dumps(again)}")
    assert_nothing_lost(again)
    assert machine.run("dpkg-query -W -f '${Version}' depositd").stdout == bumped
    assert again["stopS"] < STOP_GRACE_S, again
    assert again["longestGapS"] < 5, again
    assert_booked_once(host, [upgrade, again])

    # remove: stopped, the program gone, configuration, credentials and data kept.
    machine.run(f"{APT} remove depositd", timeout=300)
    assert machine.show("depositd.service", "ActiveState")["ActiveState"] == "inactive"
    assert machine.run("test -e /opt/depositd/venv/bin/depositd || echo gone").stdout == "gone\n"
    assert machine.path("/etc/depositd/depositd.yaml").read_text() == config
    for kept in ("/etc/depositd/credentials/webhook_secret", f"{STATE}/depositd.db"):
        assert machine.path(kept).exists(), kept

    # purge: the configuration goes, the database stays and purge says where.
    out = machine.run(f"{APT} purge depositd", timeout=300).stdout
    assert not machine.path("/etc/depositd").exists()
    assert machine.path(f"{STATE}/depositd.db").exists()
    assert re.search(r"database and its backups stay in /var/lib/private/depositd", out), out

    # This release's own first install (its maintainer scripts, not the previous release's).
    started = time.monotonic()
    out = machine.run(f"{APT} install {deb}", timeout=300).stdout
    figures["apt-get install, s"] = round(time.monotonic() - started, 1)
    assert_installed_not_started(machine, out)
    print(f"\npackage figures: {json.dumps(figures)}")
