"""One reconciliation run against reports the sandbox cannot produce (a summary that counts what
no record says, records of other types, a report that changes or loses a page while read, zone
names, ledger rows of other days) from a provider on loopback, with a real store: what the run
stores (findings, its record), the alerts it queues and whom it wakes (docs/reconciliation.md)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from tests.support.stores import StoreMaker
from worker.act.kinds import SPECS
from worker.clock import now_ms
from worker.dev.sandbox.envelopes import partner_ok
from worker.provider.client import ProviderClient
from worker.provider.models import DepositOrder
from worker.reconcile.reconciler import Reconciler, finding_fields
from worker.rules import RuleBook
from worker.store import findings as findings_store
from worker.store import ledger
from worker.store.findings import Finding
from worker.store.meta import set_meta
from worker.store.sqlitestore import Store
from worker.track.facts import fact_from_order
from worker.track.processor import Processor

DAY = dt.date(2026, 3, 4)
HASH = "0x" + "ab" * 32
RULES = """\
wallet: "*"
rules:
  - name: every finding
    "on": [reconcile_finding]
    then:
      - alert: {severity: warning}
  - name: large amounts
    "on": [reconcile_finding]
    if: {amount: {gt: "100"}}
    then:
      - alert: {severity: critical}
"""


def record(tx: str | None, number: int, **changes: Any) -> dict[str, Any]:
    """A report record of 1.25 USDT on TRON, txHash HASH, MATCHED, of deposit `tx`."""
    base: dict[str, Any] = {
        "settlement_record_id": f"SR{number}",
        "settlement_date": DAY.isoformat(),
        "record_type": "IN",
        "platform_order_id": tx,
        "asset": "USDT",
        "network": "TRON",
        "amount": "1.25",
        "tx_hash": HASH,
        "reconciliation_status": "MATCHED",
    }
    base.update(changes)
    return base


@dataclass
class FakeReport:
    """The provider's daily settlement report, as a test sets it: its records, the summary's
    mismatched and manual-review counts, its zone, the total it claims."""

    records: list[dict[str, Any]] = field(default_factory=list)
    mismatched: int = 0
    review: int = 0
    timezone: str = "UTC"
    total: int | None = None
    changes_after_page_1: bool = False
    down: bool = False
    asked: list[dict[str, str]] = field(default_factory=list)
    balances: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def app(self) -> web.Application:
        """The aiohttp app of this provider."""
        app = web.Application()
        app.router.add_get("/api/v1/settlement/daily-records", self._report)
        app.router.add_get("/v1/wallet/asset-balance", self._balances)
        return app

    async def _balances(self, request: web.Request) -> web.Response:
        data = self.balances.get(request.query["walletId"], [])
        return web.json_response({"status": 200, "msg": "OK", "success": True, "data": data})

    async def _report(self, request: web.Request) -> web.Response:
        if self.down:
            return web.Response(status=503, text="down")
        q = request.query
        self.asked.append(dict(q))
        page, size = int(q["page"]), int(q["page_size"])
        mismatched = self.mismatched + (1 if self.changes_after_page_1 and page > 1 else 0)
        data = {
            "settlement_date": q["settlement_date"],
            "timezone": self.timezone,
            "summary": {
                "opening_balance": "0",
                "closing_balance": "0",
                "total_in_amount": "0",
                "total_out_amount": "0",
                "total_fee_amount": "0",
                "net_amount": "0",
                "adjustment_amount": "0",
                "record_count": len(self.records),
                "matched_count": 0,
                "mismatched_count": mismatched,
                "manual_review_count": self.review,
            },
            "records": self.records[(page - 1) * size : page * size],
            "page": page,
            "page_size": size,
            "total": len(self.records) if self.total is None else self.total,
            "generated_at": "2026-03-05T00:00:00.000Z",
        }
        return web.json_response(partner_ok(data))


@dataclass
class Env:
    """A provider serving the report, a store, a reconciler reading two records a page."""

    report: FakeReport
    client: ProviderClient
    store: Store
    rules: RuleBook
    woken: list[int]

    def reconciler(self, **kw: Any) -> Reconciler:
        """A reconciler of this provider and store (two records a page, at most ten pages,
        unless told)."""
        kw.setdefault("page_size", 2)
        kw.setdefault("max_pages", 10)
        return Reconciler(
            self.client,
            self.store,
            lambda: self.rules,
            after_commit=lambda: self.woken.append(1),
            **kw,
        )

    async def book(
        self, tx: str, day: dt.date = DAY, amount: str = "1.25", tx_hash: str | None = HASH
    ) -> None:
        """A ledger row of `tx` (USDT on TRON) booked on `day` (no credit time known)."""

        def write(db: Any) -> None:
            ledger.book_once(
                db,
                transaction_id=tx,
                wallet_id=1001,
                wallet_name="main",
                currency="USDT",
                network="TRON",
                amount=amount,
                from_address=None,
                tx_hash=tx_hash,
                trigger="credited",
            )
            db.execute(
                "UPDATE ledger SET booked_at = ? WHERE transaction_id = ?",
                [f"{day.isoformat()}T12:00:00.000Z", tx],
            )

        await self.store.write(write)

    async def findings(self, day: dt.date = DAY) -> list[tuple[Any, ...]]:
        """(kind, subject, transactionId, ledger amount, report amount) of the open findings."""
        rows = await self.store.read(lambda db: findings_store.findings_of_day(db, day.isoformat()))
        return [
            (r["kind"], r["subject"], r["transaction_id"], r["ledger_amount"], r["report_amount"])
            for r in rows
        ]

    async def alerts(self) -> list[tuple[str, str, str]]:
        """(condition, severity, detail) of each queued alert, in order."""

        def read(db: Any) -> list[tuple[str, str, str]]:
            rows = db.execute("SELECT params FROM actions WHERE action='alert' ORDER BY id")
            return [
                (p["condition"], p["severity"], p["detail"])
                for p in (json.loads(r[0]) for r in rows)
            ]

        return await self.store.read(read)

    async def last_run(self) -> dict[str, Any]:
        """The latest run's record."""
        run = await self.store.read(findings_store.last_run)
        assert run is not None
        return run


@pytest.fixture
async def env(
    aiohttp_server: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Env]:
    """The provider on loopback, a SQLite store, the rules alerting every finding."""
    report = FakeReport()
    server: TestServer = await aiohttp_server(report.app())
    client = ProviderClient(str(server.make_url("/")), "k", "s", retries=0, timeout_s=5)
    store = StoreMaker("sqlite", tmp_path, request)("d.db")
    await store.open()
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    try:
        yield Env(report, client, store, RuleBook.load(path, specs=SPECS), [])
    finally:
        await client.close()
        await store.close()


async def test_a_record_booked_on_another_day_is_compared_there_not_missing(env: Env) -> None:
    """Records whose deposits the ledger books on other days (found by id; by txHash, in
    another case, for a record without an id): `settled_on_other_day` and, where the amounts
    differ, `amount_differs`; never `missing_in_ledger`. The day's own row matches."""
    await env.book("TX1")
    await env.book("TX2", day=DAY - dt.timedelta(days=1), amount="7")
    await env.book("TX3", day=DAY + dt.timedelta(days=1), tx_hash="0xbeef")
    env.report.records = [
        record("TX1", 1),
        record("TX2", 2, amount="7.00"),
        record(None, 3, tx_hash="0xBEEF", amount="2"),
    ]
    result = await env.reconciler().run(DAY)
    assert result.outcome == "findings"
    assert [f.detail for f in result.findings if f.kind == "settled_on_other_day"] == [
        f"the ledger books TX2 on {DAY - dt.timedelta(days=1)}",
        f"the ledger books TX3 on {DAY + dt.timedelta(days=1)}",
    ]
    assert await env.findings() == [
        ("settled_on_other_day", "TX2", "TX2", "7", "7.00"),
        ("settled_on_other_day", "record:SR3", "TX3", "1.25", "2"),
        ("amount_differs", "record:SR3", "TX3", "1.25", "2"),
    ]


async def test_a_record_without_an_id_or_tx_hash_is_missing_in_ledger(env: Env) -> None:
    """Nothing to look it up by: money the books do not hold."""
    env.report.records = [record(None, 1, tx_hash=None)]
    await env.reconciler().run(DAY)
    assert await env.findings() == [("missing_in_ledger", "record:SR1", None, None, "1.25")]


async def test_the_summary_counts_are_findings_alerted_and_counted_in_the_run(env: Env) -> None:
    """The report's summary counts one record mismatched and two in review while every record
    says MATCHED: one finding each, each alerted once with its text; the run's record counts
    two findings; the alerts' sender is woken."""
    await env.book("TX1")
    env.report.records = [record("TX1", 1)]
    env.report.mismatched, env.report.review = 1, 2
    with capture_logs() as logs:
        result = await env.reconciler().run(DAY)
    assert [e["event"] for e in logs] == ["reconciliation started", "reconciliation done"]
    assert {k: v for k, v in logs[1].items() if k not in ("event", "log_level")} == {
        "day": DAY.isoformat(),
        "outcome": "findings",
        "findings": 2,
        "newFindings": 2,
        "provider_mismatch": 1,
        "provider_review": 1,
    }
    assert [(f.kind, f.subject) for f in result.findings] == [
        ("provider_mismatch", "summary"),
        ("provider_review", "summary"),
    ]
    assert await env.findings() == [
        ("provider_mismatch", "summary", None, None, None),
        ("provider_review", "summary", None, None, None),
    ]
    [first, second] = await env.alerts()
    assert first[:2] == ("reconcile_finding", "warning")
    assert first[2].endswith(
        f"({DAY}): provider_mismatch, the report's summary counts 1 record(s) mismatch"
    )
    assert second[2].endswith(
        f"({DAY}): provider_review, the report's summary counts 2 record(s) review"
    )
    run = await env.last_run()
    assert (run["day"], run["outcome"], run["findings"], run["error"]) == (
        DAY.isoformat(),
        "findings",
        2,
        None,
    )
    assert run["started_at"] <= run["finished_at"]  # when it ran, as `status` shows it
    assert env.woken == [1]


async def test_an_alert_names_the_finding_its_ids_amounts_and_asset(env: Env) -> None:
    """The alert of an amount difference says which finding, of which deposit and txHash, both
    amounts, currency and network; a rule on the finding's amount sees the report's amount, and
    the ledger's when the report has none."""
    await env.book("TX1")
    await env.book("TX2", amount="500")
    env.report.records = [record("TX1", 1, amount="250")]
    await env.reconciler().run(DAY)
    rows = await env.store.read(lambda db: findings_store.findings_of_day(db, DAY.isoformat()))
    ids = {r["kind"]: r["id"] for r in rows}
    # Each finding is alerted on its own (the sender sends one alert per `once_per`).
    onces = await env.store.read(
        lambda db: [
            json.loads(r[0])["once_per"]
            for r in db.execute("SELECT params FROM actions WHERE action='alert'")
        ]
    )
    assert len(set(onces)) == 4
    assert await env.alerts() == [
        (
            "reconcile_finding",
            "warning",
            f"finding {ids['amount_differs']} ({DAY}): amount_differs, transactionId TX1,"
            f" txHash {HASH}, ledger 1.25, report 250, currency USDT, network TRON",
        ),
        (
            "reconcile_finding",
            "critical",
            f"finding {ids['amount_differs']} ({DAY}): amount_differs, transactionId TX1,"
            f" txHash {HASH}, ledger 1.25, report 250, currency USDT, network TRON",
        ),
        (
            "reconcile_finding",
            "warning",
            f"finding {ids['missing_in_report']} ({DAY}): missing_in_report, transactionId TX2,"
            f" txHash {HASH}, ledger 500, currency USDT, network TRON",
        ),
        (
            "reconcile_finding",
            "critical",
            f"finding {ids['missing_in_report']} ({DAY}): missing_in_report, transactionId TX2,"
            f" txHash {HASH}, ledger 500, currency USDT, network TRON",
        ),
    ]


async def test_a_rerun_finding_the_same_alerts_and_wakes_nothing(env: Env) -> None:
    """Run again with the same difference: no new alert and nobody woken; a clean day wakes
    nobody either; the runs' records say what each found."""
    await env.book("TX1")
    env.report.records = [record("TX1", 1, amount="2")]
    reconciler = env.reconciler()
    await reconciler.run(DAY)
    assert len(await env.alerts()) == 1 and env.woken == [1]
    await reconciler.run(DAY)
    assert len(await env.alerts()) == 1 and env.woken == [1]
    assert (await env.last_run())["findings"] == 1
    env.report.records = [record("TX1", 1)]
    result = await reconciler.run(DAY)
    assert (result.outcome, result.findings) == ("clean", [])
    assert env.woken == [1]
    assert await env.findings() == []
    run = await env.last_run()
    assert (run["outcome"], run["findings"]) == ("clean", 0)


async def test_only_in_records_are_compared(env: Env) -> None:
    """OUT records (money that left) are not compared; a record without a type, or typed in
    lower case, is an IN record."""
    await env.book("TX1")
    await env.book("TX2")
    env.report.records = [
        record("TX9", 9, record_type="OUT"),
        record("TX1", 1, record_type=None),
        record("TX2", 2, record_type="in"),
    ]
    result = await env.reconciler().run(DAY)
    assert (result.outcome, result.findings) == ("clean", [])


async def test_a_report_read_over_many_pages_is_read_whole(env: Env) -> None:
    """Five records, two a page: all read (clean), each page asked for the UTC day's IN
    records."""
    for i in range(5):
        await env.book(f"TX{i}")
    env.report.records = [record(f"TX{i}", i) for i in range(5)]
    result = await env.reconciler().run(DAY)
    assert (result.outcome, result.findings) == ("clean", [])
    assert [q["page"] for q in env.report.asked] == ["1", "2", "3"]
    assert {(q["timezone"], q["record_type"], q["settlement_date"]) for q in env.report.asked} == {
        ("UTC", "IN", DAY.isoformat())
    }


async def failed(env: Env, reconciler: Reconciler, error: str) -> None:
    """The run fails naming `error`: nothing stored but the failed run, one reconcile_failed
    alert for the day however often it fails, the alerts' sender woken."""
    first: str | None = None
    for attempt in (1, 2):
        with capture_logs() as logs:
            result = await reconciler.run(DAY)
        assert (result.day, result.outcome, result.findings) == (DAY.isoformat(), "failed", [])
        assert [(e["event"], e["day"], e.get("error")) for e in logs] == [
            ("reconciliation started", DAY.isoformat(), None),
            (
                "reconciliation failed; nothing recorded but the failure",
                DAY.isoformat(),
                result.error,
            ),
        ]
        assert error in (result.error or "")
        first = first or result.error
        assert await env.findings() == []
        run = await env.last_run()
        assert (run["outcome"], run["findings"]) == ("failed", 0)
        assert error in run["error"]
        assert run["started_at"] <= run["finished_at"]  # when it ran, as `status` shows it
        assert await env.alerts() == [
            ("reconcile_failed", "warning", f"reconciliation of {DAY} failed: {first}")
        ]
        assert len(env.woken) == attempt


async def test_a_report_that_changes_while_read_fails_the_run(env: Env) -> None:
    """The summary on page 2 is not page 1's: nothing compared, the run fails."""
    for i in range(3):
        await env.book(f"TX{i}")
    env.report.records = [record(f"TX{i}", i, amount="9") for i in range(3)]
    env.report.changes_after_page_1 = True
    await failed(env, env.reconciler(), "ReportUnreadable: the report changed while it was read")


async def test_a_report_listing_more_than_it_serves_fails_the_run(env: Env) -> None:
    """The report claims six records and serves five: not read whole, the run fails."""
    env.report.records = [record(f"TX{i}", i) for i in range(5)]
    env.report.total = 6
    await failed(env, env.reconciler(), "the report lists 6 records, 5 were read")


async def test_a_report_longer_than_the_page_cap_fails_the_run(env: Env) -> None:
    """Five records, two a page, at most two pages read: the run fails rather than call the
    unread records missing."""
    for i in range(5):
        await env.book(f"TX{i}")
    env.report.records = [record(f"TX{i}", i) for i in range(5)]
    await failed(env, env.reconciler(max_pages=2), "the report lists 5 records, 4 were read")


async def test_a_provider_outage_fails_the_run(env: Env) -> None:
    """The report not served: the run fails, recorded and alerted once."""
    env.report.down = True
    await failed(env, env.reconciler(), "ProviderUnavailable")


async def test_a_failed_day_alerts_once_per_day(env: Env) -> None:
    """Another day's failure is alerted too."""
    env.report.down = True
    reconciler = env.reconciler()
    await reconciler.run(DAY)
    await reconciler.run(DAY + dt.timedelta(days=1))
    await reconciler.run(DAY)
    alerts = await env.alerts()
    assert [a[2].split(" failed")[0] for a in alerts] == [
        f"reconciliation of {DAY}",
        f"reconciliation of {DAY + dt.timedelta(days=1)}",
    ]


@pytest.mark.parametrize("zone", ["UTC", "utc", " Etc/UTC ", "GMT", "Etc/GMT", "Z"])
async def test_a_report_in_utc_under_any_of_its_names_is_compared(env: Env, zone: str) -> None:
    """UTC however the provider writes it: the day is compared (a difference is found)."""
    await env.book("TX1")
    env.report.records = [record("TX1", 1, amount="2")]
    env.report.timezone = zone
    result = await env.reconciler().run(DAY)
    assert [f.kind for f in result.findings] == ["amount_differs"]


async def test_a_report_in_another_zone_fails_the_run(env: Env) -> None:
    """A report of another zone's day compares other hours: the run fails naming the zone."""
    await env.book("TX1")
    env.report.records = [record("TX1", 1)]
    env.report.timezone = "Europe/Berlin"
    await failed(env, env.reconciler(), "the report is in timezone 'Europe/Berlin', not UTC")


# --- held balances --------------------------------------------------------------------------

NOON = int(dt.datetime(2026, 3, 4, 12, tzinfo=dt.UTC).timestamp() * 1000)


async def hold(env: Env, tx: str, amount: str, wallet: int = 1001) -> None:
    """A deposit of `amount` USDT in `wallet`, processing (its funds held by the provider)."""
    order = {
        "transactionId": tx,
        "transactionHash": "0x" + tx.lower(),
        "walletId": wallet,
        "currency": "USDT",
        "network": "TRON",
        "amount": amount,
        "status": "PROCESSING",
        "createTime": NOON,
        "updateTime": NOON,
    }
    await Processor(env.store).observe_fact(
        fact_from_order(DepositOrder.model_validate(order), sent_at=now_ms())
    )


def balance(wallet: int, unavailable: str, currency: str = "USDT") -> dict[str, Any]:
    """One asset-balance row."""
    return {"walletId": wallet, "currency": currency, "available": "0", "unavailable": unavailable}


async def drifts(env: Env, reconciler: Reconciler) -> list[tuple[Any, ...]]:
    """Run; (day, subject, wallet, currency, ledger amount, report amount) of each drift."""
    result = await reconciler.run(DAY)
    return [
        (f.day, f.subject, f.wallet_id, f.currency, f.ledger_amount, f.report_amount)
        for f in result.findings
        if f.kind == "held_balance_drift"
    ]


async def test_held_balances_equal_to_the_deposits_held_are_no_drift(env: Env) -> None:
    """Two deposits held in one wallet (1.5 + 2.5) against an unavailable balance of 4.0
    written in lower case: no drift however long it lasts."""
    await hold(env, "TXA", "1.5")
    await hold(env, "TXB", "2.5")
    env.report.balances = {
        "1001": [balance(1001, "4.0", currency="usdt"), balance(1001, "0", currency="ETH")]
    }
    at = [NOON]
    reconciler = env.reconciler(drift_after_s=60, clock=lambda: at[0])
    for _ in range(3):
        assert await drifts(env, reconciler) == []
        at[0] += 3_600_000


async def test_a_drift_in_a_currency_nothing_is_held_in_is_found(env: Env) -> None:
    """USDT agrees, nothing is held in ETH and none unavailable, 3 BTC unavailable with no BTC
    deposit held: the BTC drift is found (held 0), the others are not."""
    await hold(env, "TXA", "4")
    env.report.balances = {
        "1001": [
            balance(1001, "4"),
            balance(1001, "0", currency="ETH"),
            balance(1001, "3", currency="BTC"),
        ]
    }
    at = [NOON]
    reconciler = env.reconciler(drift_after_s=60, clock=lambda: at[0])
    assert await drifts(env, reconciler) == []
    at[0] += 60_000
    assert await drifts(env, reconciler) == [(DAY.isoformat(), "1001:BTC", 1001, "BTC", "0", "3")]


async def test_a_drift_is_dated_the_utc_day_whatever_the_machine_zone(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine whose local zone is UTC+14 a drift read at 12:00 UTC is of that UTC day,
    not of the local one."""
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    try:
        await hold(env, "TXA", "4")
        env.report.balances = {"1001": [balance(1001, "5")]}
        at = [NOON]
        reconciler = env.reconciler(drift_after_s=60, clock=lambda: at[0])
        await drifts(env, reconciler)
        at[0] += 60_000
        assert [d[0] for d in await drifts(env, reconciler)] == [DAY.isoformat()]
    finally:
        monkeypatch.undo()
        time.tzset()


async def test_a_drift_is_a_finding_once_it_lasted_drift_after_s(env: Env) -> None:
    """Held 4, unavailable 5: not a finding on the first check nor one that comes a moment
    too early, a finding once it lasted `drift_after_s` (dated the day read, alerted naming
    the wallet); resolved once the balance agrees again."""
    await hold(env, "TXA", "1.5")
    await hold(env, "TXB", "2.5")
    await hold(env, "TXC", "9", wallet=1002)
    env.report.balances = {"1001": [balance(1001, "5")], "1002": [balance(1002, "9")]}
    at = [NOON]
    reconciler = env.reconciler(drift_after_s=60, clock=lambda: at[0])
    assert await drifts(env, reconciler) == []
    at[0] += 59_999
    assert await drifts(env, reconciler) == []
    at[0] += 1
    assert await drifts(env, reconciler) == [
        (DAY.isoformat(), "1001:USDT", 1001, "USDT", "4.0", "5")
    ]
    [*_, alert] = await env.alerts()
    assert "held_balance_drift, wallet 1001, ledger 4.0, report 5, currency USDT" in alert[2]
    assert alert[2].endswith("unavailable balance differs from the deposits held")
    env.report.balances["1001"] = [balance(1001, "4")]
    at[0] += 1
    assert await drifts(env, reconciler) == []
    assert [f[0] for f in await env.findings()] == []


@pytest.mark.parametrize("stored", ["not json", "[1]", '{"1001:USDT": "5"}', '{"1001:USDT": true}'])
async def test_a_drift_stored_in_another_form_counts_from_now(env: Env, stored: str) -> None:
    """What an earlier version (or a damaged row) left as the drift's start is read as a drift
    first seen now: no finding until it lasted `drift_after_s`, and the run does not fail."""
    await hold(env, "TXA", "4")
    env.report.balances = {"1001": [balance(1001, "5")]}
    await env.store.write(lambda db: set_meta(db, "held_balance_drift", stored))
    at = [NOON]
    reconciler = env.reconciler(drift_after_s=60, clock=lambda: at[0])
    assert await drifts(env, reconciler) == []
    at[0] += 60_000
    assert [d[1] for d in await drifts(env, reconciler)] == ["1001:USDT"]


async def test_a_drift_seen_before_a_restart_counts_from_when_it_was_first_seen(env: Env) -> None:
    """The first sighting is stored with the run: a new reconciler (a restart) finds the drift
    once it lasted `drift_after_s` since then."""
    await hold(env, "TXA", "4")
    env.report.balances = {"1001": [balance(1001, "5")]}
    at = [NOON]
    assert await drifts(env, env.reconciler(drift_after_s=60, clock=lambda: at[0])) == []
    at[0] += 60_000
    assert len(await drifts(env, env.reconciler(drift_after_s=60, clock=lambda: at[0]))) == 1


def test_a_finding_as_reconcile_json_and_rule_conditions_show_it() -> None:
    """A finding (as found, or as stored) shown with its day, kind, ids, both amounts, currency
    and network; `amount` (what a rule's amount condition reads) is the report's amount, or
    the ledger's when the report has none."""
    found = Finding(
        day="2026-03-04",
        kind="amount_differs",
        subject="TX1",
        transaction_id="TX1",
        tx_hash=HASH,
        ledger_amount="1.25",
        report_amount="2",
        currency="USDT",
        network="TRON",
    )
    shown = {
        "date": "2026-03-04",
        "kind": "amount_differs",
        "transactionId": "TX1",
        "txHash": HASH,
        "ledgerAmount": "1.25",
        "reportAmount": "2",
        "currency": "USDT",
        "network": "TRON",
        "amount": "2",
    }
    assert finding_fields(found) == shown
    stored = {"id": 7, "first_seen": "2026-03-05T02:30:00.000Z", **vars(found)}
    assert finding_fields(stored) == shown
    missing = {**stored, "kind": "missing_in_report", "report_amount": None}
    assert finding_fields(missing) == {
        **shown,
        "kind": "missing_in_report",
        "reportAmount": None,
        "amount": "1.25",
    }


async def test_the_done_log_line_counts_the_findings_of_each_kind(env: Env) -> None:
    """Two rows unreported and one amount difference: the log line says 3 findings, 2
    missing in the report and 1 amount difference, 3 of them new; the second run 0 new."""
    for tx in ("TX1", "TX2", "TX3"):
        await env.book(tx)
    env.report.records = [record("TX1", 1, amount="2")]
    reconciler = env.reconciler()
    for new in (3, 0):
        with capture_logs() as logs:
            await reconciler.run(DAY)
        [done] = [e for e in logs if e["event"] == "reconciliation done"]
        assert (done["findings"], done["newFindings"]) == (3, new)
        assert (done["missing_in_report"], done["amount_differs"]) == (2, 1)
