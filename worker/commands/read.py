"""Read-only commands: `events`, `deposits`, `ledger`, `addresses` (docs/reference.md).

They open the database with a plain read-only connection, so they run beside `serve` (WAL lets
readers and the writer proceed together), and as immutable where a WAL reader cannot start (see
`_readable`). Human output is aligned columns; `--json` prints one object per line. A stored
event's body is never printed (it may carry payer data).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from worker.commands import eventfilter
from worker.commands.dbopen import run_on_db
from worker.provider import jsonio
from worker.store import operator as operator_store
from worker.store.actions import actions_of, failed_with_events
from worker.store.addresses import list_addresses
from worker.store.alerts import failed_alerts
from worker.store.db import Connection
from worker.store.deposits import get_deposit_row, list_deposits
from worker.store.facts import facts_of
from worker.store.ledger import booked_since
from worker.track.history import FactChange, fact_changes
from worker.track.tracker import Deposit, State


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    """Print rows as aligned columns under a header line."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [headers, *cells]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _json_line(obj: Mapping[str, Any], out: TextIO) -> None:
    print(jsonio.dumps(dict(obj)), file=out)


# --- events ------------------------------------------------------------------------------


def event_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """An `events` row as `events --json` prints it (never the body)."""
    return {
        "kind": "event",
        "eventId": row["event_id"],
        "eventType": row["event_type"],
        "referenceId": row["reference_id"],
        "transactionId": row["transaction_id"],
        "receivedAt": row["received_at"],
        "status": row["status"],
        "processedAt": row["processed_at"],
        "error": row["error"],
    }


# Action and alert lines of `events --failed --json` carry the keys docs/reference.md pins for
# every line (eventId, eventType, transactionId, receivedAt, status): for an action, those of
# the event it came from (null once retention pruned it); an alert belongs to no event.


def action_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A failed `actions` row as `events --failed --json` prints it (`kind` "action")."""
    return {
        "kind": "action",
        "eventId": row["event_id"],
        "eventType": row["event_type"],
        "transactionId": row["transaction_id"],
        "receivedAt": row["received_at"],
        "status": row["status"],
        "id": row["id"],
        "trigger": row["trigger"],
        "ruleSet": row["rule_set"],
        "ruleSetVersion": row["rule_set_version"],
        "rule": row["rule"],
        "action": row["action"],
        "attempts": row["attempts"],
        "outcome": row["outcome"],
        "updatedAt": row["updated_at"],
    }


def alert_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A failed `alerts` row as `events --failed --json` prints it (`kind` "alert")."""
    return {
        "kind": "alert",
        "eventId": None,
        "eventType": None,
        # "-": an alert about no deposit (a poll failing, a reload refused).
        "transactionId": None if row["transaction_id"] == "-" else row["transaction_id"],
        "receivedAt": None,
        "status": row["status"],
        "id": row["id"],
        "alert": row["dedupe_key"],
        "condition": row["condition"],
        "severity": row["severity"],
        "channel": row["channel"],
        "attempts": row["attempts"],
        "error": row["last_error"],
        "createdAt": row["created_at"],
    }


def _events(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    follows = getattr(args, "follow", False)
    if follows and args.failed:
        print("depositd: --follow prints new events; leave --failed out", file=sys.stderr)
        return 2
    try:
        rows = eventfilter.select_events(conn, args)
    except ValueError as exc:
        print(f"depositd: --since {args.since!r} {exc}", file=sys.stderr)
        return 2
    actions, alerts = _failed_actions(conn) if args.failed else ([], [])
    if args.json:
        for line in [*map(event_json, rows), *actions, *alerts]:
            _json_line(line, out)
    else:
        table(_EVENT_HEADERS, [_event_cells(r) for r in rows], out)
    if follows:
        out.flush()

        def emit(row: Any) -> None:
            if args.json:
                _json_line(event_json(row), out)
            else:
                print("  ".join(_cell(c) for c in _event_cells(row)), file=out)
            out.flush()

        return eventfilter.follow(conn, args, rows[-1]["seq"] if rows else 0, emit)
    if args.json:
        return 0
    if actions:
        print("\nfailed actions", file=out)
        columns = ["id", "transactionId", "trigger", "rule", "action", "attempts", "outcome"]
        table(columns, [[a[c] for c in columns] for a in actions], out)
    if alerts:
        print("\nfailed alerts", file=out)
        table(
            ["alert", "severity", "channel", "attempts", "error"],
            [[a["alert"], a["severity"], a["channel"], a["attempts"], a["error"]] for a in alerts],
            out,
        )
    return 0


_EVENT_HEADERS = ["receivedAt", "eventId", "eventType", "transactionId", "status", "error"]


def _event_cells(r: Mapping[str, Any]) -> list[Any]:
    return [
        r["received_at"],
        r["event_id"],
        r["event_type"],
        r["transaction_id"],
        r["status"],
        r["error"],
    ]


def _failed_actions(
    conn: Connection,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Failed actions and alerts that could not be sent, as their JSON lines."""
    actions = failed_with_events(conn)
    alerts = failed_alerts(conn)
    return [action_json(a) for a in actions], [alert_json(a) for a in alerts]


def run_events(args: argparse.Namespace) -> int:
    """`depositd events [--failed] [--json] [--type T] [--since ISO] [--limit N] [--follow]`."""
    return run_on_db(args, _events)


# --- deposits ----------------------------------------------------------------------------

_DEPOSIT_COLUMNS = (
    "transactionId",
    "walletId",
    "currency",
    "network",
    "amount",
    "state",
    "status",
    "whiteListStatus",
    "creditStatus",
    "updatedAt",
)


def deposit_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A `deposits` row as `deposits --json` prints it."""
    return Deposit.from_row(dict(row)).as_json()


def _deposits(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    if args.transaction_id:
        if args.state:
            print("depositd: give a transactionId or --state, not both", file=sys.stderr)
            return 2
        return _one_deposit(conn, args.transaction_id, args.json, out)
    states = {s.value for s in State}
    if args.state and args.state not in states:
        print(
            f"depositd: unknown state {args.state!r} (known: {', '.join(sorted(states))})",
            file=sys.stderr,
        )
        return 2
    rows = list_deposits(conn, args.state)
    deposits = [deposit_json(r) for r in rows]
    if args.json:
        for d in deposits:
            _json_line(d, out)
        return 0
    table(_DEPOSIT_COLUMNS, [[d.get(c) for c in _DEPOSIT_COLUMNS] for d in deposits], out)
    return 0


def _one_deposit(conn: Connection, tx: str, as_json: bool, out: TextIO) -> int:
    row = get_deposit_row(conn, tx)
    if row is None:
        print(f"depositd: no deposit {tx!r}", file=sys.stderr)
        return 1
    deposit = deposit_json(row)
    facts = [
        {
            "recordedAt": f["recorded_at"],
            "source": f["source"],
            "eventId": f["event_id"],
            "observedAt": f["observed_at"],
            "changed": bool(f["changed"]),
            "fact": json.loads(f["fact"] or "{}"),
        }
        for f in facts_of(conn, tx)
    ]
    replayed = fact_changes(
        [f["fact"] for f in facts], [f["changed"] for f in facts], [f["observedAt"] for f in facts]
    )
    changes: list[FactChange | None] = [None] * len(facts) if replayed is None else [*replayed]
    for f, change in zip(facts, changes, strict=True):
        # Which fields the fact changed, and the state it moved the deposit to (docs/reference.md)
        f["changedFields"] = None if change is None else list(change.fields)
        f["moved"] = (
            None
            if change is None or change.moved is None
            else {"from": change.moved[0], "to": change.moved[1]}
        )
        f["change"] = ("yes" if f["changed"] else "no") if change is None else change.describe()
    actions = [
        {
            "createdAt": a["created_at"],
            "trigger": a["trigger"],
            "ruleSet": a["rule_set"],
            "ruleSetVersion": a["rule_set_version"],
            "rule": a["rule"],
            "action": a["action"],
            "status": a["status"],
            "attempts": a["attempts"],
            "outcome": a["outcome"],
            "eventId": a["event_id"],
        }
        for a in actions_of(conn, tx)
    ]
    operator = [
        {"at": o["at"], "kind": o["kind"], "by": o["remote"], "note": o["note"],
         "outcome": o["outcome"]}
        for o in reversed(operator_store.recent(conn, subject=tx))
    ]  # fmt: skip
    if as_json:
        shown = [{k: v for k, v in f.items() if k != "change"} for f in facts]
        _json_line(
            {**deposit, "facts": shown, "actions": actions, "operatorActions": operator}, out
        )
        return 0
    width = max(len(k) for k in deposit)
    for key, value in deposit.items():
        print(f"{key.ljust(width)}  {_cell(value)}", file=out)
    print("\nfacts", file=out)
    table(
        ["recordedAt", "source", "eventId", "status", "whiteListStatus", "creditStatus", "change"],
        [
            [
                f["recordedAt"],
                f["source"],
                f["eventId"],
                f["fact"].get("status"),
                f["fact"].get("white_list_status"),
                f["fact"].get("credit_status"),
                f["change"],
            ]
            for f in facts
        ],
        out,
    )
    print("\nactions", file=out)
    table(
        [
            "createdAt",
            "trigger",
            "rule",
            "action",
            "status",
            "attempts",
            "outcome",
            "ruleSetVersion",
        ],
        [
            [
                a["createdAt"],
                a["trigger"],
                a["rule"],
                a["action"],
                a["status"],
                a["attempts"],
                a["outcome"],
                a["ruleSetVersion"],
            ]
            for a in actions
        ],
        out,
    )
    if operator:
        print("\noperator actions", file=out)
        table(
            ["at", "by", "kind", "note", "outcome"],
            [[o["at"], o["by"], o["kind"], o["note"], o["outcome"]] for o in operator],
            out,
        )
    return 0


def run_deposits(args: argparse.Namespace) -> int:
    """`depositd deposits [--state S] [--json] [TRANSACTION_ID]`."""
    return run_on_db(args, _deposits)


# --- ledger ------------------------------------------------------------------------------

_LEDGER_COLUMNS = (
    "bookedAt",
    "transactionId",
    "walletId",
    "walletName",
    "currency",
    "network",
    "amount",
    "fromAddress",
    "txHash",
    "trigger",
)


def ledger_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A `ledger` row in the docs/reference.md format."""
    return {
        "transactionId": row["transaction_id"],
        "walletId": row["wallet_id"],
        "walletName": row["wallet_name"],
        "currency": row["currency"],
        "network": row["network"],
        "amount": row["amount"],
        "fromAddress": row["from_address"],
        "txHash": row["tx_hash"],
        "bookedAt": row["booked_at"],
        "trigger": row["trigger"],
    }


def parse_since(value: str) -> str:
    """--since as the stored timestamp format (UTC, milliseconds, Z); ValueError if unusable."""
    if not value.strip():
        raise ValueError("is empty (leave --since out to print the whole ledger)")
    return eventfilter.parse_time(value, what="--since")


def _ledger(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    since = None
    if args.since is not None:  # an empty --since is a mistake, not "no filter"
        try:
            since = parse_since(args.since)
        except ValueError as exc:
            print(f"depositd: --since {args.since!r} {exc}", file=sys.stderr)
            return 2
    rows = [ledger_json(r) for r in booked_since(conn, since)]
    if args.json:
        for entry in rows:
            _json_line(entry, out)
        return 0
    table(_LEDGER_COLUMNS, [[e[c] for c in _LEDGER_COLUMNS] for e in rows], out)
    return 0


def run_ledger(args: argparse.Namespace) -> int:
    """`depositd ledger [--json] [--since ISO]`."""
    return run_on_db(args, _ledger)


# --- addresses ---------------------------------------------------------------------------

_ADDRESS_COLUMNS = ("id", "walletId", "walletAddress", "network", "status", "profile", "updatedAt")


def address_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """An `addresses` row as `addresses --json` prints it (the profile by name only)."""
    return {
        "id": row["id"],
        "walletId": row["wallet_id"],
        "walletAddress": row["wallet_address"],
        "network": row["network"],
        "memo": row["memo"],
        "status": row["status"],
        "failMessage": row["fail_message"],
        "profile": row["profile"],
        "updatedAt": row["updated_at"],
    }


def _addresses(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    rows = [address_json(r) for r in list_addresses(conn)]
    if args.json:
        for entry in rows:
            _json_line(entry, out)
        return 0
    table(_ADDRESS_COLUMNS, [[e[c] for c in _ADDRESS_COLUMNS] for e in rows], out)
    return 0


def run_addresses(args: argparse.Namespace) -> int:
    """`depositd addresses [--json]`."""
    return run_on_db(args, _addresses)
