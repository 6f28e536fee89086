"""The findings and reconcile_runs tables, and the ledger reads reconciliation compares.

A finding is one disagreement between the ledger and the provider's books for one day, keyed by
(day, kind, subject); `save_findings` writes a whole run at once (new ones inserted, those seen
again touched, those gone marked resolved) so a run is never half-written.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from worker.provider import canonical
from worker.store import journal
from worker.store.database import has_table
from worker.store.db import Db
from worker.store.deposits import CREDIT_DAY_TIME
from worker.store.pg import dialect

FINDING_COLUMNS = (
    "day",
    "kind",
    "subject",
    "transaction_id",
    "tx_hash",
    "ledger_amount",
    "report_amount",
    "currency",
    "network",
    "wallet_id",
    "detail",
)


@dataclass(frozen=True)
class Finding:
    """One disagreement found by a run (before it is stored)."""

    day: str
    kind: str
    subject: str
    transaction_id: str | None = None
    tx_hash: str | None = None
    ledger_amount: str | None = None
    report_amount: str | None = None
    currency: str | None = None
    network: str | None = None
    wallet_id: int | None = None
    detail: str | None = None

    def values(self) -> list[Any]:
        """The row's values in FINDING_COLUMNS order."""
        return [getattr(self, c) for c in FINDING_COLUMNS]


def _credit_day(db: Db) -> str:
    """The UTC day a booked deposit's credit fell on: by the provider's clock, as its daily
    report is cut (`CREDIT_DAY_TIME`); else when depositd saw the credit (rows credited before
    the provider's time was kept); else the booking time."""
    days = []
    for key in (CREDIT_DAY_TIME, "credit_status"):
        days.append(_DAY_OF_FACT_TIME[dialect(db)].format(key=key))
    return f"COALESCE({days[0]}, {days[1]}, substr(l.booked_at, 1, 10))"


# The UTC day (YYYY-MM-DD) of one of a deposit's fact times (ms, under `key` of its JSON).
_DAY_OF_FACT_TIME = {
    "sqlite": "date(json_extract(d.fact_time, '$.{key}') / 1000, 'unixepoch')",
    "postgres": "to_char(to_timestamp((d.fact_time::jsonb ->> '{key}')::bigint / 1000)"
    " AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
}


_LEDGER_SELECT = (
    "SELECT l.transaction_id, l.amount, l.currency, l.network, l.tx_hash, {day} FROM ledger l"
    " LEFT JOIN deposits d ON d.transaction_id = l.transaction_id"
)


def ledger_rows_for_day(db: Db, day: str) -> Iterator[tuple[Any, ...]]:
    """(transactionId, amount, currency, network, txHash, credit day) of each deposit booked
    whose credit fell on `day` (the provider's credit time; the booking time when none is
    known)."""
    credit_day = _credit_day(db)
    yield from db.execute(
        _LEDGER_SELECT.format(day=credit_day) + f" WHERE {credit_day} = ?"
        " ORDER BY l.transaction_id",
        [day],
    )


def ledger_row_by_id(db: Db, transaction_id: str) -> tuple[Any, ...] | None:
    """The booked deposit with this transactionId, as `ledger_rows_for_day` gives it."""
    row = db.execute(
        _LEDGER_SELECT.format(day=_credit_day(db)) + " WHERE l.transaction_id = ?",
        [transaction_id],
    ).fetchone()
    return None if row is None else tuple(row)


def ledger_row_by_tx_hash(db: Db, tx_hash: str) -> tuple[Any, ...] | None:
    """A booked deposit with this txHash (case-blind), as `ledger_rows_for_day` gives it."""
    row = db.execute(
        _LEDGER_SELECT.format(day=_credit_day(db))
        + " WHERE lower(l.tx_hash) = lower(?) ORDER BY l.transaction_id LIMIT 1",
        [canonical.tx_hash(tx_hash)],
    ).fetchone()
    return None if row is None else tuple(row)


def held_amounts(db: Db, states: Sequence[str]) -> Iterator[tuple[int, str, str]]:
    """(walletId, currency, amount) of each tracked deposit in one of `states`."""
    marks = ",".join("?" for _ in states)
    yield from db.execute(
        "SELECT wallet_id, currency, amount FROM deposits WHERE state IN"
        f" ({marks}) AND wallet_id IS NOT NULL AND amount IS NOT NULL",
        list(states),
    )


def tracked_wallets(db: Db) -> list[int]:
    """Every walletId a tracked deposit names."""
    rows = db.execute(
        "SELECT DISTINCT wallet_id FROM deposits WHERE wallet_id IS NOT NULL ORDER BY wallet_id"
    )
    return [int(r[0]) for r in rows]


# Drift of held balances belongs to the day it was read, not to the day a run reconciles: only
# a balance check resolves it (`save_findings`).
DRIFT = "held_balance_drift"


def save_findings(db: Db, day: str, found: Sequence[Finding], now: str) -> list[int]:
    """Store one run's findings of `day`; returns the ids of findings new to the table.

    Seen again: `last_seen` moves (and a resolved one is open again); an acknowledged one
    with other amounts than it was acknowledged for is open and new again (not a drift, whose
    figures move with every deposit held). Not seen this time: marked
    resolved now, never reported again: the findings of `day`, and the held-balance drifts of
    any day (each run checks the balances as they are now; `found` holds the drifts of this
    check, dated the day they were read).
    """
    new: list[int] = []
    before = _acknowledged_amounts(db, day, found)
    cols = ", ".join(FINDING_COLUMNS)
    marks = ",".join("?" for _ in FINDING_COLUMNS)
    for f in found:
        inserted = db.execute(
            f"INSERT INTO findings ({cols}, first_seen, last_seen) VALUES ({marks}, ?, ?)"
            " ON CONFLICT DO NOTHING RETURNING id",
            [*f.values(), now, now],
        ).fetchone()
        if inserted is not None:
            new.append(int(inserted[0]))
            continue
        db.execute(
            "UPDATE findings SET last_seen=?, resolved_at=NULL, ledger_amount=?,"
            " report_amount=?, detail=? WHERE day=? AND kind=? AND subject=?",
            [now, f.ledger_amount, f.report_amount, f.detail, f.day, f.kind, f.subject],
        )
        reopened = _reopen_if_amounts_changed(db, f, before)
        if reopened is not None:
            new.append(reopened)
    db.execute(
        "UPDATE findings SET resolved_at=? WHERE day=? AND kind<>? AND resolved_at IS NULL"
        " AND last_seen<>?",
        [now, day, DRIFT, now],
    )
    db.execute(
        "UPDATE findings SET resolved_at=? WHERE kind=? AND resolved_at IS NULL AND last_seen<>?",
        [now, DRIFT, now],
    )
    return new


def _acknowledged_amounts(
    db: Db, day: str, found: Sequence[Finding]
) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(day, kind, subject) -> the stored row of each acknowledged finding of `day` that
    `found` names again (drifts aside)."""
    named = {(f.day, f.kind, f.subject) for f in found if f.kind != DRIFT}
    rows = db.execute(
        "SELECT id, day, kind, subject, ledger_amount, report_amount, acknowledged_by,"
        " acknowledged_at, note FROM findings WHERE day=? AND kind<>?"
        " AND acknowledged_at IS NOT NULL",
        [day, DRIFT],
    ).fetchall()
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        row = dict(r)
        key = (str(row["day"]), str(row["kind"]), str(row["subject"]))
        if key in named:
            out[key] = row
    return out


def _amount_changed(old: str | None, new: str | None) -> bool:
    if old is None or new is None:
        return old is not new
    try:
        return Decimal(old) != Decimal(new)
    except ArithmeticError:
        return old != new


def _reopen_if_amounts_changed(
    db: Db, f: Finding, before: dict[tuple[str, str, str], dict[str, Any]]
) -> int | None:
    """An acknowledged finding seen again with other amounts is another difference: its
    acknowledgement (of the amounts it was given for) is lifted, kept in its note, and the
    finding is open and reported again; returns its id then."""
    row = before.get((f.day, f.kind, f.subject))
    if row is None or not (
        _amount_changed(row["ledger_amount"], f.ledger_amount)
        or _amount_changed(row["report_amount"], f.report_amount)
    ):
        return None
    earlier = (
        f"acknowledged by {row['acknowledged_by']} at {row['acknowledged_at']} for ledger"
        f" {row['ledger_amount']}, report {row['report_amount']}: {row['note']}"
    )
    db.execute(
        "UPDATE findings SET acknowledged_by=NULL, acknowledged_at=NULL, note=? WHERE id=?",
        [earlier, row["id"]],
    )
    return int(row["id"])


def open_drift(db: Db) -> list[dict[str, Any]]:
    """The open held-balance drifts (of whichever day they were read), oldest first."""
    rows = db.execute(
        "SELECT * FROM findings WHERE kind=? AND resolved_at IS NULL ORDER BY day, id", [DRIFT]
    )
    return [dict(r) for r in rows]


def record_run(
    db: Db,
    day: str,
    *,
    started_at: str,
    finished_at: str,
    outcome: str,
    findings: int,
    error: str | None = None,
    ledger_mark: str | None = None,
) -> None:
    """One reconciliation run: clean, findings or failed; a completed one with the mark of the
    ledger side it compared (`ledger_mark`). Its RECONCILED journal entry goes with it."""
    db.execute(
        "INSERT INTO reconcile_runs (day, started_at, finished_at, outcome, findings, error,"
        " ledger_mark) VALUES (?,?,?,?,?,?,?)",
        [day, started_at, finished_at, outcome, findings, error, ledger_mark],
    )
    body = {"day": day, "outcome": outcome, "findings": findings, "ledger_mark": ledger_mark}
    journal.append_at_commit(db, journal.RECONCILED, f"day:{day}", body)


def findings_of_day(db: Db, day: str) -> list[dict[str, Any]]:
    """The open findings of one day, in the order they were found."""
    rows = db.execute(
        "SELECT * FROM findings WHERE day=? AND resolved_at IS NULL ORDER BY id", [day]
    )
    return [dict(r) for r in rows]


def open_findings(db: Db, *, limit: int = 1000) -> list[dict[str, Any]]:
    """Findings neither resolved nor acknowledged, oldest day first."""
    rows = db.execute(
        "SELECT * FROM findings WHERE resolved_at IS NULL AND acknowledged_at IS NULL"
        " ORDER BY day, id LIMIT ?",
        [limit],
    )
    return [dict(r) for r in rows]


def open_counts_by_kind(db: Db) -> dict[str, int]:
    """Open (unresolved, unacknowledged) findings per kind."""
    rows = db.execute(
        "SELECT kind, COUNT(*) FROM findings WHERE resolved_at IS NULL"
        " AND acknowledged_at IS NULL GROUP BY kind"
    )
    return {str(r[0]): int(r[1]) for r in rows}


def page_findings(db: Db, *, open_only: bool, limit: int, offset: int) -> list[dict[str, Any]]:
    """One page of findings, latest day first; only the open ones (neither resolved nor
    acknowledged) when asked."""
    where = " WHERE resolved_at IS NULL AND acknowledged_at IS NULL" if open_only else ""
    rows = db.execute(
        f"SELECT * FROM findings{where} ORDER BY day DESC, id LIMIT ? OFFSET ?", [limit, offset]
    )
    return [dict(r) for r in rows]


def get_finding(db: Db, finding_id: int) -> dict[str, Any] | None:
    """One finding by id."""
    row = db.execute("SELECT * FROM findings WHERE id=?", [finding_id]).fetchone()
    return None if row is None else dict(row)


def acknowledge(db: Db, finding_id: int, *, by: str, note: str, now: str) -> bool:
    """Record who acknowledged a finding, when and why, unless it is acknowledged already;
    False when there is no such finding or it was acknowledged before (the first stands).

    One conditional statement: of two acknowledgements at the same moment on PostgreSQL, the
    second waits for the first's row lock, then finds the row acknowledged and changes nothing.
    """
    cur = db.execute(
        "UPDATE findings SET acknowledged_by=?, acknowledged_at=?, note=?"
        " WHERE id=? AND acknowledged_at IS NULL",
        [by, now, note, finding_id],
    )
    return cur.rowcount == 1


def last_run(db: Db) -> dict[str, Any] | None:
    """The latest reconciliation run, or None."""
    row = db.execute("SELECT * FROM reconcile_runs ORDER BY id DESC LIMIT 1").fetchone()
    return None if row is None else dict(row)


def last_reconciled_day(db: Db) -> str | None:
    """The latest day a run completed (clean or with findings)."""
    row = db.execute(
        "SELECT MAX(day) FROM reconcile_runs WHERE outcome IN ('clean', 'findings')"
    ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def day_reconciled(db: Db, day: str) -> bool:
    """Did a run of `day` complete (clean or with findings)?"""
    row = db.execute(
        "SELECT 1 FROM reconcile_runs WHERE day=? AND outcome IN ('clean', 'findings') LIMIT 1",
        [day],
    ).fetchone()
    return row is not None


def reconciliation_status(db: Db) -> dict[str, Any] | None:
    """What `status` shows of reconciliation: the last run and the open findings by kind;
    None on a database without the findings table (not migrated yet)."""
    if not has_table(db, "findings"):
        return None
    last = last_run(db)
    return {
        "lastRun": None
        if last is None
        else {
            "day": last["day"],
            "outcome": last["outcome"],
            "findings": last["findings"],
            "finishedAt": last["finished_at"],
            "error": last["error"],
        },
        "lastReconciledDay": last_reconciled_day(db),
        "openFindings": open_counts_by_kind(db),
    }


def failure_alerted(db: Db, day: str) -> bool:
    """Was a reconcile_failed alert already queued for this day?"""
    row = db.execute(_FAILURE_ALERTED[dialect(db)], [day]).fetchone()
    return row is not None


_FAILURE_ALERTED = {
    "sqlite": "SELECT 1 FROM actions WHERE action='alert' AND trigger='reconcile_failed'"
    " AND json_extract(params, '$.once_per')=? LIMIT 1",
    "postgres": "SELECT 1 FROM actions WHERE action='alert' AND trigger='reconcile_failed'"
    " AND (params::jsonb ->> 'once_per')=? LIMIT 1",
}


def findings_between(db: Db, first_day: str, last_day: str) -> list[dict[str, Any]]:
    """Every finding (open, acknowledged or resolved) of the days from one to another
    (YYYY-MM-DD, both included), by day."""
    rows = db.execute(
        "SELECT * FROM findings WHERE day BETWEEN ? AND ? ORDER BY day, id", [first_day, last_day]
    )
    return [dict(r) for r in rows]


def findings_between_after(
    db: Db,
    first_day: str,
    last_day: str,
    after: tuple[str, int] | None,
    *,
    limit: int,
) -> list[dict[str, Any]]:
    """`findings_between` a chunk at a time: the first `limit` findings after `after` (the
    (day, id) of the previous chunk's last one; None: from the start)."""
    where = ""
    params: list[Any] = [first_day, last_day]
    if after is not None:
        where = " AND (day > ? OR (day = ? AND id > ?))"
        params += [after[0], after[0], after[1]]
    rows = db.execute(
        f"SELECT * FROM findings WHERE day BETWEEN ? AND ?{where} ORDER BY day, id LIMIT ?",
        [*params, limit],
    )
    return [dict(r) for r in rows]


def search_findings(db: Db, text: str, *, limit: int = 50) -> list[dict[str, Any]]:
    """Findings about the deposit `text` (a transactionId) or the txHash `text` (whatever its
    case), latest day first, at most `limit`: a report record depositd never booked has a
    txHash only."""
    rows = db.execute(
        "SELECT * FROM findings WHERE transaction_id = ? OR lower(tx_hash) = lower(?)"
        " ORDER BY day DESC, id LIMIT ?",
        [text, text, limit],
    )
    return [dict(r) for r in rows]


def ledger_mark(transaction_ids: Iterable[str]) -> str:
    """What a day's ledger side is, in a few characters: the count of its rows and a digest of
    their transactionIds (a row gained, or moved to another day, changes it)."""
    ids = sorted(transaction_ids)
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]
    return f"{len(ids)}:{digest}"


def days_due(db: Db, first_day: str, last_day: str) -> list[tuple[str, str]]:
    """(day, why) of each day from `first_day` to `last_day` (YYYY-MM-DD, both included)
    that a run must compare (again), oldest first (see docs/reconciliation.md,
    "When a day is final"):

    - `ledger changed since its run`: the day's ledger side (the rows credited that day) is not
      the one its last completed run compared: a row was booked since, or its credit moved
      (a run recorded without its mark: a row booked after it started);
    - `not reconciled`: no run of the day completed, and the day holds ledger rows, or comes
      after the first day any run completed, or is `last_day` (days before depositd reconciled
      anything, without a booking, are none of its business).
    """
    credit_day = _credit_day(db)
    ids: dict[str, list[str]] = {}
    latest: dict[str, str] = {}
    for day, tx, booked_at in db.execute(
        f"SELECT {credit_day}, l.transaction_id, l.booked_at FROM ledger l"
        " LEFT JOIN deposits d ON d.transaction_id = l.transaction_id"
        # Booked no earlier than the day before its credit (a provider's clock ahead of ours
        # by less than a day): the credit time is read only for rows that recent.
        f" WHERE l.booked_at >= ? AND {credit_day} BETWEEN ? AND ?",
        [_day_before(first_day), first_day, last_day],
    ):
        ids.setdefault(str(day), []).append(str(tx))
        latest[str(day)] = max(latest.get(str(day), ""), str(booked_at or ""))
    runs = {
        str(r[0]): (r[1], str(r[2] or ""))
        for r in db.execute(
            "SELECT day, ledger_mark, started_at FROM reconcile_runs WHERE id IN"
            " (SELECT MAX(id) FROM reconcile_runs WHERE outcome IN ('clean', 'findings')"
            " AND day BETWEEN ? AND ? GROUP BY day)",
            [first_day, last_day],
        )
    }
    first = db.execute(
        "SELECT MIN(day) FROM reconcile_runs WHERE outcome IN ('clean', 'findings')"
    ).fetchone()[0]
    out: list[tuple[str, str]] = []
    day = dt.date.fromisoformat(first_day)
    while day.isoformat() <= last_day:
        text = day.isoformat()
        run = runs.get(text)
        if run is None:
            if text in ids or text == last_day or (first is not None and text > str(first)):
                out.append((text, "not reconciled"))
        else:
            mark, started = run
            changed = (
                mark != ledger_mark(ids.get(text, []))
                if mark is not None
                else latest.get(text, "") > started
            )
            if changed:
                out.append((text, "ledger changed since its run"))
        day += dt.timedelta(days=1)
    return out


def _day_before(day: str) -> str:
    return (dt.date.fromisoformat(day) - dt.timedelta(days=1)).isoformat()
