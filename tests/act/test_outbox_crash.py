"""Crash between the decision to submit and the provider's answer: resumed once, same key."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from pytest_aiohttp import AiohttpServer

from tests.support.configs import HOOK_PATH, serve_config, write_config
from tests.support.ports import free_port
from tests.support.processes import Processes
from tests.support.sandboxes import sandbox_settings
from tests.support.waits import until
from worker.dev.sandbox import SANDBOX_KEY, create_app

PAYER_ADDRESS = "TCrashPayer000000000000000000000001"
PROFILES = f"""
profiles:
  crash-entity:
    correspondentType: ENTITY
    fullName: Crash Test Trading Ltd
    countryCode: SG
    companyAddress: 9 Crash Street, Singapore
    walletType: VASP
    provider: Binance
addresses:
  {PAYER_ADDRESS}: crash-entity
"""


def db_rows(path: Path, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Rows of a query on the worker's database file (empty if it does not exist yet)."""
    if not path.exists():
        return []
    conn = sqlite3.connect(path, timeout=5)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args).fetchall()]
    except sqlite3.OperationalError:  # schema not created yet
        return []
    finally:
        conn.close()


async def test_sigkill_with_submission_in_flight_submits_once_with_same_key(
    tmp_path: Path,
    aiohttp_server: AiohttpServer,
    recorded: list[dict[str, Any]],
    processes: Processes,
) -> None:
    """SIGKILL while the submission is in flight: after restart it happens once, same key."""
    port = free_port()
    hooks_url = f"http://127.0.0.1:{port}{HOOK_PATH}"
    app = create_app(
        sandbox_settings(hooks_url, delivery_retry_base_s=0.1, delivery_retry_max_s=0.5)
    )
    sandbox = app[SANDBOX_KEY]
    applied: list[str] = []
    original_submit = sandbox.submit

    def counting_submit(tx_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        answer = original_submit(tx_id, body)
        applied.append(tx_id)
        return answer

    sandbox.submit = counting_submit  # type: ignore[method-assign]
    # The first submission is held at the sandbox until the test lets it go (after the kill
    # and the resumed submission), so the worker is killed mid-call however slow the machine.
    release_first = asyncio.Event()
    submits_arrived: list[int] = []
    submits_ended: list[int] = []

    @web.middleware
    async def hold_first_submit(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST" or not request.path.endswith("/submit"):
            return await handler(request)
        submits_arrived.append(1)
        try:
            if len(submits_arrived) == 1:
                await release_first.wait()
            return await handler(request)
        finally:  # answered, or dropped with its connection
            submits_ended.append(1)

    app.middlewares.append(hold_first_submit)
    server = await aiohttp_server(app)

    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(PROFILES)
    db = tmp_path / "depositd.db"
    cfg = serve_config(
        db,
        str(server.make_url("")).rstrip("/"),
        port,
        provider={"timeout_s": 10},
        scheduler={"enabled": False},
        profiles=str(profiles),
        log={"level": "warning"},
    )
    config = write_config(tmp_path, cfg)
    serve = processes.serve(config, port, tmp_path / "serve.log")
    await serve.start()
    tx = sandbox.inject_deposit(1001, "USDT", "TRON", "250.75", PAYER_ADDRESS)["transactionId"]

    def submit_rows() -> list[dict[str, Any]]:
        return db_rows(
            db, "SELECT * FROM actions WHERE transaction_id=? AND action='submit_profile'", (tx,)
        )

    def submits_seen() -> list[dict[str, Any]]:
        return [r for r in recorded if r["method"] == "POST" and r["path"].endswith("/submit")]

    await until(
        lambda: [r["status"] for r in submit_rows()] == ["running"] and len(submits_seen()) == 1,
        "the submission to be in flight",
    )
    assert await serve.signal(signal.SIGKILL) == -signal.SIGKILL
    assert applied == []  # killed before the provider acted on it
    key = submit_rows()[0]["idempotency_key"]
    assert key

    await serve.start()
    await until(lambda: submit_rows()[0]["status"] == "done", "the resumed submission")
    # Let the held first request finish at the sandbox too, whatever it does.
    release_first.set()
    await until(lambda: len(submits_ended) == 2, "the held first request to end")
    assert len(submit_rows()) == 1
    assert applied == [tx]  # the provider's state changed once
    seen = submits_seen()
    assert len(seen) == 2
    assert {r["headers"]["Idempotency-Key"] for r in seen} == {key}
    assert seen[0]["body"] == seen[1]["body"]
    assert sandbox.state.order(tx).white_list_status.value == "pending"

    sandbox.approve_review(tx)
    await until(lambda: bool(db_rows(db, "SELECT * FROM ledger")), "the booking")
    await sandbox.delivered_idle()
    ledger = db_rows(db, "SELECT * FROM ledger")
    assert [(r["transaction_id"], r["amount"]) for r in ledger] == [(tx, "250.75")]
    assert await serve.signal(signal.SIGTERM) == 0
    assert len(submits_seen()) == 2
    assert len(db_rows(db, "SELECT * FROM ledger")) == 1
