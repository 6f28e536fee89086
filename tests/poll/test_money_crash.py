"""SIGKILL in the middle of an abnormal-fund poll (of `serve`) and of a reconciliation (of
`depositd reconcile`): after the restart nothing is lost and nothing is reported twice."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from pytest_aiohttp import AiohttpServer

from tests.support.configs import HOOK_PATH, serve_config, write_config
from tests.support.ports import free_port
from tests.support.processes import Processes
from tests.support.sandboxes import sandbox_settings
from tests.support.waits import until
from worker.dev.sandbox import SANDBOX_KEY, Sandbox, create_app

ROOT = Path(__file__).resolve().parents[2]


def db_rows(path: Path, sql: str) -> list[dict[str, Any]]:
    """Rows of a query on the worker's database file (empty before its schema exists)."""
    if not path.exists():
        return []
    conn = sqlite3.connect(path, timeout=5)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql).fetchall()]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


FUND = {
    "amount": "10.5",
    "currency": "USDT",
    "network": "TRON",
    "fromAddress": "TFromCrash000000000000000000000001",
    "toAddress": "TToCrash00000000000000000000000001",
}


async def setup(
    tmp_path: Path, aiohttp_server: AiohttpServer, port: int, scheduler: dict[str, Any]
) -> tuple[Sandbox, Path, Path]:
    """A sandbox on loopback and a config for it; (sandbox, config, database)."""
    app = create_app(sandbox_settings(f"http://127.0.0.1:{port}{HOOK_PATH}"))
    server = await aiohttp_server(app)
    db = tmp_path / "depositd.db"
    cfg = serve_config(
        db,
        str(server.make_url("")).rstrip("/"),
        port,
        provider={"timeout_s": 10},
        scheduler=scheduler,
        profiles=None,
        log={"level": "warning"},
    )
    config = write_config(tmp_path, cfg)
    return app[SANDBOX_KEY], config, db


async def test_sigkill_mid_abnormal_poll_loses_and_repeats_nothing(
    tmp_path: Path,
    aiohttp_server: AiohttpServer,
    processes: Processes,
    recorded: list[dict[str, Any]],
) -> None:
    """serve killed while the second page of abnormal funds is in flight: the first record is
    kept, the restart stores the rest, and each record queued its alert exactly once."""
    port = free_port()
    never = 3600
    sandbox, config, db = await setup(
        tmp_path,
        aiohttp_server,
        port,
        {
            "history_interval_s": never,
            "detail_interval_s": never,
            "catchup_interval_s": never,
            "abnormal_interval_s": 0.5,
            "page_size": 1,
        },
    )
    for i in range(3):
        sandbox.inject_abnormal_fund({**FUND, "txHash": f"0xcrash{i}"})
    # The first page is answered; the second is held at the provider (until the faults are
    # cleared) so that the kill lands while it is in flight, however slow the machine.
    sandbox.set_fault("abnormal_funds", "latency", count=1, latency_s=0)
    sandbox.set_fault("abnormal_funds", "timeout", count=None)
    serve = processes.serve(config, port, tmp_path / "serve.log")
    await serve.start()

    def stored() -> list[dict[str, Any]]:
        return db_rows(db, "SELECT * FROM abnormal_funds ORDER BY id")

    def pages_asked() -> int:
        return sum(r["path"].endswith("/abnormal-fund/list") for r in recorded)

    await until(lambda: pages_asked() >= 2, "the second page asked for", within_s=20)
    await until(lambda: len(stored()) == 1, "the first page's record")
    assert await serve.signal(signal.SIGKILL) == -signal.SIGKILL
    assert len(stored()) == 1 and stored()[0]["alerted_at"]

    sandbox.clear_faults()
    await serve.start()
    await until(lambda: len(stored()) == 3, "every record after the restart")
    # A few more polls, each reading every page again: nothing new may be queued.
    asked = pages_asked()
    await until(lambda: pages_asked() >= asked + 6, "two more polls")
    alerts = db_rows(db, "SELECT params FROM actions WHERE trigger='abnormal_fund'")
    subjects = [json.loads(a["params"])["once_per"].split(":")[1] for a in alerts]
    assert sorted(subjects) == sorted(r["id"] for r in stored())
    log = (tmp_path / "serve.log").read_text()
    assert FUND["fromAddress"] not in log


async def reconcile(processes: Processes, config: Path, day: str) -> asyncio.subprocess.Process:
    """`depositd reconcile --date DAY --json` started."""
    return processes.own(
        await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "worker", "reconcile", "--date", day, "--json"],
            "--config",
            str(config),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    )


async def test_sigkill_mid_reconciliation_records_nothing_and_the_rerun_completes_it(
    tmp_path: Path,
    aiohttp_server: AiohttpServer,
    processes: Processes,
    recorded: list[dict[str, Any]],
) -> None:
    """A reconciliation killed while reading the report leaves no finding and no run; the next
    run records every finding once, and a further run reports none again."""
    sandbox, config, db = await setup(tmp_path, aiohttp_server, free_port(), {"enabled": False})
    day = dt.datetime.now(dt.UTC).date().isoformat()
    for i in range(3):
        sandbox.add_discrepancy(
            {
                "kind": "extra",
                "date": day,
                "asset": "USDT",
                "network": "TRON",
                "amount": f"{i + 1}.5",
                "txHash": f"0xextra{i}",
            }
        )
    sandbox.set_fault("settlement", "timeout", count=None)  # held until the faults are cleared
    proc = await reconcile(processes, config, day)
    await until(
        lambda: any("/settlement/" in r["path"] for r in recorded),
        "the report's first page asked for",
        within_s=30,
    )
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    assert db_rows(db, "SELECT * FROM findings") == []
    assert db_rows(db, "SELECT * FROM reconcile_runs") == []

    sandbox.clear_faults()
    proc = await reconcile(processes, config, day)
    out, _ = await proc.communicate()
    assert proc.returncode == 3
    assert sorted(json.loads(line)["reportAmount"] for line in out.splitlines()) == [
        "1.5",
        "2.5",
        "3.5",
    ]
    proc = await reconcile(processes, config, day)
    await proc.communicate()
    assert proc.returncode == 3
    findings = db_rows(db, "SELECT * FROM findings")
    assert len(findings) == 3 and {f["kind"] for f in findings} == {"missing_in_ledger"}
    alerts = db_rows(db, "SELECT * FROM actions WHERE trigger='reconcile_finding'")
    assert len(alerts) == 3  # one per finding (one rule), not one per run
