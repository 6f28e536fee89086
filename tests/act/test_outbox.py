"""The outbox runner: its loop outlives a failing pass; forward is signed or not sent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer
from structlog.testing import capture_logs

from tests.support.waits import until, until_async
from worker.act.kinds.forward import forward_secret
from worker.act.outbox import Outbox
from worker.clock import utc_now
from worker.commands.cli import main
from worker.config.profiles import Profiles
from worker.dev.harness import Stack
from worker.errors import StorageError
from worker.provider.client import ProviderClient
from worker.provider.signing import METHOD_PATH_V1, verify
from worker.store.sqlitestore import Store
from worker.track.tracker import Fact


async def test_run_survives_a_storage_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that raises StorageError is logged and the next pass still runs."""
    store = Store(tmp_path / "depositd.db")
    await store.open()

    async def observe(fact: Fact) -> None:
        return None

    client = ProviderClient("http://127.0.0.1:9", "key", "secret", retries=0)
    outbox = Outbox(store, client=client, notifiers={}, profiles=Profiles.empty, observe=observe)
    passes = 0
    stop = asyncio.Event()

    async def run_once(*, include_delayed: bool = False) -> int:
        nonlocal passes
        passes += 1
        if passes == 1:
            raise StorageError("disk I/O error")
        stop.set()
        return 0

    monkeypatch.setattr(outbox, "run_once", run_once)
    try:
        await asyncio.wait_for(outbox.run(stop), timeout=5)
    finally:
        await client.close()
        await store.close()
    assert passes == 2


def _action_row(db: Any, next_attempt_at: str) -> None:
    db.execute(
        "INSERT INTO actions (transaction_id, action, params, status, attempts, next_attempt_at)"
        " VALUES ('tx-hand-edited', 'no_such_action', '{}', 'pending', 0, ?)",
        [next_attempt_at],
    )


@pytest.mark.parametrize("due", ["not a time", "2999-01-01T00:00:00"])
async def test_a_next_attempt_time_not_understood_leaves_the_runner_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, due: str
) -> None:
    """A row whose next attempt time is not a time (logged once) or one without its zone (read
    as UTC, as the store writes them) does not end the runner: rows due later still run."""
    store = Store(tmp_path / "depositd.db")
    await store.open()

    async def observe(fact: Fact) -> None:
        return None

    client = ProviderClient("http://127.0.0.1:9", "key", "secret", retries=0)
    outbox = Outbox(store, client=client, notifiers={}, profiles=Profiles.empty, observe=observe)
    stop = asyncio.Event()
    await store.write(lambda db: _action_row(db, due))
    reads: list[float] = []
    read_due = outbox._until_next_due

    async def counted(cap_s: float = 1.0) -> float:
        reads.append(await read_due(cap_s))
        return reads[-1]

    monkeypatch.setattr(outbox, "_until_next_due", counted)
    with capture_logs() as logs:
        running = asyncio.create_task(outbox.run(stop))
        try:
            await until(lambda: reads or running.done(), "the next due time read")
            await store.write(lambda db: _action_row(db, utc_now()))
            outbox.wake()

            async def skipped() -> bool:
                rows = await store.read(lambda db: list(db.query("SELECT status FROM actions")))
                return [r["status"] for r in rows] == ["pending", "skipped"]

            await until_async(skipped, "the row due now to run")
            assert not running.done()
        finally:
            stop.set()
            await asyncio.wait_for(running, 5)
            await client.close()
            await store.close()
    warnings = [(e["log_level"], e["value"]) for e in logs if "not understood" in e["event"]]
    assert warnings == ([("warning", due)] if due == "not a time" else [])
    assert reads and all(0 < wait <= 1.0 for wait in reads)


FORWARD_RULES = """\
wallet: '*'
rules:
  - name: tell the books
    on: [needs_details]
    then: [{forward: {url: '%s', %s: %s}}]
"""


def test_forward_secret_file_that_is_not_utf8_is_a_problem_without_its_bytes(
    tmp_path: Path,
) -> None:
    """A secret_file that is not UTF-8 is a problem saying so, never a byte of the secret."""
    path = tmp_path / "forward.secret"
    path.write_bytes(b"s\xe8cret\n")
    secret, problem = forward_secret({"secret_file": str(path)})
    assert (secret, problem) == ("", f"secret_file {path} is not UTF-8 text")


@pytest.mark.parametrize("source", ["secret_env", "secret_file"])
async def test_forward_with_missing_secret_is_not_sent_unsigned(
    tmp_path: Path,
    start_stack: Callable[..., Awaitable[Stack]],
    aiohttp_server: AiohttpServer,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
) -> None:
    """A forward whose configured secret is missing posts nothing, alerts once and retries
    with back-off; once the secret is there it posts, signed."""
    received: list[tuple[bytes, dict[str, str]]] = []

    async def merchant(request: web.Request) -> web.Response:
        received.append((await request.read(), dict(request.headers)))
        return web.Response()

    app = web.Application()
    app.router.add_post("/merchant", merchant)
    url = str((await aiohttp_server(app)).make_url("/merchant"))
    secret_file = tmp_path / "forward.secret"
    monkeypatch.delenv("OUTBOX_FORWARD_SECRET", raising=False)
    value = "OUTBOX_FORWARD_SECRET" if source == "secret_env" else str(secret_file)
    rules = tmp_path / "forward.yaml"
    rules.write_text(FORWARD_RULES % (url, source, value))
    stack = await start_stack(rules=rules, scheduler=False)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "5", "TOutboxForward0000000000000001")[
        "transactionId"
    ]

    async def forward_row() -> dict[str, Any]:
        rows = [a for a in await stack.actions(tx) if a["action"] == "forward"]
        return rows[0] if rows else {"attempts": 0, "status": None}

    async def tried_three_times() -> bool:
        return int((await forward_row())["attempts"]) >= 3

    await stack.wait_for(tried_three_times, what="three forward attempts")
    await stack.wait_for(lambda: stack.slack and stack.emails, what="the alert")
    row = await forward_row()
    assert received == []
    assert row["status"] in ("pending", "running") and "secret missing" in row["outcome"]
    assert len(stack.slack_for(tx, "forward_secret_missing")) == 1
    assert len(stack.emails_for(tx, "forward_secret_missing")) == 1

    if source == "secret_env":
        monkeypatch.setenv("OUTBOX_FORWARD_SECRET", "forward-secret-2")
    else:
        secret_file.write_text("forward-secret-2\n")
    await stack.wait_for(lambda: received, what="the signed forward")
    await stack.settle()
    body, headers = received[0]
    verify(
        headers,
        "POST",
        "/merchant",
        body,
        api_key=headers["API-KEY"],
        secrets=["forward-secret-2"],
        tolerance_s=60,
        scheme=METHOD_PATH_V1,  # forward's own scheme, whatever the provider's (docs/signatures.md)
    )
    assert (await forward_row())["status"] == "done"
    assert len(stack.slack) == 1 and len(stack.emails) == 1


def test_check_reports_a_missing_forward_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`depositd check` names a forward rule whose secret_env is unset or secret_file missing."""
    monkeypatch.delenv("OUTBOX_FORWARD_SECRET", raising=False)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules/a.yaml").write_text(
        FORWARD_RULES % ("https://bo.example/a", "secret_env", "OUTBOX_FORWARD_SECRET")
    )
    (tmp_path / "rules/b.yaml").write_text(
        FORWARD_RULES.replace("'*'", "1001") % ("https://bo.example/b", "secret_file", "b.secret")
    )
    config = tmp_path / "depositd.yaml"
    config.write_text(
        'provider: {base_url: "http://127.0.0.1:9", api_key: k, api_secret: s}\n'
        "webhook: {api_key: k, secret: w}\n"
        "storage: {path: depositd.db}\n"
        "rules: rules\n"
    )
    assert main(["check", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}/rules/a.yaml:3: " in err and "OUTBOX_FORWARD_SECRET is not set" in err
    assert f"{tmp_path}/rules/b.yaml:3: " in err and "b.secret cannot be read" in err

    monkeypatch.setenv("OUTBOX_FORWARD_SECRET", "x")
    (tmp_path / "rules/b.secret").write_text("y\n")
    assert main(["check", "--config", str(config)]) == 0
