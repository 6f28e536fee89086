"""The sandbox's money views: abnormal funds and the daily settlement report.

No I/O. Abnormal funds are records injected by the control API and listed with the interface's
filters. The daily settlement report is built from the sandbox's own deposits: every deposit
credited on that day (in the asked timezone) is one IN record, MATCHED; the summary is computed
from the records. Discrepancies injected by the control API (drop a record, change its amount,
add a record no deposit backs, set its reconciliation status) are applied on top, so a merchant
can see its reconciliation find them.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from worker.dev.sandbox.records import Order, new_id, new_tx_hash, parse_amount
from worker.errors import SandboxError
from worker.provider.models import CreditStatus

UNMATCHED = "UNMATCHED"
MATCHED = "MATCHED"
MISMATCHED = "MISMATCHED"
MANUAL_REVIEW = "MANUAL_REVIEW"
RECONCILIATION_STATUSES = (MATCHED, MISMATCHED, MANUAL_REVIEW)
RECORD_IN = "IN"
DEPOSIT_BUSINESS = "DEPOSIT"
ALL_BUSINESS = "ALL"
CONFIRMATIONS = 20
DISCREPANCY_KINDS = ("drop", "amount", "extra", "status")


class BadQuery(ValueError):
    """A list or report request the sandbox cannot answer (bad filter value)."""


# --- abnormal funds ----------------------------------------------------------------------------


def abnormal_fund(fund_id: int, spec: Mapping[str, Any], now: int) -> dict[str, Any]:
    """A new abnormal fund record (the interface's field names) from a control request."""
    for key in ("currency", "network", "fromAddress", "toAddress"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise SandboxError(f"{key} is required (a non-empty string)")
    tx_time = spec.get("txTime", now)
    expires = spec.get("expiresTime", tx_time + 7 * 86_400_000)
    for name, value in (("txTime", tx_time), ("expiresTime", expires)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise SandboxError(f"{name} must be epoch milliseconds")
    return {
        "id": fund_id,
        "accountId": str(spec.get("accountId") or "ACC-SANDBOX"),
        "userId": str(spec.get("userId") or "U-SANDBOX"),
        "amount": parse_amount(spec.get("amount", "")),
        "currency": spec["currency"],
        "network": spec["network"],
        "fromAddress": spec["fromAddress"],
        "toAddress": spec["toAddress"],
        "txHash": str(spec.get("txHash") or new_tx_hash(str(spec["network"]), 20)),
        "txTime": tx_time,
        "expiresTime": expires,
        "status": str(spec.get("status") or UNMATCHED),
        "orderId": str(spec.get("orderId") or ""),
        "addressRiskStatus": str(spec.get("addressRiskStatus") or "LOW"),
        "addressRiskRemark": str(spec.get("addressRiskRemark") or ""),
    }


def filter_abnormal(funds: Iterable[dict[str, Any]], query: Mapping[str, Any]) -> list[Any]:
    """Records matching every given filter of the list body, in id order (stable pages)."""
    statuses = query.get("statuses") or None
    if statuses is not None and (
        not isinstance(statuses, list) or not all(isinstance(s, str) for s in statuses)
    ):
        raise BadQuery("statuses must be an array of strings")
    for key in ("startTime", "endTime"):
        value = query.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise BadQuery(f"{key} must be epoch milliseconds")
    keyword = str(query.get("searchKeyword") or "").lower()
    network, currency = query.get("network") or None, query.get("currency") or None
    start, end = query.get("startTime"), query.get("endTime")

    def hit(f: dict[str, Any]) -> bool:
        searched = (f["txHash"], f["fromAddress"], f["toAddress"], f["orderId"], str(f["id"]))
        return (
            (statuses is None or f["status"] in statuses)
            and (network is None or f["network"] == network)
            and (currency is None or f["currency"] == currency)
            and (start is None or f["txTime"] >= start)
            and (end is None or f["txTime"] <= end)
            and (not keyword or any(keyword in s.lower() for s in searched))
        )

    return sorted((f for f in funds if hit(f)), key=lambda f: f["id"])


def page_of(rows: list[Any], page_num: Any, page_size: Any, max_size: int) -> dict[str, Any]:
    """The interface's page wrapper over `rows` (pageNum from 1)."""
    num = 1 if page_num is None else page_num
    size = 50 if page_size is None else page_size
    for name, value in (("pageNum", num), ("pageSize", size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadQuery(f"{name} must be a whole number of at least 1")
    if size > max_size:
        raise BadQuery(f"pageSize must be at most {max_size}")
    start = (num - 1) * size
    return {
        "pageNumber": num,
        "pageSize": size,
        "totalPage": math.ceil(len(rows) / size),
        "totalRow": len(rows),
        "records": rows[start : start + size],
    }


# --- settlement --------------------------------------------------------------------------------


def zone(name: str | None) -> ZoneInfo:
    """The report's timezone (UTC when not given)."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise BadQuery(f"timezone {name!r} is not a known time zone") from None


def day_bounds(day: dt.date, tz: ZoneInfo) -> tuple[int, int]:
    """Epoch ms of the day's first instant and of the next day's, in `tz`."""
    start = dt.datetime.combine(day, dt.time(), tz)
    end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), tz)
    return int(start.timestamp() * 1000), int(end.timestamp() * 1000)


def iso_ms(epoch_ms: int) -> str:
    """An epoch-ms instant as ISO 8601 UTC (``2026-11-22T10:00:00.000Z``)."""
    at = dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def settlement_record(order: Order, day: dt.date) -> dict[str, Any]:
    """The IN record of one credited deposit."""
    assert order.credit_time is not None
    return {
        "settlement_record_id": "SR" + order.transaction_id,
        "settlement_date": day.isoformat(),
        "record_type": RECORD_IN,
        "business_type": DEPOSIT_BUSINESS,
        "platform_order_id": order.transaction_id,
        "exchange_order_id": "",
        "rd_order_id": "",
        "asset": order.currency,
        "network": order.network,
        "amount": order.amount,
        "fee_amount": Decimal(0),
        "fee_asset": order.currency,
        "from_address": order.from_address,
        "to_address": order.to_address,
        "tx_hash": order.transaction_hash,
        "confirmations": CONFIRMATIONS,
        "order_status": order.status.value,
        "reconciliation_status": MATCHED,
        "occurred_at": iso_ms(order.create_time),
        "settled_at": iso_ms(order.credit_time),
        "remark": "",
    }


def discrepancy(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A checked discrepancy to apply to one day's report."""
    kind = spec.get("kind")
    if kind not in DISCREPANCY_KINDS:
        raise SandboxError(f"kind must be one of {', '.join(DISCREPANCY_KINDS)}")
    try:
        day = dt.date.fromisoformat(str(spec.get("date")))
    except ValueError:
        raise SandboxError("date must be yyyy-MM-dd") from None
    out: dict[str, Any] = {"kind": kind, "date": day.isoformat()}
    if kind != "extra":
        tx_id = spec.get("transactionId")
        if not isinstance(tx_id, str) or not tx_id:
            raise SandboxError("transactionId is required")
        out["transactionId"] = tx_id
    if kind in ("amount", "extra"):
        out["amount"] = parse_amount(spec.get("amount", ""))
    if kind == "status":
        status = spec.get("reconciliationStatus")
        if status not in RECONCILIATION_STATUSES:
            raise SandboxError(f"reconciliationStatus must be one of {RECONCILIATION_STATUSES}")
        out["reconciliationStatus"] = status
    if kind == "extra":
        out.update(_extra_fields(spec, day))
    return out


def _extra_fields(spec: Mapping[str, Any], day: dt.date) -> dict[str, Any]:
    for key in ("asset", "network"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise SandboxError(f"{key} is required for an extra record")
    settled = spec.get("settledAt")
    if settled is None:
        settled = day_bounds(day, zone("UTC"))[0] + 12 * 3_600_000
    if not isinstance(settled, int) or isinstance(settled, bool):
        raise SandboxError("settledAt must be epoch milliseconds")
    tx_id = spec.get("transactionId")
    return {
        # "" lists a record without the provider's id of the deposit (platform_order_id).
        "transactionId": "" if tx_id == "" else str(tx_id or new_id("X")),
        "recordId": new_id("SR"),
        "asset": spec["asset"],
        "network": spec["network"],
        "txHash": str(spec.get("txHash") or new_tx_hash(str(spec["network"]), 20)),
        "fromAddress": str(spec.get("fromAddress") or ""),
        "toAddress": str(spec.get("toAddress") or ""),
        "settledAt": settled,
    }


def _apply(records: list[dict[str, Any]], change: dict[str, Any], day: dt.date) -> None:
    kind = change["kind"]
    if kind == "extra":
        at = change["settledAt"]
        records.append(
            {
                "settlement_record_id": change.get("recordId") or "SR" + change["transactionId"],
                "settlement_date": day.isoformat(),
                "record_type": RECORD_IN,
                "business_type": DEPOSIT_BUSINESS,
                "platform_order_id": change["transactionId"],
                "exchange_order_id": "",
                "rd_order_id": "",
                "asset": change["asset"],
                "network": change["network"],
                "amount": change["amount"],
                "fee_amount": Decimal(0),
                "fee_asset": change["asset"],
                "from_address": change["fromAddress"],
                "to_address": change["toAddress"],
                "tx_hash": change["txHash"],
                "confirmations": CONFIRMATIONS,
                "order_status": "SUCCESS",
                "reconciliation_status": MATCHED,
                "occurred_at": iso_ms(at),
                "settled_at": iso_ms(at),
                "remark": "",
            }
        )
        return
    for i, record in enumerate(records):
        if record["platform_order_id"] != change["transactionId"]:
            continue
        if kind == "drop":
            del records[i]
        elif kind == "amount":
            record["amount"] = change["amount"]
        else:
            record["reconciliation_status"] = change["reconciliationStatus"]
        return


@dataclass(frozen=True)
class ReportQuery:
    """What a daily settlement report is asked for."""

    day: dt.date
    tz_name: str
    asset: str | None = None
    network: str | None = None
    business_type: str | None = None
    record_type: str | None = None
    reconciliation_status: str | None = None

    def in_scope(self, record: Mapping[str, Any]) -> bool:
        """Does the record belong to the report (asset, network, business type)?"""
        return (
            (self.asset is None or record["asset"] == self.asset)
            and (self.network is None or record["network"] == self.network)
            and (
                self.business_type in (None, ALL_BUSINESS)
                or record["business_type"] == self.business_type
            )
        )

    def listed(self, record: Mapping[str, Any]) -> bool:
        """Is the in-scope record listed (record type and reconciliation status filters)?"""
        return (self.record_type is None or record["record_type"] == self.record_type) and (
            self.reconciliation_status is None
            or record["reconciliation_status"] == self.reconciliation_status
        )


def day_records(
    orders: Iterable[Order], changes: Iterable[dict[str, Any]], q: ReportQuery
) -> tuple[list[dict[str, Any]], Decimal]:
    """The day's in-scope records (discrepancies applied) and the opening balance (what was
    credited in scope before the day)."""
    start, end = day_bounds(q.day, zone(q.tz_name))
    records: list[dict[str, Any]] = []
    opening = Decimal(0)
    credited = [o for o in orders if o.credit_time is not None]
    for order in sorted(credited, key=lambda o: (o.credit_time or 0, o.transaction_id)):
        if order.credit_status is not CreditStatus.CREDITED:
            continue
        record = settlement_record(order, q.day)
        at = order.credit_time or 0
        if at < start and q.in_scope(record):
            opening += order.amount
        elif start <= at < end:
            records.append(record)
    for change in changes:
        if change["date"] == q.day.isoformat():
            _apply(records, change, q.day)
    return [r for r in records if q.in_scope(r)], opening


def summary(records: list[dict[str, Any]], opening: Decimal) -> dict[str, Any]:
    """The report's summary, computed from its records."""
    total_in = sum((r["amount"] for r in records if r["record_type"] == RECORD_IN), Decimal(0))
    total_out = sum((r["amount"] for r in records if r["record_type"] != RECORD_IN), Decimal(0))
    fees = sum((r["fee_amount"] for r in records), Decimal(0))
    net = total_in - total_out - fees
    statuses = [r["reconciliation_status"] for r in records]
    return {
        "opening_balance": opening,
        "closing_balance": opening + net,
        "total_in_amount": total_in,
        "total_out_amount": total_out,
        "total_fee_amount": fees,
        "net_amount": net,
        "adjustment_amount": Decimal(0),
        "record_count": len(records),
        "matched_count": statuses.count(MATCHED),
        "mismatched_count": statuses.count(MISMATCHED),
        "manual_review_count": statuses.count(MANUAL_REVIEW),
    }


def report(
    orders: Iterable[Order],
    changes: Iterable[dict[str, Any]],
    q: ReportQuery,
    *,
    page: int,
    page_size: int,
    now: int,
) -> dict[str, Any]:
    """The settlement daily record (data of the report answer), one page of its records."""
    records, opening = day_records(orders, changes, q)
    listed = [r for r in records if q.listed(r)]
    start = (page - 1) * page_size
    return {
        "settlement_date": q.day.isoformat(),
        "timezone": q.tz_name,
        "asset": q.asset,
        "network": q.network,
        "business_type": q.business_type or ALL_BUSINESS,
        "summary": summary(records, opening),
        "records": listed[start : start + page_size],
        "page": page,
        "page_size": page_size,
        "total": len(listed),
        "generated_at": iso_ms(now),
    }
