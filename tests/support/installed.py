"""depositd installed in a test container (tests/support/machine.py): its paths, the sandbox
configuration the real-systemd tests share, and steady signed load (tests/deploy/steadyload.py)
with what it found stored."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
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
        state once serving (READY=1 comes before: once its rules, profiles and store are
        checked, the socket holding what arrives until it serves)."""
        self.run("systemctl start depositd.socket depositd", timeout=60)
        return self.wait_for(
            "depositd serving",
            lambda s: s["ActiveState"] == "active" and not s["StatusText"].startswith("starting"),
        )

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


def configure(machine: Machine, provider: str = DEPOSITD) -> tuple[str, str]:
    """Configure the installed depositd against the sandbox that `depositd init --sandbox` (run
    from the installed copy) set up in /root/sbx; start the sandbox with `provider` (a depositd
    command line). Returns init's output and the webhook address."""
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
        f" {provider} sandbox --config {SANDBOX} --auto-review"
    )
    return init, sbx["webhook"]["listen"]


# Steady signed load for the restart, reload and upgrade tests: 50 deliveries a second for 20 s,
# the action started LEAD_S into it. An action that outlasts the window (a package upgrade on a
# busy host can) has the load go on until 3 s after it returned (tests/deploy/steadyload.py).
LOAD_RATE, LOAD_S, LEAD_S = 50, 20, 4
# When the deposits of a window are injected: halfway through the lead, while the service is
# restarting (or reloading; at the latest when the action returned), and once it returned.
MOMENTS = ("before", "during", "after")
# What the tests print of a window (with `-s`); stopS and readyS (a restart's parts: the old
# process's stop, the new one's exec -> READY) where the action restarted the service.
FIGURES = ("sent", "answered", "refused", "reset", "longestGapS", "loadS", "actionAtS", "actionS")
FIGURES += ("stopS", "readyS")
# `depositd sandbox inject` (worker/dev/sandboxctl.py) as a call of the container's own
# python3: an inject while a package upgrade replaces depositd's files runs nothing of them.
INJECT = """
import json, secrets, sys, urllib.request
alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
body = {"walletId": 1002, "currency": "USDT", "network": "TRON", "amount": sys.argv[2],
        "fromAddress": "T" + "".join(secrets.choice(alphabet) for _ in range(33))}
request = urllib.request.Request(sys.argv[1].rstrip("/") + "/_sandbox/deposits",
    data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST")
with urllib.request.urlopen(request, timeout=30) as answer:
    order = json.load(answer)
print(json.dumps({"transactionId": order["transactionId"], "txHash": order["transactionHash"]}))
"""


def inject(host: Host, amount: str) -> dict[str, str]:
    """A deposit of `amount` USDT into wallet 1002 (whose unknown payers get the fictitious
    profile), injected into the running sandbox; its transactionId and txHash."""
    base_url = yaml.safe_load(host.machine.path(SANDBOX).read_text())["provider"]["base_url"]
    out = host.machine.run(f"python3 - {base_url} {amount}", stdin=INJECT).stdout
    ids: dict[str, str] = json.loads(out)
    return ids


def under_load(host: Host, prefix: str, action: str, amounts: Sequence[str] = ()) -> dict[str, Any]:
    """Run `action` LEAD_S into steady signed load (tests/deploy/steadyload.py in the container),
    injecting a deposit of each of `amounts` at the MOMENTS in turn; the load's summary, with
    when the action ran (actionAtS, actionS: seconds from the first delivery), the deposits
    injected and the deliveries answered 200 that are not stored."""
    started, stop = f"/root/{prefix}.started", f"/root/{prefix}.stop"
    key = host.run("sed -n 's/^PROVIDER_API_KEY=//p' /etc/depositd/depositd.env").strip()
    command = (
        f"{PYTHON} /src/tests/deploy/steadyload.py --url http://{host.webhook}/webhooks/provider"
        f" --key {key} --secret-file /etc/depositd/credentials/webhook_secret"
        f" --prefix {prefix} --rate {LOAD_RATE} --seconds {LOAD_S} --started {started}"
        f" --stop-file {stop}"
    )
    out: dict[str, str] = {}
    deposits: list[dict[str, Any]] = []
    due = dict(zip(MOMENTS, amounts, strict=False))
    acting = threading.Event()

    def load() -> None:
        out["summary"] = host.run(command, timeout=LOAD_S + 400)

    def deposit(moment: str, t0: float) -> None:
        if moment in due:
            at = time.monotonic() - t0
            ids = inject(host, due[moment])
            deposits.append({"at": moment, "atS": round(at, 2), "amount": due[moment], **ids})

    def during(t0: float, pid: str) -> None:
        """Inject once the unit leaves its running state (or changes its main PID)."""
        while acting.is_set():
            state = host.active()
            if (state["SubState"], state["MainPID"]) != ("running", pid):
                break
            time.sleep(0.1)
        deposit("during", t0)

    thread = threading.Thread(target=load)
    thread.start()
    injecting: threading.Thread | None = None
    try:
        host.machine.wait_until("load started", f"test -s {started}", within_s=30)
        t0 = float(host.run(f"cat {started}"))  # CLOCK_MONOTONIC, shared with the container
        time.sleep(max(0.0, t0 + LEAD_S / 2 - time.monotonic()))
        deposit("before", t0)
        time.sleep(max(0.0, t0 + LEAD_S - time.monotonic()))
        acting.set()
        pid = host.active()["MainPID"]
        if "during" in due:
            injecting = threading.Thread(target=during, args=(t0, pid))
            injecting.start()
        action_at = time.monotonic()
        host.run(action, timeout=300)
        action_s = time.monotonic() - action_at
        acting.clear()
        if injecting is not None:
            injecting.join(60)
        deposit("after", t0)
    finally:
        acting.clear()
        host.run(f"touch {stop}")
        thread.join(LOAD_S + 420)
    summary: dict[str, Any] = json.loads(out["summary"])
    summary["actionAtS"] = round(action_at - t0, 2)
    summary["actionS"] = round(action_s, 2)
    summary["deposits"] = deposits
    times = host.machine.show(
        "depositd", "MainPID", "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic"
    )
    if times["MainPID"] != pid:  # restarted: the old one's stop, the new one's exec -> READY
        exec_at = int(times["ExecMainStartTimestampMonotonic"]) / 1e6
        summary["stopS"] = round(exec_at - action_at, 2)
        summary["readyS"] = round(int(times["ActiveEnterTimestampMonotonic"]) / 1e6 - exec_at, 2)
    # The window held the action, with load on both sides.
    assert summary["loadS"] >= LOAD_S - 0.1, summary
    assert summary["actionAtS"] + action_s <= summary["loadS"] - 1, summary
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


def assert_booked_once(
    host: Host, summaries: Sequence[dict[str, Any]], within_s: float = 180
) -> None:
    """Every deposit injected during the windows is booked in `depositctl ledger --json`, with
    its amount, once: one entry of its transactionId and none other of its txHash."""
    wanted = {d["transactionId"]: d for summary in summaries for d in summary["deposits"]}
    deadline = time.monotonic() + within_s
    while True:
        ledger = host.run(f"{DEPOSITCTL} ledger --json", timeout=60)
        entries = [json.loads(line) for line in ledger.splitlines() if line.strip()]
        booked = {e["transactionId"] for e in entries}
        if set(wanted) <= booked or time.monotonic() > deadline:
            break
        time.sleep(2)
    missing = [d for tx, d in wanted.items() if tx not in booked]
    assert not missing, ("not booked", missing)
    for deposit in wanted.values():
        same = [
            e
            for e in entries
            if e["transactionId"] == deposit["transactionId"]
            or (e["txHash"] or "").lower() == deposit["txHash"].lower()
        ]
        assert len(same) == 1, ("booked more than once", deposit, same)
        assert Decimal(same[0]["amount"]) == Decimal(deposit["amount"]), (deposit, same)
