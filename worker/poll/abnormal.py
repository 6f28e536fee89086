"""The abnormal-fund poll: every page of the provider's list, each record stored by its id.

Each record is written in a transaction of its own together with the triggers it fires, so a
crash in the middle of a poll loses nothing (the next poll reads the rest) and repeats nothing
(a fired trigger is marked in the same write): `abnormal_fund` fires once per record,
`abnormal_expiring` once when an UNMATCHED record is within 24 h of its `expiresTime`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import sqlite_utils

from worker.act.records import fire_record
from worker.clock import iso_from_ms, now_ms, utc_now
from worker.logs import get_logger
from worker.provider.client import ProviderClient
from worker.provider.jsonio import decimal_str
from worker.provider.resources import AbnormalFund
from worker.rules import RuleBook
from worker.store.abnormal import mark_alerted, upsert_abnormal
from worker.store.writer import Store

log = get_logger(__name__)

UNMATCHED = "UNMATCHED"
EXPIRING_WITHIN_MS = 24 * 3600 * 1000


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


def apply_fund(db: sqlite_utils.Database, fund: AbnormalFund, rules: RuleBook, now: int) -> int:
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
        fund.status.upper() == UNMATCHED
        and fund.expiresTime is not None
        and fund.expiresTime - now <= EXPIRING_WITHIN_MS
    )
    if expiring and mark_alerted(db, str(fund.id), "expiring_alerted_at", stamp):
        queued += fire_record(
            db, rules, "abnormal_expiring", _fields(fund), subject=subject, detail=describe(fund)
        )
    return queued


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
        """One poll; returns the records read. Provider errors propagate (the job backs off)."""
        seen = 0
        async for fund in self._client.iter_abnormal_funds(
            page_size=self._page_size, max_pages=self._max_pages
        ):
            queued = await self._store.write(
                partial(apply_fund, fund=fund, rules=self._rules(), now=self._clock())
            )
            if queued:
                log.info("abnormal fund alerted", abnormalFundId=fund.id, status=fund.status)
                if self._after_commit is not None:
                    self._after_commit()
            seen += 1
            if self._stopping:
                break
        return seen
