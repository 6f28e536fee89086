"""The booking suites' stack (`tests/act/test_booking.py` and the suites beside it): a
programmable fake provider on loopback, a client of it, a store on the test's engine, a
processor whose rules book on credited and completed, a poller; and the records, webhooks and
reads those suites write with."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.stores import StoreMaker
from worker.act.kinds import SPECS
from worker.act.reactor import RuleReactor
from worker.clock import ms_from_iso, now_ms, utc_now
from worker.config.profiles import Profiles
from worker.config.settings import SchedulerSettings
from worker.poll.poller import Poller
from worker.provider import jsonio
from worker.provider.client import ProviderClient
from worker.provider.models import DepositOrder
from worker.rules import RuleBook
from worker.store.sqlitestore import Store, event_row
from worker.track.facts import fact_from_order
from worker.track.processor import Processor
from worker.track.tracker import Fact

FROM = "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB"
BOOK_ON_CREDITED = (
    "wallet: '*'\nrules:\n  - {name: book it, on: [credited, completed], then: [book]}\n"
)


@dataclass
class FakeProvider:
    """Answers history and transaction detail with whatever a test sets (raw JSON bytes)."""

    details: dict[str, bytes] = field(default_factory=dict)
    history: dict[str, bytes] = field(default_factory=dict)

    def app(self) -> web.Application:
        """The aiohttp app of this fake."""
        app = web.Application()
        app.router.add_get("/v1/wallet/transactions/{tx}", self._detail)
        app.router.add_get("/v1/wallet/history", self._history)
        return app

    async def _detail(self, request: web.Request) -> web.Response:
        body = self.details[request.match_info["tx"]]
        return web.Response(body=body, content_type="application/json")

    async def _history(self, request: web.Request) -> web.Response:
        empty = page_body([])
        body = self.history.get(request.query.get("whiteListStatus", ""), empty)
        return web.Response(body=body, content_type="application/json")


def order(tx: str, **changes: Any) -> dict[str, Any]:
    """A deposit order record as the provider sends it."""
    base: dict[str, Any] = {
        "transactionId": tx,
        "transactionHash": "0xhash-" + tx.lower(),
        "walletId": 1001,
        "walletName": "main",
        "currency": "USDT",
        "network": "TRON",
        "amount": "100",
        "fromAddress": FROM,
        "toAddress": "TMerchant",
        "status": "PROCESSING",
        "whiteListStatus": "init",
        "createTime": 1_700_000_000_000,
        "updateTime": 1_700_000_000_000,
    }
    base.update(changes)
    return base


def ok(data: Any) -> bytes:
    """A wallet envelope holding `data`."""
    return jsonio.dumpb({"status": 200, "msg": "OK", "success": True, "data": data})


def page_body(records: list[Any], raw: bytes | None = None) -> bytes:
    """A history page of `records` (or of the raw JSON array `raw`)."""
    head = b'{"status":200,"msg":"OK","data":{"pageNumber":1,"pageSize":50,"totalPage":1,'
    array = raw if raw is not None else jsonio.dumpb(records)
    return head + b'"totalRow":%d,"records":' % len(records) + array + b"}}"


@dataclass
class Env:
    """A fake provider, a client of it, a store, a processor with rules, a poller."""

    provider: FakeProvider
    client: ProviderClient
    store: Store
    processor: Processor
    poller: Poller
    rules_path: Path


@pytest.fixture
async def env(aiohttp_server: Any, tmp_path: Path, make_store: StoreMaker) -> AsyncIterator[Env]:
    """Everything on loopback, rules booking on credited and completed; on both stores."""
    provider = FakeProvider()
    server: TestServer = await aiohttp_server(provider.app())
    client = ProviderClient(str(server.make_url("/")), "k", "s", retries=0, timeout_s=5)
    store = make_store("d.db")
    await store.open()
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(BOOK_ON_CREDITED)
    rulebook = RuleBook.load(rules_path, specs=SPECS)
    reactor = RuleReactor(lambda: rulebook, Profiles.empty)
    processor = Processor(store, reactor=reactor)
    settings = SchedulerSettings.model_validate({"history_interval_s": 60})
    poller = Poller(client, store, processor.observe_fact, settings)
    try:
        yield Env(provider, client, store, processor, poller, rules_path)
    finally:
        await client.close()
        await store.close()


async def rows(store: Store, sql: str, *args: Any) -> list[dict[str, Any]]:
    """Rows of a query, as dicts."""
    return await store.read(lambda db: [dict(r) for r in db.execute(sql, args).fetchall()])


async def alerts(store: Store) -> list[tuple[str, str, str]]:
    """Queued alert actions: (transactionId, condition, severity)."""
    found = await rows(store, "SELECT transaction_id, params FROM actions WHERE action='alert'")
    out = []
    for r in found:
        params = jsonio.loads(r["params"])
        out.append((r["transaction_id"], params["condition"], params["severity"]))
    return out


def webhook(event_type: str, tx: str, ts: int, **data: Any) -> dict[str, Any]:
    """A deposit webhook envelope at `ts` (ms)."""
    body = {k: v for k, v in order(tx).items() if k not in ("toAddress", "createTime")}
    body.pop("updateTime")
    body.update(data)
    return {
        "eventId": uuid.uuid4().hex,
        "eventType": event_type,
        "referenceId": tx,
        "timestamp": ts,
        "data": body,
    }


async def deliver(store: Store, ev: dict[str, Any], raw: bytes | None = None) -> None:
    """Store a delivery as ingress does (received now)."""
    await store.queue_event(
        event_row(
            ev["eventId"],
            ev["eventType"],
            ev["referenceId"],
            ev["data"]["transactionId"],
            raw if raw is not None else jsonio.dumpb(ev),
            {},
            utc_now(),
        )
    )


NOW = ms_from_iso(utc_now())


def fact_of(record: dict[str, Any]) -> Fact:
    """The fact a polled record states."""
    return fact_from_order(
        DepositOrder.model_validate(record), sent_at=record.get("updateTime") or now_ms()
    )
