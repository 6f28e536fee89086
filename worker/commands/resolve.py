"""`depositd resolve`: a human decides a fixed-field conflict (`worker.track.conflicts`).

`depositd resolve TX` lists the deposit's conflicts, open and decided. `depositd resolve TX
--set amount=90 --by NAME [--note TEXT]` records the decision (value, who, when, note) on every
open conflict of the fields given, sets the deposit's fields to the decided values and, once no
conflict is left open, makes the booking that was held, exactly once, with the decided values.
It writes beside a running `serve` (SQLite WAL), in one transaction.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from worker.act.kinds.book import book_held
from worker.commands.dbopen import run_on_db
from worker.store import journal
from worker.store.conflicts import all_conflicts
from worker.store.conflicts import open_conflicts as open_of
from worker.store.db import Connection, Db
from worker.store.deposits import get_deposit_row, lock_deposit
from worker.store.sqlitestore import database, transaction
from worker.track.conflicts import DUPLICATE, FIELD_OF, WIRE_NAMES, decide, decided_value
from worker.track.tracker import Deposit


def _show(db: Db, tx: str, out: TextIO) -> int:
    rows = all_conflicts(db, tx)
    if not rows:
        print(f"{tx}: no conflict", file=out)
        return 0
    for r in rows:
        name = WIRE_NAMES.get(r["field"], r["field"])
        where = f"{r['source']} event {r['event_id']}" if r["event_id"] else f"{r['source']} fact"
        line = f"{name}: was {r['fixed_value']}, {where} said {r['seen_value']} ({r['created_at']})"
        if r["field"] == DUPLICATE:
            line = (
                f"duplicate: txHash {r['seen_value']} is booked for {r['fixed_value']} with the"
                f" same amount, toAddress and currency ({r['created_at']})"
            )
        if r["decided_at"]:
            line += f"; decided {r['decided_value']} by {r['decided_by']} at {r['decided_at']}"
            if r["note"]:
                line += f" ({r['note']})"
        else:
            line += "; open: booking held"
            if r["field"] == DUPLICATE:
                line += " (--set duplicate=yes: never booked, no: booked)"
        print(line, file=out)
    return 0


def _values(sets: list[str], open_fields: set[str]) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    problems: list[str] = []
    for item in sets:
        wire, sep, text = item.partition("=")
        name = FIELD_OF.get(wire.strip())
        if not sep or name is None:
            problems.append(
                f"--set {item!r}: expected FIELD=VALUE, FIELD one of {', '.join(FIELD_OF)}"
            )
            continue
        if name not in open_fields:
            problems.append(f"--set {wire}: {wire} has no open conflict")
            continue
        try:
            values[name] = decided_value(name, text)
        except ValueError as exc:
            problems.append(f"--set {wire}: {exc}")
    missing = sorted(WIRE_NAMES[f] for f in open_fields - set(values))
    if missing and not problems:
        problems.append(f"also decide {', '.join(missing)} (--set FIELD=VALUE each)")
    return values, problems


def _book_held(db: Db, tx: str, by: str, note: str, decided: str) -> str:
    """Make the booking held by the conflict, once, and journal its release (who, the note,
    whether it was booked now); what happened, for the output."""
    row = get_deposit_row(db, tx)
    assert row is not None
    deposit = Deposit.from_row(row)
    done = book_held(db, deposit, f"after the decision by {by}")
    if done is None:
        return "no booking was held; rules book it when the deposit is credited"
    released = {"decision": decided, "by": by, "note": note, "booked": done[1] == "booked"}
    journal.append_at_commit(db, journal.RELEASED, tx, released)
    return f"{done[1]} (amount {deposit.as_json()['amount']} {deposit.currency})"


def _resolve(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    db = database(conn)
    tx = args.transaction_id
    if get_deposit_row(db, tx) is None:
        print(f"depositd: no tracked deposit {tx}", file=sys.stderr)
        return 1
    if not args.set:
        return _show(db, tx, out)
    if not args.by or not args.by.strip():
        print("depositd: --by NAME is required to decide", file=sys.stderr)
        return 2
    # One write transaction, the write lock (SQLite) and the deposit's lock (PostgreSQL, where
    # reads do not wait for writers) taken first: the conflicts read are the ones decided, and
    # a second `resolve` at the same moment finds them decided and books nothing.
    with transaction(db):
        lock_deposit(db, tx)
        open_fields = {c["field"] for c in open_of(db, tx)}
        if not open_fields:
            print(f"depositd: {tx} has no open conflict", file=sys.stderr)
            return 1
        values, problems = _values(args.set, open_fields)
        if problems:
            for problem in problems:
                print(f"depositd: {problem}", file=sys.stderr)
            return 2
        by, note = args.by.strip(), args.note or ""
        decide(db, tx, values, by=by, note=args.note)
        decided = ", ".join(f"{WIRE_NAMES[n]}={v}" for n, v in values.items())
        done = _book_held(db, tx, by, note, decided)
        outcome = f"decided {decided}; {done}"
        operator = {"action": "resolve", "by": f"{by}@cli", "note": note, "outcome": outcome}
        journal.append_at_commit(db, journal.OPERATOR, tx, operator)
    print(f"{tx}: decided {decided} by {by}; {done}", file=out)
    return 0


def run(args: argparse.Namespace) -> int:
    """`depositd resolve TX [--set FIELD=VALUE ... --by NAME [--note TEXT]]`."""
    return run_on_db(args, _resolve, readonly=not args.set)
