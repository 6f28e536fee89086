"""The Debian package under a real systemd: a fresh minimal Debian 12 (tests/support/machine.py).

The package is built inside the container by deploy/build-deb.sh (what `make deb` runs) from
this working tree and the locked wheels, so it is the package for that release; a copy with
the version bumped (repacked with dpkg-deb) is the upgrade. One test walks the package's life
in order: install without credentials (nothing starts), configure and start, upgrade under
steady signed load, remove, purge.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest

from tests.support.installed import Host, assert_nothing_lost, configure, under_load
from tests.support.machine import REPO, Machine, MachineError, missing_requirements, rootfs, wheels

pytestmark = [pytest.mark.timeout(1200), pytest.mark.xdist_group("systemd")]

DIST = "/root/dist"
BUILD = f"/src/deploy/build-deb.sh --out {DIST} --pip-args '--no-index --find-links /wheels'"
APT = "DEBIAN_FRONTEND=noninteractive apt-get -y -q"
STATE = "/var/lib/private/depositd"


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    """A fresh container (nothing of depositd installed)."""
    problems = missing_requirements()
    if problems:
        pytest.fail("tests/deploy cannot run here; missing: " + "; ".join(problems), pytrace=False)
    try:
        tree, wheel_dir = rootfs(), wheels()
        machine = Machine(
            tree, {REPO: "/src", wheel_dir: "/wheels"}, tmp_path_factory.mktemp("m") / "log"
        )
    except MachineError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        machine.run("systemctl is-system-running --wait", timeout=120, check=False)
        yield machine
    finally:
        machine.close()


def test_package_install_upgrade_remove_purge(machine: Machine) -> None:
    figures: dict[str, object] = {}
    started = time.monotonic()
    deb = machine.run(BUILD, timeout=900).stdout.strip().splitlines()[-1]
    figures["build-deb.sh, s"] = round(time.monotonic() - started, 1)
    version = machine.run(f"dpkg-deb -f {deb} Version").stdout.strip()
    # The next version: the same tree, its version bumped.
    bumped = f"{version}+1"
    newer = f"{DIST}/depositd_{bumped}_amd64.deb"
    machine.run(
        f"dpkg-deb -R {deb} /root/next && sed -i 's/^Version: .*/Version: {bumped}/'"
        f" /root/next/DEBIAN/control && dpkg-deb --root-owner-group -Zgzip -b /root/next {newer}"
        " >/dev/null && rm -rf /root/next",
        timeout=300,
    )

    # Install, offline, without credentials: the host is set up, nothing is started or enabled.
    started = time.monotonic()
    out = machine.run(f"{APT} install {deb}", timeout=300).stdout
    figures["apt-get install, s"] = round(time.monotonic() - started, 1)
    assert "not started: it needs its credentials first" in out, out
    for unit in ("depositd.service", "depositd.socket"):
        state = machine.show(unit, "ActiveState", "UnitFileState")
        assert state == {"ActiveState": "inactive", "UnitFileState": "disabled"}, (unit, state)
    modes = machine.run("stat -c '%a %U:%G' /etc/depositd /etc/depositd/credentials").stdout
    assert modes.split("\n")[:2] == ["750 root:depositd-config", "700 root:root"], modes
    assert machine.run("head -1 /opt/depositd/venv/bin/depositd").stdout.startswith(
        "#!/opt/depositd/venv/bin/python"
    )

    # Credentials and configuration in place: it starts (the socket holding the port).
    init, webhook = configure(machine)
    machine.run(
        "systemctl daemon-reload && systemctl enable --now depositd.socket depositd.service",
        timeout=120,
    )
    host = Host(machine, out, init, webhook)
    first = host.wait_for("running", lambda s: s["SubState"] == "running")
    config = machine.path("/etc/depositd/depositd.yaml").read_text()

    # Upgrade under steady signed load: nothing refused or lost, the service restarted.
    upgrade = under_load(host, "upgrade", f"{APT} install {newer}")
    figures["upgrade under 50/s"] = {k: upgrade[k] for k in ("sent", "refused", "longestGapS")}
    print(f"\nupgrade under load: {json.dumps(upgrade)}")
    assert_nothing_lost(upgrade)
    assert machine.run("dpkg-query -W -f '${Version}' depositd").stdout == bumped
    after = host.wait_for("running", lambda s: s["SubState"] == "running")
    assert after["MainPID"] != first["MainPID"], (first, after)
    assert machine.path("/etc/depositd/depositd.yaml").read_text() == config
    # The database is at the schema of the installed version (serve migrates at start).
    wanted = machine.run(
        "/opt/depositd/venv/bin/python -c"
        " 'from worker.store.schema import SCHEMA_VERSION; print(SCHEMA_VERSION)'"
    ).stdout.strip()
    script = (
        f"import sqlite3; db = sqlite3.connect('{STATE}/depositd.db');"
        " print(db.execute(\"select value from meta where key = 'schema_version'\").fetchone()[0])"
    )
    assert machine.run("python3 -", stdin=script).stdout.strip() == wanted

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
    print(f"\npackage figures: {json.dumps(figures)}")
