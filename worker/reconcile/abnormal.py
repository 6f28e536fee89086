"""The abnormal-fund poll: every page of the provider's list, each record stored by its id.

A poll reads at most `max_pages` pages and the next one goes on where it stopped, so a list
longer than the cap is read whole within a few polls (not page 1 to the cap again and again).

Each record is written in a transaction of its own together with the triggers it fires, so a
crash in the middle of a poll loses nothing (the next poll reads the rest) and repeats nothing
(a fired trigger is marked in the same write): `abnormal_fund` fires once per record,
`abnormal_expiring` once when an UNMATCHED record is within 24 h of its `expiresTime`.

`AbnormalWatch` runs the poll for its job (every `scheduler.abnormal_interval_s`, and at once
when an ABNORMAL_FUND_NOTIFICATION arrives: `worker.schedule.money`): it backs off on provider
errors and alerts when they last.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from worker.act.recordreactor import fire_record
from worker.clock import iso_from_ms, now_ms, utc_now
from worker.errors import ProviderAuthError, ProviderError, StorageError
from worker.logs import get_logger
from worker.poll.backoff import poll_backoff
from worker.provider.client import ProviderClient
from worker.provider.jsonio import decimal_str
from worker.provider.resources import AbnormalFund
from worker.reconcile.metrics import MoneyMetrics
from worker.rules import RuleBook
from worker.store.abnormal import mark_alerted, upsert_abnormal
from worker.store.db import Db
from worker.store.meta import get_meta, set_meta
from worker.store.sqlitestore import Store

log = get_logger(__name__)

UNMATCHED = "UNMATCHED"
# Where the next poll starts (meta): the page the last one stopped on past the page cap.
RESUME_KEY = "abnormal_next_page"
EXPIRING_WITHIN_MS = 24 * 3600 * 1000
FAILING_ALERT_AFTER = 3  # failed polls in a row, then one alert


def _fields(fund: AbnormalFund) -> dict[str, Any]:
    """The record as rule conditions see it (identifying fields only, no payer data)."""
    return {
        "currency": fund.currency,
        "network": fund.network,
        "amount": fund.amount,
        "status": fund.status,
        "addressRiskStatus": fund.addressRiskStatus,
    }


def describe(fund: AbnormalFund) -> str:
    """An alert's detail: the record's id, money, txHash, status, risk and expiry."""
    parts = [f"abnormal fund {fund.id}: {decimal_str(fund.amount)} {fund.currency}"]
    if fund.network:
        parts[0] += f" on {fund.network}"
    if fund.txHash:
        parts.append(f"txHash {fund.txHash}")
    parts.append(f"status {fund.status}")
    if fund.addressRiskStatus:
        parts.append(f"addressRiskStatus {fund.addressRiskStatus}")
    if fund.expiresTime is not None:
        parts.append(f"expires {iso_from_ms(fund.expiresTime)}")
    return ", ".join(parts)


def apply_fund(db: Db, fund: AbnormalFund, rules: RuleBook, now: int) -> int:
    """Store one record and fire its triggers once; returns the alert rows queued."""
    stamp = utc_now()
    row = {
        "id": str(fund.id),
        "amount": decimal_str(fund.amount),
        "currency": fund.currency,
        "network": fund.network,
        "tx_hash": fund.txHash,
        "tx_time": fund.txTime,
        "expires_time": fund.expiresTime,
        "status": fund.status,
        "order_id": fund.orderId,
        "address_risk_status": fund.addressRiskStatus,
    }
    upsert_abnormal(db, row, stamp)
    subject = f"abnormal:{fund.id}"
    queued = 0
    if mark_alerted(db, str(fund.id), "alerted_at", stamp):
        queued += fire_record(
            db, rules, "abnormal_fund", _fields(fund), subject=subject, detail=describe(fund)
        )
    expiring = (
        fund.status == UNMATCHED
        and fund.expiresTime is not None
        and fund.expiresTime - now <= EXPIRING_WITHIN_MS
    )
    if expiring and mark_alerted(db, str(fund.id), "expiring_alerted_at", stamp):
        queued += fire_record(
            db, rules, "abnormal_expiring", _fields(fund), subject=subject, detail=describe(fund)
        )
    return queued


def _page_of(stored: str | None) -> int:
    return int(stored) if stored is not None and stored.isdigit() and int(stored) > 0 else 1


class AbnormalPoll:
    """Reads every page of the abnormal-fund list and applies each record."""

    def __init__(
        self,
        client: ProviderClient,
        store: Store,
        rules: Callable[[], RuleBook],
        *,
        page_size: int = 50,
        max_pages: int = 100,
        after_commit: Callable[[], None] | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._client = client
        self._store = store
        self._rules = rules
        self._page_size = page_size
        self._max_pages = max_pages
        self._after_commit = after_commit
        self._clock = clock
        self._stopping = False

    def stop(self) -> None:
        """End a poll in flight after the record in hand."""
        self._stopping = True

    async def run(self) -> int:
        """One poll of at most `max_pages` pages, starting where the last one stopped (page 1
        after a poll that reached the last page), so every record is seen within a few polls
        whatever the list's length; returns the records read. Provider errors propagate (the
        job backs off; the next poll starts again where this one was to start)."""
        first = _page_of(await self._store.read(partial(get_meta, key=RESUME_KEY)))
        page_num, seen, previous = first, 0, None
        while True:
            page = await self._client.abnormal_funds(
                {"pageNum": page_num, "pageSize": self._page_size}
            )
            if previous is not None and page.records == previous:
                log.warning("paging stopped: page repeats the previous one", paged="abnormal")
                resume = 1
                break
            for fund in page.records:
                await self._apply(fund)
                seen += 1
                if self._stopping:
                    break
            done = not (page.records or page.refused) or page_num >= page.totalPage
            if done or self._stopping or page_num - first + 1 >= self._max_pages:
                # Past the cap the next poll starts on this run's last page again: a record
                # added or gone meanwhile shifts the pages by less than one.
                if done:
                    resume = 1
                elif self._stopping:
                    resume = page_num  # this page again: its rest is unread
                else:
                    resume = max(first + 1, page_num)
                break
            previous = page.records
            page_num += 1
        await self._store.write(partial(set_meta, key=RESUME_KEY, value=str(resume)))
        return seen

    async def _apply(self, fund: AbnormalFund) -> None:
        queued = await self._store.write(
            partial(apply_fund, fund=fund, rules=self._rules(), now=self._clock())
        )
        if queued:
            log.info("abnormal fund alerted", abnormalFundId=fund.id, status=fund.status)
            if self._after_commit is not None:
                self._after_commit()


class AbnormalWatch:
    """The abnormal-fund poll as its job runs it: provider errors back off (doubling, like the
    other polls) and alert after `FAILING_ALERT_AFTER` in a row; the money metrics read again
    after each poll that succeeded."""

    def __init__(
        self,
        poll: AbnormalPoll,
        store: Store,
        metrics: MoneyMetrics,
        *,
        alert: Callable[[str, str, str], Awaitable[None]] | None = None,
        backoff_s: float = 1.0,
        backoff_max_s: float = 600.0,
    ) -> None:
        self._poll = poll
        self._store = store
        self._metrics = metrics
        self._alert = alert
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._failures = 0
        self._not_before = 0.0
        self.last_ok: float | None = None  # Unix time of the last poll that succeeded

    def stop(self) -> None:
        """End a poll in flight after the record in hand."""
        self._poll.stop()

    async def poll(self) -> int:
        """One guarded poll (none while backing off); returns the records read."""
        if time.monotonic() < self._not_before:
            return 0
        try:
            count = await self._poll.run()
        except Exception as exc:
            if isinstance(exc, StorageError) and self._store.outage.note("pollsFailed"):
                return 0  # counted in the outage's lines; the next turn tries again
            await self._failed(exc)
            return 0
        self._failures = 0
        self.last_ok = time.time()
        self._metrics.abnormal_polls.labels(outcome="ok").inc()
        await self._metrics.try_refresh(self._store)
        return count

    async def _failed(self, exc: Exception) -> None:
        self._failures += 1
        kind = "auth" if isinstance(exc, ProviderAuthError) else "error"
        delay = poll_backoff(self._failures, self.backoff_s, self.backoff_max_s)
        self._not_before = time.monotonic() + delay
        self._metrics.abnormal_polls.labels(outcome=kind).inc()
        line = log.warning if isinstance(exc, ProviderError) else log.exception
        line(
            "poll failed; backing off",
            poll="abnormal",
            failures=self._failures,
            backoffSeconds=round(delay, 3),
            error=f"{type(exc).__name__}: {exc}",
        )
        if self._failures == FAILING_ALERT_AFTER and self._alert is not None:
            try:
                await self._alert(
                    "poll_failing:abnormal",
                    "critical" if kind == "auth" else "warning",
                    f"abnormal poll failed {self._failures} times in a row: {exc}",
                )
            except Exception as err:
                log.warning("could not queue poll_failing alert", error=str(err))
