"""`depositd reconcile` (the ledger against the provider's daily settlement report) and
`depositd abnormal` (abnormal funds seen at the provider).

`reconcile [--date D] [--json]` runs one day (default: yesterday, UTC) like the daily job of
`serve` and records its findings (alerts they queue are sent by `serve`'s outbox); exit 0 when
the day is clean, 3 with findings, 1 when the run failed. `reconcile --ack ID --by NAME --note
TEXT` acknowledges one finding. `abnormal [--json]` lists the stored abnormal funds.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from functools import partial
from typing import Any

from worker.config.settings import Settings, load_settings
from worker.logs import configure
from worker.provider.client import ProviderClient
from worker.reconcile.daily import yesterday
from worker.reconcile.reconciler import Reconciler, finding_fields
from worker.service.bundle import load_bundle
from worker.store import abnormal as abnormal_store
from worker.store import findings as findings_store
from worker.store import journal
from worker.store.writelock import command_store

EXIT_FINDINGS = 3


def _finding_line(row: dict[str, Any]) -> str:
    f = finding_fields(row)
    money = " ".join(
        f"{label} {f[key]}"
        for label, key in (("ledger", "ledgerAmount"), ("report", "reportAmount"))
        if f[key] is not None
    )
    where = " ".join(str(x) for x in (f["currency"], f["network"]) if x)
    ids = f["transactionId"] or row.get("subject")
    ack = f"  acknowledged by {row['acknowledged_by']}" if row.get("acknowledged_at") else ""
    return f"#{row['id']}  {f['date']}  {f['kind']:<19} {ids}  {money} {where}{ack}".rstrip()


def _run_findings(db: Any, day: str) -> list[dict[str, Any]]:
    """The open findings of the day, and the held-balance drifts the run saw (dated the day
    the balances were read)."""
    rows = findings_store.findings_of_day(db, day)
    return rows + [r for r in findings_store.open_drift(db) if r["day"] != day]


async def _reconcile(settings: Settings, day: dt.date, as_json: bool) -> int:
    bundle = load_bundle(settings)
    async with (
        command_store(settings.storage) as store,
        ProviderClient.from_settings(settings.provider) as client,
    ):
        reconciler = Reconciler(
            client,
            store,
            lambda: bundle.rules,
            drift_after_s=settings.scheduler.detail_interval_s,
        )
        result = await reconciler.run(day)
        rows = await store.read(partial(_run_findings, day=day.isoformat()))
    if result.outcome == "failed":
        print(f"depositd: reconcile {day}: failed: {result.error}", file=sys.stderr)
        return 1
    for row in rows:
        if as_json:
            out = {k: v for k, v in finding_fields(row).items() if k != "amount"}
            print(json.dumps({**out, "id": row["id"]}))
        else:
            print(_finding_line(row))
    if not as_json:
        print(f"reconcile {day}: {len(rows) or 'no'} finding{'s' * (len(rows) != 1)}")
    return EXIT_FINDINGS if rows else 0


async def _ack(settings: Settings, finding_id: int, by: str, note: str) -> int:
    from worker.clock import utc_now

    def job(db: Any) -> dict[str, Any] | None:
        found: dict[str, Any] | None = {}
        outcome = "acknowledged"
        if not findings_store.acknowledge(db, finding_id, by=by, note=note, now=utc_now()):
            found = findings_store.get_finding(db, finding_id)
            if found is None:
                return None
            outcome = f"refused: acknowledged already by {found.get('acknowledged_by')}"
        # As the console's acknowledgement is journalled (docs/audit.md).
        body = {"action": "ack_finding", "by": f"{by}@cli", "note": note, "outcome": outcome}
        journal.append_at_commit(db, journal.OPERATOR, f"finding#{finding_id}", body)
        return found

    async with command_store(settings.storage) as store:
        refused = await store.write(job)
    if refused is None:
        print(f"depositd: reconcile: no finding {finding_id}", file=sys.stderr)
        return 1
    if refused:
        # An acknowledgement stands: who acknowledged, when and why are never replaced.
        print(
            f"depositd: reconcile: finding {finding_id} was acknowledged already by"
            f" {refused['acknowledged_by']} at {refused['acknowledged_at']}",
            file=sys.stderr,
        )
        return 1
    print(f"finding {finding_id} acknowledged by {by}")
    return 0


def run_reconcile(args: argparse.Namespace) -> int:
    """`depositd reconcile`."""
    settings = load_settings(args.config)
    configure(settings.log.format, "warning")
    if args.ack is not None:
        if not args.by or not args.note:
            print("depositd: reconcile: --ack needs --by NAME and --note TEXT", file=sys.stderr)
            return 2
        return asyncio.run(_ack(settings, args.ack, args.by, args.note))
    try:
        day = dt.date.fromisoformat(args.date) if args.date else yesterday()
    except ValueError:
        print(f"depositd: reconcile: --date {args.date!r} is not YYYY-MM-DD", file=sys.stderr)
        return 2
    return asyncio.run(_reconcile(settings, day, args.json))


def abnormal_json(row: dict[str, Any]) -> dict[str, Any]:
    """One stored abnormal fund as `abnormal --json` prints it (no payer data is stored)."""
    return {
        "id": row["id"],
        "amount": row["amount"],
        "currency": row["currency"],
        "network": row["network"],
        "txHash": row["tx_hash"],
        "txTime": row["tx_time"],
        "expiresTime": row["expires_time"],
        "status": row["status"],
        "orderId": row["order_id"],
        "addressRiskStatus": row["address_risk_status"],
        "firstSeen": row["first_seen"],
        "alertedAt": row["alerted_at"],
        "expiringAlertedAt": row["expiring_alerted_at"],
    }


async def _abnormal(settings: Settings, as_json: bool) -> int:
    async with command_store(settings.storage) as store:  # opening may bring the schema on
        rows = await store.read(abnormal_store.list_abnormal)
    for row in rows:
        item = abnormal_json(row)
        if as_json:
            print(json.dumps(item))
        else:
            risk = f"  risk {item['addressRiskStatus']}" if item["addressRiskStatus"] else ""
            print(
                f"{item['id']}  {item['status']:<10} {item['amount']} {item['currency']}"
                f" {item['network'] or ''}  txHash {item['txHash'] or '-'}{risk}"
            )
    if not as_json and not rows:
        print("no abnormal funds seen")
    return 0


def run_abnormal(args: argparse.Namespace) -> int:
    """`depositd abnormal`."""
    settings = load_settings(args.config)
    configure(settings.log.format, "warning")
    return asyncio.run(_abnormal(settings, args.json))
