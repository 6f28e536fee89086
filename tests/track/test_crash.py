"""Crash safety of `serve`: SIGKILL under load loses no acknowledged event and doubles none."""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.configs import HOOK_KEY, HOOK_PATH, HOOK_SECRET, make_config, write_config
from tests.support.ports import free_port
from tests.support.processes import Processes
from worker.provider.jsonio import dumpb
from worker.provider.signing import signed_headers


def crash_config(tmp_path: Path, port: int) -> Path:
    """A serve config on loopback with synchronous=FULL and no scheduler."""
    cfg = make_config(
        {"path": str(tmp_path / "depositd.db"), "synchronous": "FULL"},
        port=port,
        scheduler={"enabled": False},
        log={"format": "json", "level": "warning"},
    )
    return write_config(tmp_path, cfg)


def event(n: int) -> dict[str, Any]:
    """Event n: whitelist events of deposit n // 3, so deposits see several facts."""
    kind = (
        "DEPOSIT_WHITELIST_REQUIRED",
        "DEPOSIT_WHITELIST_CREDITED",
        "DEPOSIT_ORDER_NOTIFICATION",
    )
    tx = f"tx-{n // 3}"
    status = "SUCCESS" if n % 3 == 2 else "PROCESSING"
    return {
        "eventId": f"ev-{n}",
        "eventType": kind[n % 3],
        "referenceId": tx,
        "status": status,
        "timestamp": 1_700_000_000_000 + n,
        "data": {
            "transactionId": tx,
            "amount": "1.25",
            "currency": "USDT",
            "network": "TRON",
            "walletId": 1,
            "status": status,
            "fromAddress": "T1",
        },
    }


async def stream(port: int, numbers: list[int], acked: set[int], stop: asyncio.Event) -> None:
    """Send events over 8 connections until `stop`; record the ones answered 200."""
    queue = list(numbers)
    url = f"http://127.0.0.1:{port}{HOOK_PATH}"

    async def sender(session: aiohttp.ClientSession) -> None:
        while queue and not stop.is_set():
            n = queue.pop(0)
            body = dumpb(event(n))
            headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, body)
            try:
                async with session.post(url, data=body, headers=headers) as r:
                    if r.status == 200:
                        acked.add(n)
            except (aiohttp.ClientError, ConnectionError):
                await asyncio.sleep(0.01)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        await asyncio.gather(*(sender(session) for _ in range(8)))


def db_rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of a query on the database file."""
    conn = sqlite3.connect(path)
    try:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    finally:
        conn.close()


async def test_sigkill_under_load_loses_and_doubles_nothing(
    tmp_path: Path, processes: Processes
) -> None:
    """Three SIGKILLs mid-stream: every acknowledged event is stored and applied exactly once."""
    rng = random.Random(7)
    port = free_port()
    server = processes.serve(crash_config(tmp_path, port), port, tmp_path / "serve.log")
    acked: set[int] = set()
    sent_upto = 0
    for _ in range(3):
        await server.start()
        stop = asyncio.Event()
        # The provider retries what was not acknowledged, and some of what was.
        retries = [n for n in range(sent_upto) if n not in acked or rng.random() < 0.2]
        fresh = list(range(sent_upto, sent_upto + 3000))
        task = asyncio.create_task(stream(port, retries + fresh, acked, stop))
        await asyncio.sleep(rng.uniform(0.3, 1.0))
        assert await server.signal(signal.SIGKILL) == -signal.SIGKILL
        stop.set()
        await task
        sent_upto += 3000
    await server.start()
    await stream(
        port, [n for n in range(sent_upto) if n not in acked][:300], acked, asyncio.Event()
    )
    db = tmp_path / "depositd.db"
    deadline = time.monotonic() + 10
    while db_rows(db, "SELECT COUNT(*) FROM events WHERE status = 'pending'")[0][0]:
        assert time.monotonic() < deadline, "events left pending"
        await asyncio.sleep(0.05)
    assert await server.signal(signal.SIGTERM) == 0  # graceful stop exits 0

    assert len(acked) > 100, "the stream hardly ran; the test proves nothing"
    events = dict(db_rows(db, "SELECT event_id, status FROM events"))
    missing = [n for n in acked if events.get(f"ev-{n}") != "processed"]
    assert missing == []
    doubled = db_rows(
        db, "SELECT event_id, COUNT(*) FROM facts GROUP BY event_id HAVING COUNT(*) != 1"
    )
    assert doubled == []
    assert db_rows(db, "SELECT COUNT(*) FROM facts")[0][0] == len(events)
    # Each deposit's triggers were emitted once: `emitted` holds each key once by construction,
    # and every fully delivered deposit ended completed.
    complete = {n // 3 for n in acked if {3 * (n // 3) + i for i in range(3)} <= acked}
    states = dict(db_rows(db, "SELECT transaction_id, state FROM deposits"))
    assert all(states[f"tx-{d}"] == "completed" for d in complete)
