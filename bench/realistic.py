"""The configuration a merchant runs, for the benchmarks: rules, profiles, the scheduler polling
the embedded sandbox every 2 s, `synchronous` as given. Also the light configuration (no rules,
no profiles, scheduler off), and the helpers the bench scripts share (ports, processes, lag).

Not a test; imported by bench/ingest.py, bench/latency.py and bench/memory.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PATH = "/webhooks/provider"
API_KEY = "bench-key"
SECRET = "bench-secret"
PROVIDER_KEY = "bench-provider-key"
PROVIDER_SECRET = "bench-provider-secret"
# The payer address of every bench deposit: a stored profile applies to it.
FROM_ADDRESS = "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB"

# A per-wallet rule set (wallet 1001 replaces rules/default.yaml for that wallet): submit the
# stored profile, book every credited deposit, alert on the problems.
WALLET_RULES = """\
wallet: 1001
rules:
  - name: auto-submit stored payer
    on: [needs_details]
    if: {currency: [USDT, USDC], network: TRON, amount: {lte: "50000"}, profile: found}
    then: [submit_profile]
  - name: ask a human when no profile
    on: [needs_details]
    if: {profile: missing}
    then:
      - alert: {severity: warning, message: payer details needed}
  - name: book
    on: [credited]
    then: [book]
  - name: problems
    on: [blocked, rejected, failed]
    then:
      - alert: {severity: critical}
"""

# Fictitious payers (as rules/profiles.example.yaml).
PROFILES = f"""\
profiles:
  acme-ops:
    correspondentType: ENTITY
    fullName: Acme Trading Ltd
    countryCode: SG
    companyAddress: 1 Example Road, Singapore
    walletType: VASP
    provider: Binance
  other-example:
    correspondentType: ENTITY
    fullName: Example Custody Co
    countryCode: DE
    companyAddress: Musterstrasse 3, Berlin
    walletType: OTHERS
    othersPleaseSpecify: qualified custodian
addresses:
  {FROM_ADDRESS}: acme-ops
wallets:
  1002: other-example
"""


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_config(
    tmp: Path,
    name: str,
    *,
    light: bool,
    synchronous: str = "FULL",
    log_level: str = "info",
    ingress_process: bool = True,
    provider_port: int | None = None,
    interval_s: float = 2.0,
    url: str | None = None,
) -> tuple[Path, int, Path | str, int]:
    """A depositd config (realistic unless `light`): (config file, webhook port, database,
    sandbox port). With `url`, the database is that PostgreSQL one."""
    port = free_port()
    sandbox_port = provider_port or free_port()
    db: Path | str = url or tmp / f"{name}.db"
    cfg: dict[str, Any] = {
        "provider": {
            "base_url": f"http://127.0.0.1:{sandbox_port}",
            "api_key": PROVIDER_KEY,
            "api_secret": PROVIDER_SECRET,
        },
        "webhook": {
            "listen": f"127.0.0.1:{port}",
            "path": PATH,
            "api_key": API_KEY,
            "secret": SECRET,
            "ingress_process": ingress_process,
        },
        "storage": {"url": url} if url else {"path": str(db), "synchronous": synchronous},
        "log": {"format": "json", "level": log_level},
    }
    if light:
        cfg["scheduler"] = {"enabled": False}
    else:
        rules = tmp / f"{name}-rules"
        rules.mkdir(exist_ok=True)
        shutil.copy(ROOT / "rules" / "default.yaml", rules / "default.yaml")
        (rules / "wallet-1001.yaml").write_text(WALLET_RULES)
        (tmp / f"{name}-profiles.yaml").write_text(PROFILES)
        cfg["rules"] = str(rules)
        cfg["profiles"] = str(tmp / f"{name}-profiles.yaml")
        cfg["scheduler"] = {
            "enabled": True,
            "history_interval_s": interval_s,
            "detail_interval_s": interval_s,
        }
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    return path, port, db, sandbox_port


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`python ARGS` from the repository root, its output appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
            stdout=out,
            stderr=out,
        )


def start_sandbox(config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`depositd sandbox --config CONFIG` (the provider), once its control API answers."""
    proc = spawn(["-m", "worker", "sandbox", "--config", str(config)], log)
    wait_url(f"http://127.0.0.1:{port}/_sandbox/state", proc)
    return proc


def start_serve(config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`depositd serve --config CONFIG`, once healthy."""
    proc = spawn(["-m", "worker", "serve", "--config", str(config)], log)
    wait_url(f"http://127.0.0.1:{port}/healthz", proc)
    return proc


def wait_url(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Wait until GET url answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} did not answer")


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> int:
    """SIGTERM and wait; the exit status."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def lag(db: Path | str, conn: Any = None) -> tuple[int, float, int]:
    """Events stored but not yet processed, the age in seconds of the oldest of them, and the
    actions still waiting in the outbox (`db`: a SQLite file or a PostgreSQL URL; `conn`: a
    connection of `connect_to(db)` to use, else one opened and closed for the call)."""
    own = conn is None
    if own:
        conn = connect_to(db)
    try:
        count, oldest = conn.execute(
            "SELECT COUNT(*), MIN(received_at) FROM events WHERE status='pending'"
        ).fetchone()
        actions = conn.execute(
            "SELECT COUNT(*) FROM actions WHERE status IN ('pending','running')"
        ).fetchone()[0]
    finally:
        if own:
            conn.close()
    if not oldest:
        return int(count), 0.0, int(actions)
    received = datetime.fromisoformat(oldest.replace("Z", "+00:00")).timestamp()
    return int(count), max(0.0, time.time() - received), int(actions)


def connect_to(db: Path | str) -> Any:
    """A connection that reads `db` (a SQLite file or a PostgreSQL URL), each statement on
    its own (autocommit)."""
    if isinstance(db, str):
        import psycopg

        return psycopg.connect(db, autocommit=True)
    return sqlite3.connect(db, timeout=30, isolation_level=None)


def drain(db: Path | str, limit_s: float = 300) -> float:
    """Wait until no event is pending; the seconds it took. One connection looks every 50 ms
    (`pending`; on PostgreSQL a connection opened per look cost the server a process start
    each time, CPU the server measured then lacked)."""
    t0 = time.monotonic()
    conn = connect_to(db)
    try:
        while pending(conn) and time.monotonic() - t0 < limit_s:
            time.sleep(0.05)
    finally:
        conn.close()
    return time.monotonic() - t0


def pending(conn: Any) -> bool:
    """Whether an event is pending (`conn`: of `connect_to`). Cheaper than counting them: on
    PostgreSQL a count read every pending row and every one processed since the last VACUUM."""
    return (
        conn.execute("SELECT 1 FROM events WHERE status = 'pending' LIMIT 1").fetchone() is not None
    )


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
