"""Which days the daily reconciliation compares (docs/reconciliation.md, "When a day is final"):
a day whose ledger rows changed after its run is compared again, with its alerts; after an
outage every day missed is compared, as far back as `RECONCILE_DAYS_BACK`. A provider on
loopback serving each day's report, a real store on both engines, the jobs' clock set."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from tests.support.stores import StoreMaker
from worker.act.kinds import SPECS
from worker.config.settings import SchedulerSettings
from worker.dev.sandbox.envelopes import partner_ok
from worker.provider.client import ProviderClient
from worker.reconcile.daily import RECONCILE_DAYS_BACK
from worker.reconcile.metrics import MoneyMetrics
from worker.rules import RuleBook
from worker.schedule.money import MoneyJobs, money_jobs
from worker.store import findings as findings_store
from worker.store import ledger
from worker.store.deposits import CREDIT_DAY_TIME
from worker.store.sqlitestore import Store

DAY = dt.date(2026, 3, 4)
RULES = """\
wallet: "*"
rules:
  - name: every finding
    "on": [reconcile_finding]
    then:
      - alert: {severity: warning}
"""


@dataclass
class Reports:
    """The provider's daily settlement reports, by day: (transactionId, amount) records."""

    days: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/settlement/daily-records", self._report)
        app.router.add_get("/v1/wallet/asset-balance", self._balances)
        return app

    async def _balances(self, request: web.Request) -> web.Response:
        return web.json_response({"status": 200, "msg": "OK", "success": True, "data": []})

    async def _report(self, request: web.Request) -> web.Response:
        day = request.query["settlement_date"]
        records = [
            {
                "settlement_record_id": f"SR-{day}-{n}",
                "settlement_date": day,
                "record_type": "IN",
                "platform_order_id": tx,
                "asset": "USDT",
                "network": "TRON",
                "amount": amount,
                "tx_hash": f"0x{tx.lower()}",
                "reconciliation_status": "MATCHED",
            }
            for n, (tx, amount) in enumerate(self.days.get(day, []))
        ]
        data = {
            "settlement_date": day,
            "timezone": "UTC",
            "summary": {
                "opening_balance": "0",
                "closing_balance": "0",
                "total_in_amount": "0",
                "total_out_amount": "0",
                "total_fee_amount": "0",
                "net_amount": "0",
                "adjustment_amount": "0",
                "record_count": len(records),
                "matched_count": len(records),
                "mismatched_count": 0,
                "manual_review_count": 0,
            },
            "records": records,
            "page": 1,
            "page_size": 200,
            "total": len(records),
            "generated_at": f"{day}T23:59:59.000Z",
        }
        return web.json_response(partner_ok(data))


@dataclass
class Env:
    reports: Reports
    store: Store
    jobs: MoneyJobs

    def at(self, day: dt.date) -> None:
        """The jobs' clock: `day`, 03:00 UTC (after the daily minute)."""
        self.jobs.daily.now = lambda: dt.datetime.combine(day, dt.time(3), dt.UTC)

    async def book(self, tx: str, amount: str, credited: dt.datetime) -> None:
        """`tx` booked now (USDT on TRON), its credit at the provider at `credited`."""

        def write(db: Any) -> None:
            db.execute(
                "INSERT INTO deposits (transaction_id, state, fact_time) VALUES (?, ?, ?)",
                [tx, "credited", json.dumps({"credit_status": int(credited.timestamp() * 1000)})],
            )
            ledger.book_once(
                db,
                transaction_id=tx,
                wallet_id=1001,
                wallet_name="main",
                currency="USDT",
                network="TRON",
                amount=amount,
                from_address=None,
                tx_hash=f"0x{tx.lower()}",
                trigger="credited",
            )

        await self.store.write(write)

    async def runs(self) -> list[tuple[str, str]]:
        """(day, outcome) of every run, in order."""
        rows = await self.store.read(
            lambda db: db.execute("SELECT day, outcome FROM reconcile_runs ORDER BY id").fetchall()
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    async def findings(self, day: dt.date) -> list[tuple[str, str | None, str | None]]:
        """(kind, transactionId, ledger amount) of the open findings of `day`."""
        rows = await self.store.read(lambda db: findings_store.findings_of_day(db, day.isoformat()))
        return [(r["kind"], r["transaction_id"], r["ledger_amount"]) for r in rows]

    async def alerts(self) -> list[str]:
        """The detail of each alert queued, in order."""
        rows = await self.store.read(
            lambda db: db.execute(
                "SELECT params FROM actions WHERE action='alert' ORDER BY id"
            ).fetchall()
        )
        return [json.loads(r[0])["detail"] for r in rows]


@pytest.fixture
async def env(aiohttp_server: Any, make_store: StoreMaker, tmp_path: Path) -> AsyncIterator[Env]:
    reports = Reports()
    server: TestServer = await aiohttp_server(reports.app())
    client = ProviderClient(str(server.make_url("/")), "k", "s", retries=0, timeout_s=5)
    store = make_store("d.db")
    await store.open()
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    rules = RuleBook.load(path, specs=SPECS)
    jobs = money_jobs(
        client,
        store,
        lambda: rules,
        SchedulerSettings(),
        MoneyMetrics(CollectorRegistry()),
        wake=lambda: None,
        alert=None,
    )
    try:
        yield Env(reports, store, jobs)
    finally:
        await client.close()
        await store.close()


def late(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(23), dt.UTC)


async def test_a_day_booked_after_its_run_is_compared_again_and_alerted(env: Env) -> None:
    """A credit of yesterday 23:00 booked after yesterday's run (a webhook retried for hours):
    the next daily job compares that day again besides its own, finds the booking the report
    lacks and alerts it; a later job with nothing new compares only its own yesterday."""
    await env.book("TX1", "1.25", dt.datetime.combine(DAY, dt.time(9), dt.UTC))
    env.reports.days[DAY.isoformat()] = [("TX1", "1.25")]
    env.at(DAY + dt.timedelta(days=1))
    await env.jobs.coroutine("reconcile")
    assert await env.runs() == [(DAY.isoformat(), "clean")]

    await env.book("TX2", "5000", late(DAY))  # arrives after the day's run
    env.at(DAY + dt.timedelta(days=2))
    await env.jobs.coroutine("reconcile")
    nxt = (DAY + dt.timedelta(days=1)).isoformat()
    assert await env.runs() == [
        (DAY.isoformat(), "clean"),
        (DAY.isoformat(), "findings"),
        (nxt, "clean"),
    ]
    assert await env.findings(DAY) == [("missing_in_report", "TX2", "5000")]
    assert [a for a in await env.alerts() if "TX2" in a and "missing_in_report" in a]

    env.at(DAY + dt.timedelta(days=3))
    await env.jobs.coroutine("reconcile")
    assert [day for day, _ in (await env.runs())[3:]] == [(DAY + dt.timedelta(days=2)).isoformat()]


async def test_a_booking_whose_credit_moves_to_another_day_has_its_first_day_compared_again(
    env: Env,
) -> None:
    """A run compared a day with two bookings; the provider's own credit time of one of them,
    learnt later, puts it on the next day. The day it left no longer holds what its run
    compared (nothing was booked on it since): the next job compares it again and finds the
    report listing the booking the ledger now places a day later (settled on another day)."""
    await env.book("TX1", "1.25", dt.datetime.combine(DAY, dt.time(9), dt.UTC))
    await env.book("TX2", "7", dt.datetime.combine(DAY, dt.time(10), dt.UTC))
    env.reports.days[DAY.isoformat()] = [("TX1", "1.25"), ("TX2", "7")]
    env.at(DAY + dt.timedelta(days=1))
    await env.jobs.coroutine("reconcile")
    assert await env.runs() == [(DAY.isoformat(), "clean")]

    nxt = DAY + dt.timedelta(days=1)
    at_provider = int(dt.datetime.combine(nxt, dt.time(0, 30), dt.UTC).timestamp() * 1000)

    def credit_moves(db: Any) -> None:
        (times,) = db.execute(
            "SELECT fact_time FROM deposits WHERE transaction_id='TX2'"
        ).fetchone()
        moved = {**json.loads(times), CREDIT_DAY_TIME: at_provider}
        db.execute(
            "UPDATE deposits SET fact_time = ? WHERE transaction_id='TX2'", [json.dumps(moved)]
        )

    await env.store.write(credit_moves)
    env.at(DAY + dt.timedelta(days=2))
    await env.jobs.coroutine("reconcile")
    assert await env.runs() == [
        (DAY.isoformat(), "clean"),
        (DAY.isoformat(), "findings"),
        (nxt.isoformat(), "findings"),
    ]
    assert await env.findings(DAY) == [("settled_on_other_day", "TX2", "7")]
    assert await env.findings(nxt) == [("missing_in_report", "TX2", "7")]


async def test_every_day_missed_in_an_outage_is_compared_within_the_bound(env: Env) -> None:
    """The service down for days: the first daily job after it compares every day since the
    last one reconciled (a booking of a missed day found missing in its report), oldest first,
    and no day older than `RECONCILE_DAYS_BACK`; a start within the grace does the same."""
    env.at(DAY + dt.timedelta(days=1))
    await env.jobs.coroutine("reconcile")
    await env.book("TX3", "7", late(DAY + dt.timedelta(days=2)))
    env.at(DAY + dt.timedelta(days=5))
    await env.jobs.daily.reconcile_due()
    assert [day for day, _ in await env.runs()] == [
        (DAY + dt.timedelta(days=n)).isoformat() for n in (0, 1, 2, 3, 4)
    ]
    assert await env.findings(DAY + dt.timedelta(days=2)) == [("missing_in_report", "TX3", "7")]

    far = DAY + dt.timedelta(days=5 + 40)
    env.at(far)
    before = len(await env.runs())
    await env.jobs.coroutine("reconcile")
    days = [day for day, _ in (await env.runs())[before:]]
    assert days == [
        (far - dt.timedelta(days=n)).isoformat() for n in range(RECONCILE_DAYS_BACK, 0, -1)
    ]


async def test_a_day_before_any_run_without_bookings_is_not_compared(env: Env) -> None:
    """A new installation: its first daily job compares yesterday, and an earlier day only
    when it holds bookings (credits backfilled from before the first run)."""
    await env.book("TX4", "2", late(DAY - dt.timedelta(days=3)))
    env.at(DAY + dt.timedelta(days=1))
    await env.jobs.coroutine("reconcile")
    assert [day for day, _ in await env.runs()] == [
        (DAY - dt.timedelta(days=3)).isoformat(),
        DAY.isoformat(),
    ]
