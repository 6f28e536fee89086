"""The comparison of one day: the settlement report's IN records against the ledger rows whose
credit fell on that day (docs/reconciliation.md says what each difference is called).

A record is matched by the provider's id of the deposit (`platform_order_id`, the
transactionId); a record without one by its txHash (case-blind), after the whole report, so that
no record without an id takes a ledger row a record with the id would have matched. Amount,
asset, network and txHash are compared on every match. Every record and every ledger row of the
day ends matched once or as a finding: a record whose deposit the ledger books on another day is
`settled_on_other_day`, one matching a ledger row already matched `duplicate_in_report`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from worker.provider import canonical
from worker.provider.jsonio import decimal_str
from worker.provider.resources import SettlementRecord
from worker.store.findings import Finding


@dataclass(frozen=True)
class Booked:
    """A ledger row as reconciliation compares it."""

    transaction_id: str
    amount: Decimal
    currency: str | None
    network: str | None
    tx_hash: str | None
    credit_day: str | None = None


def hash_key(tx_hash: str | None) -> str | None:
    """A txHash as compared: case-blind (`0xABC` and `0xabc` are one hash), blank is none
    (`worker.provider.canonical.hash_key`, as the store's statements compare hashes)."""
    return canonical.hash_key(tx_hash)


def _same(a: str | None, b: str | None) -> bool:
    return bool(canonical.code(a) == canonical.code(b))


def _status_kind(status: str | None) -> str | None:
    if status is None or status == "MATCHED":
        return None
    return "provider_review" if status == "MANUAL_REVIEW" else "provider_mismatch"


class DayMatch:
    """The comparison of one day, fed one report record at a time (one page in memory; the
    records without an id wait for the end of the report)."""

    def __init__(self, day: str, ledger: list[Booked]) -> None:
        self.day = day
        self.by_id = {b.transaction_id: b for b in ledger}
        self.by_hash: dict[str, list[str]] = defaultdict(list)
        for b in ledger:
            key = hash_key(b.tx_hash)
            if key is not None:
                self.by_hash[key].append(b.transaction_id)
        self.matched: set[str] = set()
        self.found: list[Finding] = []
        self.elsewhere: list[SettlementRecord] = []  # not of this day's ledger: look up
        self.without_id: list[SettlementRecord] = []

    def _common(self, rec: SettlementRecord) -> dict[str, Any]:
        return {
            "day": self.day,
            "subject": rec.platform_order_id or f"record:{rec.settlement_record_id}",
            "transaction_id": rec.platform_order_id or None,
            "tx_hash": rec.tx_hash,
            "report_amount": decimal_str(rec.amount),
            "currency": rec.asset,
            "network": rec.network,
        }

    def record(self, rec: SettlementRecord) -> None:
        """One IN record of the report, in report order."""
        kind = _status_kind(rec.reconciliation_status)
        if kind is not None:
            detail = f"reconciliation_status {rec.reconciliation_status}"
            self.found.append(Finding(kind=kind, detail=detail, **self._common(rec)))
        if not rec.platform_order_id:
            self.without_id.append(rec)
            return
        booked = self.by_id.get(rec.platform_order_id)
        if booked is None:
            self.elsewhere.append(rec)
        else:
            self._match(rec, booked)

    def by_tx_hash(self) -> None:
        """The records without an id, each against an unmatched ledger row of its txHash (the
        one agreeing most); the rest wait for the lookup of other days."""
        for rec in self.without_id:
            ids = self.by_hash.get(hash_key(rec.tx_hash) or "", [])
            free = [self.by_id[i] for i in ids if i not in self.matched]
            if free:
                free.sort(key=lambda b: -self._agreement(rec, b))
                self._match(rec, free[0])
            elif ids:
                self._duplicate(rec, ids[0])
            else:
                self.elsewhere.append(rec)
        self.without_id.clear()

    @staticmethod
    def _agreement(rec: SettlementRecord, b: Booked) -> int:
        return (
            (b.amount == rec.amount) + _same(b.currency, rec.asset) + _same(b.network, rec.network)
        )

    def _match(self, rec: SettlementRecord, booked: Booked) -> None:
        if booked.transaction_id in self.matched:
            self._duplicate(rec, booked.transaction_id)
            return
        self.matched.add(booked.transaction_id)
        self.compare(rec, booked)

    def _duplicate(self, rec: SettlementRecord, tx_id: str) -> None:
        common = {**self._common(rec), "subject": f"record:{rec.settlement_record_id}"}
        detail = f"the ledger row of {tx_id} is matched by another record of the report"
        self.found.append(Finding(kind="duplicate_in_report", detail=detail, **common))

    def compare(self, rec: SettlementRecord, booked: Booked) -> None:
        """The differences between a record and the ledger row it matched."""
        common = {**self._common(rec), "transaction_id": booked.transaction_id}
        ledger_amount = decimal_str(booked.amount)
        if booked.amount != rec.amount:
            self.found.append(Finding(kind="amount_differs", ledger_amount=ledger_amount, **common))
        if not (_same(booked.currency, rec.asset) and _same(booked.network, rec.network)):
            detail = (
                f"the ledger books {booked.currency} on {booked.network},"
                f" the report lists {rec.asset} on {rec.network}"
            )
            self.found.append(
                Finding(kind="asset_differs", ledger_amount=ledger_amount, detail=detail, **common)
            )
        if hash_key(booked.tx_hash) != hash_key(rec.tx_hash):
            detail = f"the ledger books txHash {booked.tx_hash}, the report lists {rec.tx_hash}"
            self.found.append(
                Finding(
                    kind="tx_hash_differs", ledger_amount=ledger_amount, detail=detail, **common
                )
            )

    def placed(self, rec: SettlementRecord, booked: Booked | None) -> None:
        """A record not of this day's ledger rows: booked on another day, or never."""
        common = self._common(rec)
        if booked is None:
            self.found.append(Finding(kind="missing_in_ledger", **common))
            return
        if booked.transaction_id in self.matched:
            self._duplicate(rec, booked.transaction_id)
            return
        self.matched.add(booked.transaction_id)
        detail = f"the ledger books {booked.transaction_id} on {booked.credit_day}"
        self.found.append(
            Finding(
                kind="settled_on_other_day",
                ledger_amount=decimal_str(booked.amount),
                detail=detail,
                **{**common, "transaction_id": booked.transaction_id},
            )
        )
        self.compare(rec, booked)

    def summary(self, mismatched: int, manual_review: int) -> None:
        """The report's own counts, when no record said it already."""
        for kind, count in (("provider_mismatch", mismatched), ("provider_review", manual_review)):
            if count > 0 and not any(f.kind == kind for f in self.found):
                detail = f"the report's summary counts {count} record(s) {kind.split('_')[1]}"
                self.found.append(
                    Finding(day=self.day, kind=kind, subject="summary", detail=detail)
                )

    def leftovers(self) -> None:
        """Ledger rows of the day no record matched."""
        for tx_id, b in self.by_id.items():
            if tx_id in self.matched:
                continue
            self.found.append(
                Finding(
                    day=self.day,
                    kind="missing_in_report",
                    subject=tx_id,
                    transaction_id=tx_id,
                    tx_hash=b.tx_hash,
                    ledger_amount=decimal_str(b.amount),
                    currency=b.currency,
                    network=b.network,
                )
            )
