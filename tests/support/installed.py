"""depositd installed in a test container (tests/support/machine.py): its paths, the sandbox
configuration the real-systemd tests share, and steady signed load (tests/deploy/steadyload.py)
with what it found stored."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from tests.support.machine import Machine

WATCHDOG_S = 6
DEPOSITCTL = "/opt/depositd/bin/depositctl"
DEPOSITD = "/opt/depositd/venv/bin/depositd"
PYTHON = "/opt/depositd/venv/bin/python"
SANDBOX = "/root/sbx/depositd.yaml"
STATE = "/var/lib/private/depositd"
DROP_IN = f"""[Service]
WatchdogSec={WATCHDOG_S}
RestartSec=1
"""


@dataclass
class Host:
    """The booted container with depositd installed, configured and started."""

    machine: Machine
    install: str  # install.sh's output
    init: str  # `depositd init --sandbox`'s output, from the installed copy
    webhook: str  # HOST:PORT of the webhook listener
    figures: dict[str, Any] = field(default_factory=dict)

    def run(self, command: str, timeout: float = 60, check: bool = True) -> str:
        """Run a command in the container; its stdout."""
        return self.machine.run(command, timeout=timeout, check=check).stdout

    def active(self) -> dict[str, str]:
        """The service's state, main PID, restarts and status line."""
        return self.machine.show(
            "depositd", "ActiveState", "SubState", "MainPID", "NRestarts", "StatusText"
        )

    def ensure_running(self) -> dict[str, str]:
        """Start the service (and the socket holding its port) if a test left it stopped; its
        state once active."""
        self.run("systemctl start depositd.socket depositd", timeout=60)
        return self.wait_for("depositd active", lambda s: s["ActiveState"] == "active")

    def wait_for(
        self, what: str, ok: Callable[[dict[str, str]], bool], within_s: float = 60
    ) -> dict[str, str]:
        """Poll the service's state until `ok(state)`; fail naming `what` after `within_s`."""
        deadline = time.monotonic() + within_s
        state = self.active()
        while time.monotonic() < deadline:
            state = self.active()
            if ok(state):
                return state
            time.sleep(0.1)
        raise AssertionError(f"{what}: not within {within_s} s; state {state}")

    def journal(self, args: str) -> str:
        """journalctl output (no pager)."""
        return self.run(f"journalctl --no-pager {args}")


def configure(machine: Machine) -> tuple[str, str]:
    """Configure the installed depositd against the sandbox that `depositd init --sandbox` (run
    from the installed copy) set up in /root/sbx; start the sandbox. Returns init's output and
    the webhook address."""
    init = machine.run(f"{DEPOSITD} init --sandbox /root/sbx", timeout=60).stdout
    sbx = yaml.safe_load(machine.path(SANDBOX).read_text())
    secrets = machine.path("/root/sbx/secrets")
    key = (secrets / "provider_api_key").read_text().strip()
    etc = machine.path("/etc/depositd")
    for name, source in (
        ("api_secret", "provider_api_secret"),
        ("webhook_secret", "webhook_secret"),
    ):
        target = etc / "credentials" / name
        target.write_text((secrets / source).read_text())
        target.chmod(0o600)
    (etc / "depositd.env").write_text(f"PROVIDER_API_KEY={key}\n")
    (etc / "profiles.yaml").write_text(machine.path("/root/sbx/rules/profiles.yaml").read_text())
    config = {
        "provider": {
            "base_url": sbx["provider"]["base_url"],
            "api_key": "${PROVIDER_API_KEY}",
            "api_secret_file": "${CREDENTIALS_DIRECTORY}/api_secret",
        },
        "webhook": {
            "listen": sbx["webhook"]["listen"],
            "path": sbx["webhook"]["path"],
            "api_key": "${PROVIDER_API_KEY}",
            "secret_file": "${CREDENTIALS_DIRECTORY}/webhook_secret",
        },
        "storage": {"path": "/var/lib/depositd/depositd.db"},
        "scheduler": {"history_interval_s": 10, "detail_interval_s": 10},
        "rules": "/etc/depositd/rules",
        "profiles": "/etc/depositd/profiles.yaml",
        "console": {
            "listen": "127.0.0.1:8081",
            "token_file": "${CREDENTIALS_DIRECTORY}/console_token",
            "hosted_url": sbx["provider"]["base_url"],
        },
        "log": {"format": "json", "level": "info"},
    }
    (etc / "depositd.yaml").write_text(json.dumps(config, indent=2))
    dropin = machine.path("/etc/systemd/system/depositd.service.d")
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "test.conf").write_text(DROP_IN)
    # The webhook port held by systemd (deploy/depositd.socket) on webhook.listen's address.
    sockets = machine.path("/etc/systemd/system/depositd.socket.d")
    sockets.mkdir(parents=True, exist_ok=True)
    listen = sbx["webhook"]["listen"]
    (sockets / "test.conf").write_text(f"[Socket]\nListenStream=\nListenStream={listen}\n")
    machine.run(
        "systemd-run --unit=sandbox -p WorkingDirectory=/root/sbx"
        f" {DEPOSITD} sandbox --config {SANDBOX} --auto-review"
    )
    return init, sbx["webhook"]["listen"]


# Steady signed load for the restart, reload and upgrade tests: 50 deliveries a second from 2 s
# before the action until 3 s after it returned (at most LOAD_S). Shorter than a fixed 20 s
# window: a restart here takes 3-6 s (stop, then start to READY), and the window still covers
# it with steady load on both sides.
LOAD_RATE, LOAD_S = 50, 120


def under_load(host: Host, prefix: str, action: str) -> dict[str, Any]:
    """Run `action` 2 s into steady signed load (tests/deploy/steadyload.py in the container);
    the load's summary, with the deliveries answered 200 that are not stored."""
    started, stop = f"/root/{prefix}.started", f"/root/{prefix}.stop"
    key = host.run("sed -n 's/^PROVIDER_API_KEY=//p' /etc/depositd/depositd.env").strip()
    command = (
        f"{PYTHON} /src/tests/deploy/steadyload.py --url http://{host.webhook}/webhooks/provider"
        f" --key {key} --secret-file /etc/depositd/credentials/webhook_secret"
        f" --prefix {prefix} --rate {LOAD_RATE} --seconds {LOAD_S} --started {started}"
        f" --stop-file {stop}"
    )
    out: dict[str, str] = {}

    def load() -> None:
        out["summary"] = host.run(command, timeout=LOAD_S + 150)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        host.machine.wait_until("load started", f"test -e {started}", within_s=30)
        time.sleep(2)  # steady load before the action, not a synchronisation
        host.run(action, timeout=180)
    finally:
        host.run(f"touch {stop}")
        thread.join(LOAD_S + 180)
    summary: dict[str, Any] = json.loads(out["summary"])
    ok = set(summary.pop("ok"))
    script = (
        "import sqlite3, json, sys\n"
        f"db = sqlite3.connect('{STATE}/depositd.db')\n"
        "rows = db.execute('select event_id from events where event_id like ?', (sys.argv[1],))\n"
        "print(json.dumps([r[0] for r in rows]))\n"
    )
    stored = json.loads(host.machine.run(f"python3 - '{prefix}-%'", stdin=script).stdout)
    summary["stored"] = len(stored)
    summary["answered200NotStored"] = len(ok - set(stored))
    return summary


def assert_nothing_lost(summary: dict[str, Any]) -> None:
    assert summary["refused"] == 0 and summary["reset"] == 0, summary
    assert summary["timeout"] == 0 and summary["errors"] == {}, summary
    assert summary["answered"] == {"200": summary["sent"]}, summary
    assert summary["answered200NotStored"] == 0, summary
