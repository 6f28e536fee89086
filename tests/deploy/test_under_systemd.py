"""depositd under a real systemd: a minimal Debian 12 booted with systemd 252 as PID 1.

Installed by deploy/install.sh from this working tree as the deploy guide (docs: deploy/README.md)
says, staged (`--root`) and copied to / as an image build does, configured against the
sandbox, started with `systemctl enable --now` (depositd.socket holding the port), and checked
through systemctl and journalctl inside. One container for the module (tests/support/machine.py):
it boots once, and every test leaves the service running. A drop-in shortens the watchdog
(WatchdogSec=6) and the restart delay so that the watchdog tests take seconds.

Figures (time to READY, watchdog kill, stop, security score) are printed, not asserted: run with
`-s` to see them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.installed import (
    DEPOSITCTL,
    DEPOSITD,
    FIGURES,
    LOAD_RATE,
    PYTHON,
    SANDBOX,
    STATE,
    WATCHDOG_S,
    Host,
    assert_booked_once,
    assert_nothing_lost,
    configure,
    under_load,
)
from tests.support.machine import REPO, Machine, MachineError, missing_requirements, rootfs, wheels
from worker.schedule.leaderjobs import STOP_GRACE_S

pytestmark = [pytest.mark.timeout(1500), pytest.mark.xdist_group("systemd")]

INSTALL = "/src/deploy/install.sh --pip-args '--no-index --find-links /wheels'"
STAGE = "/var/tmp/depositd-staged"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """Build (or reuse) the root filesystem and the wheels, boot, install, configure, start."""
    problems = missing_requirements()
    if problems:
        pytest.fail("tests/deploy cannot run here; missing: " + "; ".join(problems), pytrace=False)
    try:
        tree, wheel_dir = rootfs(), wheels()
    except MachineError as exc:
        pytest.fail(str(exc), pytrace=False)
    log = tmp_path_factory.mktemp("machine") / "console.log"
    try:
        machine = Machine(tree, {REPO: "/src", wheel_dir: "/wheels"}, log)
    except MachineError as exc:
        pytest.fail(f"the container did not boot: {exc}", pytrace=False)
    figures: dict[str, Any] = {}
    try:
        state = machine.run("systemctl is-system-running --wait", timeout=120, check=False)
        if state.stdout.strip() not in ("running", "degraded"):
            pytest.fail(
                f"systemd did not come up: {state.stdout}{state.stderr}{machine.tail()}",
                pytrace=False,
            )
        # Staged as a package or an image build stages it, copied to / and the staging
        # directory removed: what runs from here on is that copy.
        install = machine.run(f"{INSTALL} --root {STAGE}", timeout=600).stdout
        machine.run(f"cp -a {STAGE}/. / && rm -rf {STAGE}")
        init, webhook = configure(machine)
        machine.run("systemctl daemon-reload && systemctl enable --now depositd.socket")
        started = time.monotonic()
        machine.run("systemctl enable --now depositd", timeout=120)
        figures["enable --now returned, s"] = time.monotonic() - started
        yield Host(machine, install, init, webhook, figures)
    finally:
        print(f"\nfigures under systemd: {json.dumps(figures, indent=1)}")
        machine.close()


def test_environment_is_a_minimal_debian_with_systemd_252(host: Host) -> None:
    """The container runs systemd 252 as PID 1, without procps (no /bin/kill)."""
    assert host.run("cat /proc/1/comm").strip() == "systemd"
    assert host.run("systemctl --version").split()[1] == "252"
    assert host.run("test -e /bin/kill || echo absent").strip() == "absent"


def test_first_start_sets_up_the_host(host: Host) -> None:
    """On a staged install copied to / (no console token, no group, /etc/depositd root:root),
    the first `systemctl enable --now` makes the token (64 hex digits, root only), the
    depositd-config group, and /etc/depositd root:depositd-config 0750 (issue 28)."""
    token = host.run("cat /etc/depositd/credentials/console_token")
    assert re.fullmatch(r"[0-9a-f]{64}", token), token
    mode = host.run("stat -c '%a %U:%G' /etc/depositd/credentials/console_token /etc/depositd")
    assert mode.split("\n")[:2] == ["600 root:root", "750 root:depositd-config"]
    assert host.run("getent group depositd-config").startswith("depositd-config:")
    # It ran once: the token stays on a restart.
    host.run("systemctl restart depositd", timeout=90)
    assert host.run("cat /etc/depositd/credentials/console_token") == token


def test_start_reaches_ready_with_a_status_line(host: Host) -> None:
    """`systemctl enable --now` returns once READY=1 (the rules, profiles and store checked,
    the socket holding deliveries until it serves): the unit is active (running) with two
    processes (serve and the ingress process), credentials loaded, and a STATUS= line from the
    first start on (item 7), saying it serves once it does."""
    state = host.ensure_running()
    assert state["SubState"] == "running"
    assert state["StatusText"] == f"serving on {host.webhook}", state
    procs = service_pids(host)
    assert len(procs) == 2, procs
    times = host.machine.show(
        "depositd", "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic"
    )
    ready = int(times["ActiveEnterTimestampMonotonic"]) - int(
        times["ExecMainStartTimestampMonotonic"]
    )
    host.figures["exec to READY, s"] = ready / 1e6
    print(f"\nexec to READY: {ready / 1e6:.2f} s")
    # Its parts and the floor in the same place: a fresh interpreter's imports (best of 3).
    for name, code in (
        ("import aiohttp, pydantic", "import aiohttp, pydantic"),
        ("imports of serve", "import worker.service.serve"),
        ("imports of the ingress process", "import worker.ingest.process"),
    ):
        script = (
            "import subprocess, sys, time\nbest = 1e9\nfor _ in range(3):\n"
            "    t = time.monotonic()\n"
            f"    subprocess.run([{PYTHON!r}, '-c', {code!r}], check=True)\n"
            "    best = min(best, time.monotonic() - t)\nprint(best)\n"
        )
        host.figures[f"{name}, s"] = float(host.machine.run("python3 -", stdin=script).stdout)
    host.figures["READY / import aiohttp, pydantic"] = (
        ready / 1e6 / host.figures["import aiohttp, pydantic, s"]
    )
    health = host.run(
        f"python3 -c \"import urllib.request as u; print(u.urlopen('http://{host.webhook}/healthz').status)\""
    )
    assert health.strip() == "200"


def test_reload_good_and_refused(host: Host) -> None:
    """`systemctl reload` works without procps (item 1): good rules give a reloaded STATUS;
    a broken rule file is refused, the service keeps running with the same main PID and
    STATUS says so; fixed, it reloads again."""
    pid = host.ensure_running()["MainPID"]
    host.run("systemctl reload depositd")
    host.wait_for(
        "reloaded", lambda s: "reloaded" in s["StatusText"] and s["SubState"] == "running"
    )
    broken = host.machine.path("/etc/depositd/rules/zz-broken.yaml")
    broken.write_text("rulesets: [unclosed\n")
    try:
        host.run("systemctl reload depositd")
        state = host.wait_for("reload refused", lambda s: "refused" in s["StatusText"])
        assert (state["ActiveState"], state["MainPID"]) == ("active", pid), state
    finally:
        broken.unlink()
    host.run("systemctl reload depositd")
    state = host.wait_for("reloaded again", lambda s: "reloaded" in s["StatusText"])
    assert state["MainPID"] == pid
    failed = host.journal("-u depositd -o cat --since=-2min")
    assert "Failed to locate executable" not in failed


def test_a_sandbox_deposit_is_booked(host: Host) -> None:
    """A deposit injected into the sandbox (wallet 1002, whose unknown payers get the
    fictitious profile) is submitted, reviewed, credited and booked: `depositctl ledger`."""
    host.ensure_running()
    host.machine.wait_until(
        "sandbox inject",
        f"{DEPOSITD} sandbox inject --config {SANDBOX} --amount 125.50 --wallet 1002",
        within_s=30,
        every_s=1,
    )
    out = host.machine.wait_until(
        "deposit booked",
        f"{DEPOSITCTL} ledger --json | grep '\"125.5'",
        within_s=120,
        every_s=2,
    )
    entry = json.loads(out.splitlines()[0])
    assert entry["walletId"] == 1002, entry


def since(journal: str, marker: str, start: float) -> float:
    """Seconds from `start` (this host's CLOCK_MONOTONIC, which the container shares) to the
    first line of a short-monotonic `journal` holding `marker`."""
    for line in journal.splitlines():
        if marker in line and (m := re.match(r"\[\s*([\d.]+)\]", line)):
            return float(m[1]) - start
    raise AssertionError(f"{marker!r} not in {journal}")


def cursor(host: Host) -> str:
    """The journal's current end, for --after-cursor."""
    return host.run("journalctl -n0 --show-cursor -q | tail -1").split("cursor: ")[-1].strip()


def service_pids(host: Host) -> list[str]:
    """The processes of depositd.service (its cgroup, legacy or unified hierarchy)."""
    return host.run(
        "cat /sys/fs/cgroup/systemd/system.slice/depositd.service/cgroup.procs"
        " 2>/dev/null || cat /sys/fs/cgroup/system.slice/depositd.service/cgroup.procs"
    ).split()


def test_watchdog_kills_and_restarts_a_hung_main_loop(host: Host) -> None:
    """SIGSTOP on the main process: the pings stop, systemd's watchdog kills it (Watchdog
    timeout) and Restart= brings it back with a new main PID."""
    state = host.ensure_running()
    pid, restarts = state["MainPID"], int(state["NRestarts"])
    mark = cursor(host)
    stopped = time.monotonic()
    host.run(f"kill -STOP {pid}")
    state = host.wait_for(
        "restart after the watchdog",
        lambda s: int(s["NRestarts"]) > restarts and s["SubState"] == "running",
        within_s=WATCHDOG_S * 4 + 30,
    )
    host.figures["main loop stopped to running again, s"] = time.monotonic() - stopped
    assert state["MainPID"] != pid
    journal = host.journal(f"-u depositd -o short-monotonic --after-cursor='{mark}'")
    # Killed by the watchdog for missed pings (a WATCHDOG=trigger would log "Watchdog request").
    assert "Failed with result 'watchdog'" in journal, journal
    assert "Watchdog request" not in journal, journal
    killed = since(journal, "with signal SIGABRT", stopped)
    host.figures["main loop SIGSTOP to watchdog kill, s"] = killed
    # The last ping came before the stop: killed within WatchdogSec (2 s for a busy host).
    assert killed <= WATCHDOG_S + 2, journal


def test_watchdog_acts_at_once_on_a_hung_ingress_process(host: Host) -> None:
    """SIGSTOP on the ingress process: serve notices within half the watchdog interval and sends
    WATCHDOG=trigger, so systemd kills and restarts the service ("Watchdog request"), within
    WatchdogSec of the hang instead of up to twice that (item 6)."""
    state = host.ensure_running()
    pid, restarts = state["MainPID"], int(state["NRestarts"])
    children = [p for p in service_pids(host) if p != pid]
    assert len(children) == 1, children
    mark = cursor(host)
    stopped = time.monotonic()
    host.run(f"kill -STOP {children[0]}")
    state = host.wait_for(
        "restart after the watchdog request",
        lambda s: int(s["NRestarts"]) > restarts and s["SubState"] == "running",
        within_s=WATCHDOG_S * 4 + 30,
    )
    host.figures["ingress stopped to running again, s"] = time.monotonic() - stopped
    assert state["MainPID"] != pid
    journal = host.journal(f"-u depositd -o short-monotonic --after-cursor='{mark}'")
    assert "Failed with result 'watchdog'" in journal, journal
    assert "Watchdog request" in journal, journal
    killed = since(journal, "Watchdog request", stopped)
    host.figures["ingress SIGSTOP to watchdog kill, s"] = killed
    # Within WatchdogSec of the hang, as the deploy guide says (2 s for a busy host); without
    # the trigger it took up to twice that.
    assert killed <= WATCHDOG_S + 2, journal


def test_clean_stop_exits_0(host: Host) -> None:
    """`systemctl stop`: SIGTERM, a drained stop with exit status 0, no warning from depositd.
    The socket is stopped first: while it listens, a delivery (the sandbox's) would start the
    service again."""
    host.ensure_running()
    mark = cursor(host)
    started = time.monotonic()
    host.run("systemctl stop depositd.socket depositd", timeout=60)
    host.figures["systemctl stop, s"] = time.monotonic() - started
    state = host.machine.show("depositd", "ActiveState", "Result", "ExecMainStatus")
    assert state == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}
    warnings = host.journal(f"-t depositd -p warning -o cat --after-cursor='{mark}'")
    assert warnings.strip() == "", warnings
    host.ensure_running()


def test_security_score_live(host: Host) -> None:
    """`systemd-analyze security depositd` on the running system rates it 1.3 or better."""
    host.ensure_running()
    out = host.run("systemd-analyze security --no-pager depositd", check=False)
    match = re.search(r"Overall exposure level for depositd.service: (\d+\.\d)", out)
    assert match is not None, out
    host.figures["systemd-analyze security"] = float(match[1])
    assert float(match[1]) <= 1.3


def test_depositctl_keeps_the_state_directory_private(host: Host) -> None:
    """After a depositctl call the state directory is still 0700 (item 3)."""
    host.ensure_running()
    host.run(f"{DEPOSITCTL} status", timeout=60)
    assert host.run(f"stat -c %a {STATE}").strip() == "700"


def test_depositctl_cannot_read_home(host: Host) -> None:
    """depositctl's command cannot read a world-readable file under /home, as the service
    cannot (item 4): a configuration in /etc/depositd naming profiles under /home fails
    `check`, the same profiles in /etc/depositd pass; a /home path given on the command line
    is refused at once, naming the folders to use."""
    host.run(
        "mkdir -p /home/alice && cp /etc/depositd/profiles.yaml /home/alice/profiles.yaml"
        " && chmod 0755 /home/alice && chmod 0644 /home/alice/profiles.yaml"
    )
    config = json.loads(host.machine.path("/etc/depositd/depositd.yaml").read_text())
    config["profiles"] = "/home/alice/profiles.yaml"
    home = host.machine.path("/etc/depositd/home.yaml")
    home.write_text(json.dumps(config))
    try:
        proc = host.machine.run(f"{DEPOSITCTL} --config /etc/depositd/home.yaml check", check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "/home/alice/profiles.yaml" in proc.stdout + proc.stderr
    finally:
        home.unlink()
    assert host.run(f"{DEPOSITCTL} check").startswith("ok:")
    proc = host.machine.run(f"{DEPOSITCTL} --config /home/alice/x.yaml check", check=False)
    assert proc.returncode == 2
    assert "use a path under /etc/depositd or /var/lib/depositd" in proc.stderr


def test_journal_priorities_follow_levels(host: Host) -> None:
    """depositd's lines are stored with the priority of their level (item 5):
    `journalctl -p err` shows the error lines of a refused reload, and MESSAGE is the same
    JSON object."""
    host.ensure_running()
    mark = cursor(host)
    broken = host.machine.path("/etc/depositd/rules/zz-broken.yaml")
    broken.write_text("rulesets: [unclosed\n")
    try:
        host.run("systemctl reload depositd")
        host.wait_for("reload refused", lambda s: "refused" in s["StatusText"])
    finally:
        broken.unlink()
    host.run("systemctl reload depositd")
    host.wait_for("reloaded", lambda s: "reloaded" in s["StatusText"])
    errors = host.journal(f"-t depositd -p err -o cat --after-cursor='{mark}'")
    lines = [json.loads(line) for line in errors.splitlines()]
    assert lines and {line["level"] for line in lines} == {"error"}, errors
    records = [
        json.loads(line)
        for line in host.journal(f"-t depositd -o json --after-cursor='{mark}'").splitlines()
    ]
    priorities = {json.loads(r["MESSAGE"])["level"]: r["PRIORITY"] for r in records}
    assert priorities.get("error") == "3" and priorities.get("info") == "6", priorities


def test_deploy_guide_log_and_selftest_commands(host: Host) -> None:
    """The deploy guide's commands work as written (item 6): the jq filter over
    `journalctl -t depositd -o cat`, and `depositctl selftest` (the dynamic user cannot be
    reached with sudo -u)."""
    host.ensure_running()
    host.run(
        "journalctl -u depositd -t depositd -o cat --no-pager"
        " | jq -R -c 'fromjson? | select(.level == \"error\")'"
    )
    url = f"http://{host.webhook}/webhooks/provider"
    out = host.run(f"{DEPOSITCTL} selftest --url {url}", timeout=90)
    assert out, out


def test_backup_timer_runs_depositctl_backup(host: Host) -> None:
    """depositd-backup.service (run by depositd-backup.timer) writes a consistent copy owned by
    the service's user, mode 0600; the timer can be enabled and is listed."""
    host.ensure_running()
    host.run("systemctl start depositd-backup.service", timeout=120)
    files = host.run(f"ls {STATE}/backups").split()
    assert len(files) == 1 and re.fullmatch(r"depositd-\d{8}T\d{6}Z\.db", files[0]), files
    copy = f"{STATE}/backups/{files[0]}"
    assert host.run(f"stat -c %a {copy}").strip() == "600"
    script = (
        f"import sqlite3; db = sqlite3.connect('{copy}');"
        " print(db.execute('pragma integrity_check').fetchone()[0])"
    )
    check = host.run(f'python3 -c "{script}"')
    assert check.strip() == "ok"
    host.run("systemctl enable --now depositd-backup.timer")
    assert "depositd-backup.timer" in host.run("systemctl list-timers --no-pager")
    assert host.run(f"stat -c %a {STATE}").strip() == "700"


def test_install_in_an_image_build_skips_daemon_reload(host: Host) -> None:
    """install.sh where systemctl is installed but systemd does not run (an image build, here
    a mount namespace without /run/systemd) finishes with exit 0 and says it skipped
    daemon-reload (item 2)."""
    proc = host.machine.run(
        f"unshare -m sh -c 'mount -t tmpfs tmpfs /run/systemd && exec {INSTALL}'",
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped systemctl daemon-reload" in proc.stdout
    host.run("systemctl daemon-reload")


def test_init_sandbox_from_the_installed_copy(host: Host) -> None:
    """`depositd init --sandbox` works from the installed copy (item 7): it found the shipped
    rules install.sh put under the prefix."""
    assert "shipped rules folder was not found" not in host.init
    assert host.machine.path("/root/sbx/rules/default.yaml").exists()


def test_a_staged_tree_runs_where_it_lands(host: Host) -> None:
    """The fixture staged the install (install.sh --root), copied it to / and removed the staging
    directory; the unit runs from that copy, and nothing in it names the staging directory
    (shebangs, pyvenv.cfg, activate scripts, byte code, units, depositctl)."""
    host.ensure_running()
    assert host.run(f"test -e {STAGE} || echo gone").strip() == "gone"
    leaked = host.machine.run(
        f"grep -rlF {STAGE} /opt/depositd /etc/depositd /etc/systemd/system", check=False
    )
    assert leaked.returncode == 1 and leaked.stdout == "", leaked.stdout
    assert host.run(f"head -1 {DEPOSITD}").strip() == "#!/opt/depositd/venv/bin/python"
    assert "/opt/depositd/venv" in host.run("grep ^command /opt/depositd/venv/pyvenv.cfg")
    assert host.run(f"{DEPOSITD} --version").strip()


def test_restart_and_reload_under_load_refuse_nothing(host: Host) -> None:
    """With depositd.socket, `systemctl restart` and `systemctl reload`, each 4 s into 20 s of
    steady signed load (50/s): no connection refused or reset, every delivery answered 200 and
    stored; deposits injected before, during and after each are booked once. The same restart
    with serve binding the port itself (socket unit stopped) is measured for comparison
    (printed with `-s`), its deposits booked once too."""
    host.ensure_running()
    assert host.machine.show("depositd.socket", "ActiveState")["ActiveState"] == "active"
    restart = under_load(host, "restart", "systemctl restart depositd", ("41.10", "41.20", "41.30"))
    host.wait_for("running", lambda s: s["SubState"] == "running")
    reload = under_load(host, "reload", "systemctl reload depositd", ("42.10", "42.20", "42.30"))
    # Without the socket unit: serve binds webhook.listen itself, as outside systemd.
    host.run("systemctl stop depositd depositd.socket && systemctl start depositd", timeout=120)
    try:
        host.wait_for("running", lambda s: s["SubState"] == "running")
        plain = under_load(host, "plain", "systemctl restart depositd", ("43.10", "43.20", "43.30"))
    finally:
        host.run("systemctl stop depositd && systemctl start depositd.socket depositd", timeout=120)
    windows = {"restart": restart, "reload": reload, "plain": plain}
    for name, summary in windows.items():
        host.figures[f"{name} under {LOAD_RATE}/s"] = {
            k: summary[k] for k in FIGURES if k in summary
        }
        print(f"\n{name} under {LOAD_RATE}/s: {json.dumps(summary)}")
    assert_nothing_lost(restart)
    assert_nothing_lost(reload)
    # The longest time without an answer is the restart: the old process's stop, which waits
    # for no poll (only for a submission or alert in flight, up to its grace), then the new
    # one's start to READY.
    assert restart["stopS"] < STOP_GRACE_S, restart
    assert restart["longestGapS"] < 5, restart
    # Without the socket the port is closed while serve restarts: connections are refused.
    assert plain["refused"] > 0, plain
    assert_booked_once(host, list(windows.values()))
