"""A provider answer that is wrong cannot make depositd page without end, store a row per poll,
read an answer of any size, or send an id that changes the request path.

The provider here is a small programmable aiohttp app on loopback that answers the bad thing.
"""

from __future__ import annotations

import contextlib
import itertools
import tracemalloc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer
from structlog.testing import capture_logs

from worker.config.settings import SchedulerSettings
from worker.errors import ProviderProtocolError, ProviderRequestRefused
from worker.poll.poller import Poller
from worker.provider import jsonio
from worker.provider.client import ProviderClient
from worker.provider.models import CreditStatus, OrderStatus, WhiteListStatus
from worker.store.sqlitestore import Store
from worker.track.processor import Processor
from worker.track.tracker import Fact

MIB = 1024 * 1024


def record(tx: str, white: str = "init") -> dict[str, Any]:
    """One history record as the provider shows it."""
    return {
        "transactionId": tx,
        "transactionHash": f"0x{tx}",
        "walletId": 1001,
        "currency": "USDT",
        "network": "TRON",
        "amount": "25",
        "fromAddress": "TAddr",
        "status": "PROCESSING",
        "whiteListStatus": white,
        "createTime": 1_700_000_000_000,
        "updateTime": 1_700_000_000_000,
    }


def ok(data: Any) -> web.Response:
    """The wallet envelope of a success."""
    body = {"status": 200, "code": None, "msg": "OK", "traceId": "t", "data": data}
    return web.Response(body=jsonio.dumpb(body), content_type="application/json")


def page(records: list[dict[str, Any]], number: int, total: int) -> dict[str, Any]:
    """A history page claiming `total` pages."""
    return {
        "pageNumber": number,
        "pageSize": 50,
        "totalPage": total,
        "totalRow": total * 50,
        "records": records,
    }


@dataclass
class FakeProvider:
    """Answers history with `history(status, page_num)`; records every request's raw path."""

    history: Callable[[str, int], dict[str, Any]]
    requests: list[tuple[str, str]] = field(default_factory=list)

    def app(self) -> web.Application:
        async def history(request: web.Request) -> web.Response:
            status = request.query.get("whiteListStatus", "")
            return ok(self.history(status, int(request.query.get("pageNum", "1"))))

        async def anything(request: web.Request) -> web.StreamResponse:
            self.requests.append((request.method, request.raw_path))
            if request.path.startswith("/v1/wallet/history"):
                return await history(request)
            return ok(record(request.match_info["tail"].rsplit("/", 1)[-1]))

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", anything)
        return app


@dataclass
class Env:
    """A fake provider, a client of it, a store and a poller feeding a processor."""

    fake: FakeProvider
    client: ProviderClient
    store: Store

    def poller(self, **scheduler: Any) -> Poller:
        """A history poller with these scheduler settings."""
        processor = Processor(self.store)
        settings = SchedulerSettings(**scheduler)
        return Poller(self.client, self.store, processor.observe_fact, settings)

    def history_calls(self, status: str) -> int:
        """How many history pages of one queue were asked for."""
        return sum(1 for _, path in self.fake.requests if f"whiteListStatus={status}" in path)

    async def facts(self) -> dict[str, int]:
        """Stored facts per deposit."""
        rows = await self.store.read(
            lambda db: db.execute(
                "SELECT transaction_id, COUNT(*) FROM facts GROUP BY transaction_id"
            ).fetchall()
        )
        return {str(tx): int(n) for tx, n in rows}


@pytest.fixture
async def make_env(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> AsyncIterator[Callable[..., Any]]:
    """Start a fake provider answering history with the given function."""
    made: list[Env] = []

    async def make(history: Callable[[str, int], dict[str, Any]]) -> Env:
        fake = FakeProvider(history)
        server = await aiohttp_server(fake.app())
        client = ProviderClient(str(server.make_url("/")), "k", "s", retries=0, timeout_s=30)
        store = Store(tmp_path / f"depositd{len(made)}.db")
        await store.open()
        made.append(Env(fake, client, store))
        return made[-1]

    yield make
    for env in made:
        await env.client.close()
        await env.store.close()


def rejected_page(status: str, number: int) -> dict[str, Any] | None:
    """The rejected queue: one deposit on one page."""
    return page([record("tx-rejected", "rejected")], 1, 1) if status == "rejected" else None


async def test_a_page_repeating_the_previous_one_ends_the_poll_and_rejected_is_read(
    make_env: Callable[..., Any],
) -> None:
    """A huge totalPage answering the same records on every page stops at the second page with
    a log line, and the rejected queue is still read in the same run."""

    def history(status: str, number: int) -> dict[str, Any]:
        same = [record(f"tx-{n}") for n in range(3)]
        return rejected_page(status, number) or page(same, number, 1_000_000)

    env = await make_env(history)
    with capture_logs() as logs:
        seen = await env.poller().poll_history()
    assert env.history_calls("init") == 2
    assert env.history_calls("rejected") == 1
    assert seen == 4
    assert any(e["event"] == "paging stopped: page repeats the previous one" for e in logs)
    assert "tx-rejected" in await env.facts()


async def test_endless_distinct_pages_stop_at_the_page_cap_and_rejected_is_read(
    make_env: Callable[..., Any],
) -> None:
    """A provider paging on and on with new records is read to `scheduler.max_pages` pages per
    run, logged, and the rejected queue is read in the same run."""
    counter = itertools.count()

    def history(status: str, number: int) -> dict[str, Any]:
        fresh = [record(f"tx-{next(counter)}")]
        return rejected_page(status, number) or page(fresh, number, 1_000_000)

    env = await make_env(history)
    with capture_logs() as logs:
        await env.poller(max_pages=7).poll_history()
    assert env.history_calls("init") == 7
    assert env.history_calls("rejected") == 1
    capped = [e for e in logs if e["event"].startswith("paging stopped at the page cap")]
    assert [(e["paged"], e["pages"]) for e in capped] == [("history init", 7)]
    assert "tx-rejected" in await env.facts()


async def test_a_poll_repeating_the_same_record_stores_no_new_fact(
    make_env: Callable[..., Any],
) -> None:
    """Polling the same unchanged record ten times stores one fact; a record that changes is
    stored (a fact that changes something is never dropped)."""
    state = {"status": "PROCESSING", "white": "init"}

    def history(status: str, number: int) -> dict[str, Any]:
        if status != "init":
            return page([], 1, 1)
        changed = {**record("tx-1"), "whiteListStatus": state["white"], "status": state["status"]}
        return page([changed], 1, 1)

    env = await make_env(history)
    poller = env.poller()
    for _ in range(10):
        await poller.poll_history()
    assert await env.facts() == {"tx-1": 1}
    state["white"] = "rejected"
    for _ in range(3):
        await poller.poll_history()
    assert await env.facts() == {"tx-1": 2}
    changed = await env.store.read(
        lambda db: [r[0] for r in db.execute("SELECT changed FROM facts ORDER BY id")]
    )
    assert changed == [1, 1]


@pytest.fixture
async def huge_answer(aiohttp_server: AiohttpServer) -> str:
    """A provider whose transaction detail streams a 50 MB answer (no Content-Length)."""

    async def streamed(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"status": 200, "msg": "OK", "data": {"failMessage": "')
        chunk = b"x" * MIB
        with contextlib.suppress(ConnectionError):  # the client hangs up: what it should do
            for _ in range(50):
                await resp.write(chunk)
            await resp.write(b'"}}')
        return resp

    app = web.Application()
    app.router.add_get("/v1/wallet/transactions/streamed", streamed)
    server = await aiohttp_server(app)
    return str(server.make_url("/"))


async def test_a_50_mb_answer_is_a_protocol_error_read_within_the_cap(huge_answer: str) -> None:
    """A 50 MB answer is refused as a protocol error naming the limit, without ever holding
    the answer in memory (peak far below its size)."""
    client = ProviderClient(huge_answer, "k", "s", retries=0, timeout_s=60, max_answer_bytes=MIB)
    tracemalloc.start()
    try:
        with pytest.raises(ProviderProtocolError, match=r"provider\.max_answer_bytes") as info:
            await client.transaction_detail("streamed")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await client.close()
    assert info.value.endpoint == "transaction_detail"
    assert peak < 10 * MIB


async def test_the_default_cap_refuses_an_answer_by_its_content_length(
    aiohttp_server: AiohttpServer,
) -> None:
    """An answer declaring more than the 16 MiB default is refused before its body is read."""

    async def declared(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.content_length = 400 * MIB
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            await resp.write(b"{" + b" " * MIB)
        return resp

    app = web.Application()
    app.router.add_get("/v1/wallet/transactions/big", declared)
    server = await aiohttp_server(app)
    async with ProviderClient(str(server.make_url("/")), "k", "s", retries=0) as client:
        with pytest.raises(ProviderProtocolError, match=f"{16 * MIB} bytes"):
            await client.transaction_detail("big")


@pytest.mark.parametrize("bad", [".", "..", ""])
async def test_a_dot_or_empty_id_is_refused_and_nothing_is_sent(
    make_env: Callable[..., Any], bad: str
) -> None:
    """A transactionId or address id of `.`, `..` or empty is a clear error and sends nothing
    (`/transactions/../submit` would reach another endpoint on a normalising server)."""
    env = await make_env(lambda status, number: page([], 1, 1))
    calls: list[Callable[[], Any]] = [
        lambda: env.client.submit_payer(bad, {"name": "x"}, idempotency_key="k1"),
        lambda: env.client.transaction_detail(bad),
        lambda: env.client.address_detail(bad),
        lambda: env.client.disable_address(bad, idempotency_key="k2"),
    ]
    for call in calls:
        with pytest.raises(ProviderRequestRefused, match="nothing sent"):
            await call()
    assert env.fake.requests == []


async def test_every_id_segment_is_percent_encoded(make_env: Callable[..., Any]) -> None:
    """An id holding `/`, `?` or `%` stays one path segment of the request sent."""
    env = await make_env(lambda status, number: page([], 1, 1))
    await env.client.submit_payer("a/../b?c=%d", {"name": "x"}, idempotency_key="k")
    assert env.fake.requests == [
        ("POST", "/v1/wallet/deposit-whitelist/transactions/a%2F..%2Fb%3Fc%3D%25d/submit")
    ]


async def test_a_deposit_with_a_dot_dot_id_is_never_submitted_and_a_human_is_told(
    start_stack: Callable[..., Any],
) -> None:
    """A deposit whose transactionId is `..` needing details: the submission fails at once with
    "nothing sent" (no retry) and a critical alert goes out, instead of posting a payer profile
    to `/transactions/../submit`."""
    stack = await start_stack(scheduler=False)
    fact = Fact(
        transaction_id="..",
        source="poll",
        observed_at=1_700_000_000_000,
        status=OrderStatus.PROCESSING,
        white_list_status=WhiteListStatus.INIT,
        credit_status=CreditStatus.PENDING,
        wallet_id=1002,
        currency="USDT",
        network="TRON",
        amount=Decimal("5"),
        from_address="TDotDotUnknownAddress000000000001",
    )
    await stack.processor.observe_fact(fact)

    async def refused() -> bool:
        rows = [a for a in await stack.actions("..") if a["action"] == "submit_profile"]
        return bool(rows) and rows[0]["status"] == "failed"

    await stack.wait_for(refused, what="submission refused")
    [row] = [a for a in await stack.actions("..") if a["action"] == "submit_profile"]
    assert "nothing sent" in str(row["outcome"]) and row["attempts"] == 1
    await stack.wait_for(
        lambda: any("submit_refused" in str(p) for p in stack.slack), what="critical alert"
    )
