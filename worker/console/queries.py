"""What each console page shows, read from the store in one read job per page.

Everything `depositd status`, `deposits`, `events --failed`, `ledger`, `reconcile` and
`abnormal` show, nothing they hide: no event body, no action parameters (a submission's carry
the payer's details), profiles by name only.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from worker.clock import duration_text, iso_from_ms, ms_from_iso, now_ms
from worker.rules import RuleBook
from worker.store import (
    abnormal,
    actions,
    addresses,
    alerts,
    conflicts,
    deposits,
    events,
    facts,
    findings,
    ledger,
    waits,
)
from worker.store import operator as operator_store
from worker.store.db import Db
from worker.store.meta import all_meta, auth_refusal_streak
from worker.store.tx import conn_of
from worker.store.verification import journal_status
from worker.track.history import fact_changes
from worker.track.tracker import Deposit

PAGE_SIZE = 50
WAITING_REASONS = {
    "needs_details": "payer details needed",
    "rejected": "details rejected",
    "blocked": "blocked by the provider",
    "failed": "failed at the provider",
    "held": "booking held for a decision",
}
POLLS = ("history", "detail", "blocked")


def deposit_view(row: dict[str, Any]) -> dict[str, Any]:
    """A deposit row as the console shows it (the `deposits --json` object)."""
    return Deposit.from_row(row).as_json()


def waiting(db: Db, rules: RuleBook | None, now: int) -> list[dict[str, Any]]:
    """The deposits waiting on a person (`deposits --json` objects), each with what it waits on
    (`waitsOn`), since when (`since`) and, when its rule set has a `deadline:`, when that falls
    (`due`), the time left or past it (`left`) and whether it is past (`overdue`); those with a
    deadline first, the least time left first (overdue ones first of all), then the others,
    longest waiting first (docs/console.md)."""
    rows = {r["transaction_id"]: r for r in deposits.waiting_on_human(db)}
    held = set()
    for row in deposits.held_for_decision(db):
        held.add(row["transaction_id"])
        rows.setdefault(row["transaction_id"], row)
    open_waits = waits.open_waits_of(db, list(rows))
    out = []
    for tx, row in rows.items():
        view = deposit_view(row)
        reasons = [r for r in (view["state"],) if r in WAITING_REASONS] + (
            ["held"] if tx in held else []
        )
        view["waitsOn"] = "; ".join(WAITING_REASONS[r] for r in reasons)
        view.update(_deadline(rules, row, open_waits.get(tx, []), now))
        out.append(view)
    return sorted(out, key=_by_time_left)


def _deadline(
    rules: RuleBook | None, row: dict[str, Any], open_waits: list[waits.Wait], now: int
) -> dict[str, Any]:
    """`since`, `due`, `left` and `overdue` of one waiting deposit: its open wait that falls
    due first (the deposit's last change when no wait is recorded for it)."""
    since = open_waits[0].started_at if open_waits else ms_from_iso(row["updated_at"])
    ruleset = rules.ruleset_for(row["wallet_id"], row["wallet_name"]) if rules else None
    out: dict[str, Any] = {"since": iso_from_ms(since), "due": None, "left": "", "overdue": False}
    if ruleset is None or ruleset.deadline_s is None or not open_waits:
        return out
    due = min(w.started_at for w in open_waits) + ruleset.deadline_s * 1000
    overdue = due <= now
    left = duration_text(abs(due - now) // 1000)
    out.update(due=iso_from_ms(due), overdue=overdue)
    out["left"] = f"overdue by {left}" if overdue else left
    return out


def _by_time_left(view: dict[str, Any]) -> tuple[int, str, str]:
    """Deposits with a deadline by when it falls (ISO times sort as times), then the others by
    how long they have waited."""
    if view["due"] is not None:
        return (0, view["due"], view["transactionId"])
    return (1, view["since"], view["transactionId"])


def overview(db: Db, rules: RuleBook | None = None, now: int | None = None) -> dict[str, Any]:
    """The overview: what waits on a person (by time left), what failed, what the polls and
    the last reconciliation did; `rules`: those in force (their deadlines), `now`: epoch ms."""
    conn = conn_of(db)
    meta = all_meta(conn)
    return {
        "waiting": waiting(db, rules, now_ms() if now is None else now),
        "failed_actions": [dict(r) for r in actions.failed_with_events(conn)],
        "failed_events": events.page_events(
            db, status="failed", event_type=None, limit=PAGE_SIZE, offset=0
        ),
        "failed_alerts": [dict(r) for r in alerts.failed_alerts(conn)],
        "findings": findings.open_findings(db, limit=PAGE_SIZE),
        "abnormal": [r for r in abnormal.list_abnormal(db, limit=PAGE_SIZE)],
        "polls": {name: meta.get(f"last_{name}_poll_ok") for name in POLLS},
        "last_webhook": meta.get("last_webhook_at"),
        "webhook_auth_refused": auth_refusal_streak(meta),
        "reconciliation": findings.last_run(db),
        "by_state": deposits.deposits_by_state(db),
        "queues": {
            "pending events": events.count_pending(db),
            "failed events": events.count_failed(db),
            "open actions": actions.count_open(db),
            "failed actions": actions.count_failed(db),
            "failed alerts": alerts.count_failed(db),
            "held by a conflict (depositd resolve)": conflicts.count_held_deposits(db),
            "booked": ledger.count_booked(db),
        },
        "operator": operator_store.recent(db, limit=20),
        # The journal's head and its last verification (docs/audit.md, "How to verify").
        "journal": journal_status(db),
    }


def timeline(db: Db, tx: str) -> dict[str, Any] | None:
    """One deposit's timeline: facts with their source, actions, alerts by channel, events and
    what operators did; None when no such deposit is tracked."""
    row = deposits.get_deposit_row(db, tx)
    if row is None:
        return None
    fact_rows = []
    stored = facts.facts_of(db, tx)
    bodies = [json.loads(f["fact"] or "{}") for f in stored]
    applied = [bool(f["changed"]) for f in stored]
    changes = fact_changes(bodies, applied, [f["observed_at"] for f in stored])
    for i, (f, fact) in enumerate(zip(stored, bodies, strict=True)):
        change = None if changes is None else changes[i]
        fact_rows.append(
            {
                "recorded_at": f["recorded_at"],
                "source": f["source"],
                "event_id": f["event_id"],
                "changed": applied[i],
                # Which fields it changed; "moved" only when the state did (worker.track.history)
                "moved": change is not None and change.moved is not None,
                "change": (
                    change.describe()
                    if change is not None
                    else ("changed the deposit" if applied[i] else "known already")
                ),
                "status": fact.get("status"),
                "white_list_status": fact.get("white_list_status"),
                "credit_status": fact.get("credit_status"),
            }
        )
    return {
        "deposit": deposit_view(row),
        "facts": fact_rows,
        "actions": [_action(a) for a in actions.actions_of(db, tx)],
        "alerts": alerts.alerts_of(db, tx),
        "events": events.events_of(db, tx),
        "operator": operator_store.recent(db, subject=tx),
    }


def _action(row: Any) -> dict[str, Any]:
    # Never the params: a submission's hold the payer's details (its profile is named instead).
    params = json.loads(row["params"] or "{}")
    keys = ("id", "created_at", "updated_at", "trigger", "rule_set", "rule_set_version")
    out = {k: row[k] for k in keys}
    out.update(
        rule=row["rule"],
        action=row["action"],
        status=row["status"],
        attempts=row["attempts"],
        outcome=row["outcome"],
        event_id=row["event_id"],
        profile=params.get("profile") if isinstance(params, dict) else None,
        condition=params.get("condition") if isinstance(params, dict) else None,
    )
    return out


def deposit_page(db: Db, state: str | None, page: int) -> list[dict[str, Any]]:
    """One page of deposits (of one state when given)."""
    rows = deposits.page_deposits(db, state, limit=PAGE_SIZE + 1, offset=(page - 1) * PAGE_SIZE)
    return [deposit_view(r) for r in rows]


def event_page(
    db: Db, status: str | None, event_type: str | None, page: int
) -> list[dict[str, Any]]:
    """One page of stored events (never a body)."""
    return events.page_events(
        db,
        status=status,
        event_type=event_type,
        limit=PAGE_SIZE + 1,
        offset=(page - 1) * PAGE_SIZE,
    )


def ledger_page(db: Db, day: str, page: int) -> list[dict[str, Any]]:
    """One page of one day's bookings."""
    return ledger.booked_on_day(db, day, limit=PAGE_SIZE + 1, offset=(page - 1) * PAGE_SIZE)


def finding_page(db: Db, open_only: bool, page: int) -> list[dict[str, Any]]:
    """One page of reconciliation findings."""
    return findings.page_findings(
        db, open_only=open_only, limit=PAGE_SIZE + 1, offset=(page - 1) * PAGE_SIZE
    )


def address_list(db: Db) -> list[dict[str, Any]]:
    """The registered source addresses (`depositd addresses`), the profile by name."""
    keys = ("id", "wallet_id", "wallet_address", "network", "memo", "status", "fail_message")
    return [
        {**{k: r[k] for k in keys}, "profile": r["profile"], "updated_at": r["updated_at"]}
        for r in addresses.list_addresses(conn_of(db))
    ]


def age(iso: str | None, now: datetime | None = None) -> str:
    """How long ago an ISO time was, in the largest whole unit ("3 min ago")."""
    if not iso:
        return ""
    try:
        then_ms = ms_from_iso(iso)
    except ValueError:
        return ""
    now_ms = int((now or datetime.now(UTC)).timestamp() * 1000)
    seconds = max(0, (now_ms - then_ms) // 1000)
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def utc(iso: str | None) -> str:
    """An ISO time as 'YYYY-MM-DD HH:MM:SS UTC'."""
    if not iso:
        return "-"
    try:
        moment = datetime.fromtimestamp(ms_from_iso(iso) / 1000, UTC)
    except ValueError:
        return str(iso)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def path_segment(value: object) -> str:
    """A value (a transactionId, an eventId) as one URL path segment: "/", "?", "#" and the
    rest percent-encoded, so an id cannot point a link or a form at another path."""
    return quote(str(value), safe="")


SEARCH_LIMIT = 50


def search(db: Db, text: str) -> dict[str, Any]:
    """Deposits, registered source addresses, reconciliation findings and abnormal funds that
    a transactionId, txHash or address names: at most `SEARCH_LIMIT` of each kind, `more`
    naming the kinds that have more."""
    keys = ("id", "wallet_id", "wallet_address", "network", "status", "profile", "updated_at")
    found = {
        "deposits": [
            deposit_view(r) for r in deposits.search_deposits(db, text, limit=SEARCH_LIMIT + 1)
        ],
        "findings": findings.search_findings(db, text, limit=SEARCH_LIMIT + 1),
        "abnormal": abnormal.search_abnormal(db, text, limit=SEARCH_LIMIT + 1),
    }
    return {
        **{kind: rows[:SEARCH_LIMIT] for kind, rows in found.items()},
        "more": {kind for kind, rows in found.items() if len(rows) > SEARCH_LIMIT},
        "limit": SEARCH_LIMIT,
        "addresses": [
            {k: r[k] for k in keys} for r in addresses.search_addresses(conn_of(db), text)
        ],
    }


def unbooked_page(db: Db, page: int) -> list[dict[str, Any]]:
    """One page of the deposits credited or completed but not in the ledger."""
    rows = deposits.completed_not_booked(db, limit=PAGE_SIZE + 1, offset=(page - 1) * PAGE_SIZE)
    return [deposit_view(r) for r in rows]
