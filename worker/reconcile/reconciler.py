"""Reconciliation: one day of the ledger against the provider's daily settlement report and
its asset balances.

The report (asked for UTC days) is read page by page (one page in memory) and compared with the
ledger rows of the day (`worker.reconcile.matching`: by id, then txHash; amount, asset, network and
txHash compared, amounts as exact decimals). A run writes everything it found in one transaction
at its end (`save_findings` + the run's record), or, when the provider fails, the report changes
under it or is in another zone, records only that it failed: never half a run.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from typing import Any

from worker.act.queue import enqueue_alert
from worker.act.recordreactor import fire_record
from worker.clock import now_ms, utc_now
from worker.errors import ProviderError
from worker.logs import get_logger
from worker.provider import canonical
from worker.provider.client import ProviderClient
from worker.provider.jsonio import decimal_str
from worker.provider.resources import SettlementDaily, SettlementRecord
from worker.reconcile.matching import Booked, DayMatch, hash_key
from worker.rules import RuleBook
from worker.store import findings as store
from worker.store.db import Db
from worker.store.findings import Finding
from worker.store.meta import get_meta, set_meta
from worker.store.sqlitestore import Store

log = get_logger(__name__)

KINDS = (
    "missing_in_ledger",
    "missing_in_report",
    "amount_differs",
    "asset_differs",
    "tx_hash_differs",
    "settled_on_other_day",
    "duplicate_in_report",
    "provider_mismatch",
    "provider_review",
    "held_balance_drift",
)
# States whose funds the provider holds unavailable (before credit, or frozen).
HELD_STATES = ("processing", "needs_details", "submitted", "rejected", "blocked")
_DRIFT_META = "held_balance_drift"
PAGE_SIZE = 200
# A drift of held balances must last this long (scheduler.detail_interval_s, its default).
DRIFT_AFTER_S = 120.0
# The report is asked for UTC days (the ledger's days); an answer in another zone fails the run.
REPORT_TIMEZONE = "UTC"
UTC_NAMES = frozenset({"UTC", "ETC/UTC", "GMT", "ETC/GMT", "Z"})


class ReportUnreadable(Exception):
    """The report could not be read whole (changed while read, a page missing)."""


@dataclass
class RunResult:
    """What one run ended with."""

    day: str
    outcome: str  # clean, findings, failed
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    ledger_mark: str | None = None  # the ledger side compared (`findings.ledger_mark`)


def _booked(row: tuple[Any, ...]) -> Booked:
    tx_id, amount, currency, network, tx_hash, day = row
    return Booked(str(tx_id), Decimal(str(amount)), currency, network, tx_hash, day)


def _ledger_side(db: Db, day: str) -> list[Booked]:
    return [_booked(row) for row in store.ledger_rows_for_day(db, day)]


def _elsewhere(
    db: Db, recs: list[SettlementRecord]
) -> list[tuple[SettlementRecord, Booked | None]]:
    """Report records not matched to the day's ledger rows, each with its ledger row of
    another day (by id; by txHash for a record without one), or None: never booked."""
    out = []
    for rec in recs:
        key = hash_key(rec.tx_hash)
        if rec.platform_order_id:
            row = store.ledger_row_by_id(db, rec.platform_order_id)
        else:
            row = store.ledger_row_by_tx_hash(db, key) if key is not None else None
        out.append((rec, None if row is None else _booked(row)))
    return out


def finding_fields(f: Finding | dict[str, Any]) -> dict[str, Any]:
    """The finding as `reconcile --json`, alerts and rule conditions show it."""
    values = f if isinstance(f, dict) else {k: getattr(f, k) for k in store.FINDING_COLUMNS}

    def get(key: str) -> Any:
        return values.get(key)

    amount = get("report_amount") or get("ledger_amount")
    return {
        "date": get("day"),
        "kind": get("kind"),
        "transactionId": get("transaction_id"),
        "txHash": get("tx_hash"),
        "ledgerAmount": get("ledger_amount"),
        "reportAmount": get("report_amount"),
        "currency": get("currency"),
        "network": get("network"),
        "amount": amount,
    }


def _describe(f: Finding, finding_id: int) -> str:
    parts = [f"finding {finding_id} ({f.day}): {f.kind}"]
    for label, value in (
        ("transactionId", f.transaction_id),
        ("txHash", f.tx_hash),
        ("wallet", f.wallet_id),
        ("ledger", f.ledger_amount),
        ("report", f.report_amount),
        ("currency", f.currency),
        ("network", f.network),
        ("", f.detail),
    ):
        if value is not None:
            parts.append(f"{label} {value}".strip())
    return ", ".join(parts)


def _commit(db: Db, result: RunResult, rules: RuleBook, started: str, drift: str) -> int:
    """The run's one write: findings, resolutions, alerts of new findings, the run record."""
    new = store.save_findings(db, result.day, result.findings, utc_now())
    by_id = {(f.kind, f.subject): f for f in result.findings}
    for finding_id in new:
        row = store.get_finding(db, finding_id)
        assert row is not None
        f = by_id[(row["kind"], row["subject"])]
        fire_record(
            db,
            rules,
            "reconcile_finding",
            finding_fields(f),
            subject=f"finding:{finding_id}",
            detail=_describe(f, finding_id),
        )
    set_meta(db, _DRIFT_META, drift)
    store.record_run(
        db,
        result.day,
        started_at=started,
        finished_at=utc_now(),
        outcome=result.outcome,
        findings=len(result.findings),
        ledger_mark=result.ledger_mark,
    )
    return len(new)


def _fail(db: Db, day: str, started: str, error: str) -> None:
    store.record_run(
        db,
        day,
        started_at=started,
        finished_at=utc_now(),
        outcome="failed",
        findings=0,
        error=error,
    )
    # One alert per day however often its runs fail (the job retries a failed day).
    if not store.failure_alerted(db, day):
        enqueue_alert(
            db,
            None,
            "reconcile_failed",
            "warning",
            trigger="reconcile_failed",
            detail=f"reconciliation of {day} failed: {error}",
            once_per=day,
        )


class Reconciler:
    """Runs reconciliation of one day."""

    def __init__(
        self,
        client: ProviderClient,
        store_: Store,
        rules: Callable[[], RuleBook],
        *,
        after_commit: Callable[[], None] | None = None,
        page_size: int = PAGE_SIZE,
        max_pages: int = 10_000,
        drift_after_s: float = DRIFT_AFTER_S,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._client = client
        self._store = store_
        self._rules = rules
        self._after_commit = after_commit
        self._page_size = page_size
        self._max_pages = max_pages
        self._drift_after_s = drift_after_s
        self._clock = clock

    async def run(self, day: dt.date) -> RunResult:
        """Reconcile `day`; the result is recorded whatever it is."""
        text = day.isoformat()
        started = utc_now()
        log.info("reconciliation started", day=text)
        try:
            result, drift = await self._compare(day)
        except (ProviderError, ReportUnreadable) as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.error(
                "reconciliation failed; nothing recorded but the failure", day=text, error=error
            )
            await self._store.write(partial(_fail, day=text, started=started, error=error))
            self._wake()
            return RunResult(text, "failed", error=error)
        new = await self._store.write(
            partial(_commit, result=result, rules=self._rules(), started=started, drift=drift)
        )
        counts: dict[str, int] = defaultdict(int)
        for f in result.findings:
            counts[f.kind] += 1
        log.info(
            "reconciliation done",
            day=text,
            outcome=result.outcome,
            findings=len(result.findings),
            newFindings=new,
            **dict(counts),
        )
        if new:
            self._wake()
        return result

    def _wake(self) -> None:
        if self._after_commit is not None:
            self._after_commit()

    async def _compare(self, day: dt.date) -> tuple[RunResult, str]:
        text = day.isoformat()
        ledger = await self._store.read(partial(_ledger_side, day=text))
        cmp = DayMatch(text, ledger)
        first: SettlementDaily | None = None
        seen = 0
        page = 1
        while True:
            daily = await self._client.settlement_daily_records(
                settlement_date=text,
                timezone=REPORT_TIMEZONE,
                record_type="IN",
                page=page,
                page_size=self._page_size,
            )
            if canonical.code(daily.timezone) not in UTC_NAMES:
                # The ledger's days are UTC days: a report of another zone's day compares
                # other hours and would find (or hide) differences that are not there.
                raise ReportUnreadable(
                    f"the report is in timezone {daily.timezone!r}, not {REPORT_TIMEZONE}"
                )
            if first is None:
                first = daily
            elif (daily.total, daily.summary) != (first.total, first.summary):
                raise ReportUnreadable("the report changed while it was read; read again next run")
            for rec in daily.records:
                if (rec.record_type or "IN") == "IN":
                    cmp.record(rec)
            seen += len(daily.records)
            # Records not booked that day are looked up page by page: memory stays one page.
            await self._place(cmp)
            if not daily.records or seen >= daily.total or page >= self._max_pages:
                break
            page += 1
        if seen != first.total:
            raise ReportUnreadable(f"the report lists {first.total} records, {seen} were read")
        cmp.by_tx_hash()
        await self._place(cmp)
        cmp.summary(first.summary.mismatched_count, first.summary.manual_review_count)
        cmp.leftovers()
        drift_found, drift = await self._held()
        cmp.found.extend(drift_found)
        outcome = "findings" if cmp.found else "clean"
        mark = store.ledger_mark(b.transaction_id for b in ledger)
        return RunResult(text, outcome, cmp.found, ledger_mark=mark), drift

    async def _place(self, cmp: DayMatch) -> None:
        for rec, booked in await self._store.read(partial(_elsewhere, recs=cmp.elsewhere)):
            cmp.placed(rec, booked)
        cmp.elsewhere.clear()

    async def _held(self) -> tuple[list[Finding], str]:
        """Unavailable balances against the deposits held, as they are now: a drift seen on
        every check for at least `drift_after_s` (two checks that far apart; one may fall
        between a credit and its webhook) is a finding of the day it is read (UTC)."""

        def read(db: Db) -> tuple[list[int], dict[str, Decimal], str | None]:
            sums: dict[str, Decimal] = defaultdict(Decimal)
            for wallet, currency, amount in store.held_amounts(db, HELD_STATES):
                sums[f"{wallet}:{currency}"] += Decimal(str(amount))
            return store.tracked_wallets(db), sums, get_meta(db, _DRIFT_META)

        wallets, sums, before = await self._store.read(read)
        since = _drift_since(before)
        now = self._clock()
        today = dt.datetime.fromtimestamp(now / 1000, dt.UTC).date().isoformat()
        current: dict[str, int] = {}
        found: list[Finding] = []
        for wallet in wallets:
            for bal in await self._client.asset_balance(wallet):
                key = f"{wallet}:{bal.currency}"
                held = sums.get(key, Decimal(0))
                if bal.unavailable == held:
                    continue
                current[key] = since.get(key, now)
                if now - current[key] >= self._drift_after_s * 1000:
                    found.append(
                        Finding(
                            day=today,
                            kind="held_balance_drift",
                            subject=key,
                            wallet_id=wallet,
                            ledger_amount=decimal_str(held),
                            report_amount=decimal_str(bal.unavailable),
                            currency=bal.currency,
                            detail="unavailable balance differs from the deposits held",
                        )
                    )
        return found, json.dumps(current, sort_keys=True)


def _drift_since(stored: str | None) -> dict[str, int]:
    """wallet:currency -> when (epoch ms) its drift was first seen on the checks since; a value
    of the earlier format (the drifted amount) counts from now."""
    try:
        raw = json.loads(stored or "{}")
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool)}
