"""What an evidence bundle holds about one deposit, read from the database (docs/audit.md,
"Evidence for one deposit").

`gather` reads every row about the deposit in the caller's read transaction (one snapshot): its
webhooks as received, its facts, the rules that matched and what the provider answered, its
submissions (payer values only when asked for), what operators decided, its ledger row, the
reconciliation of its day, and the journal entries about all of it. The proof of those entries
up to the head is the one part that grows with the journal (a digest per entry since the first
of them): `proof_frame` gives its fixed part and `digests` reads its digests a chunk at a time,
so that neither a command nor the console holds them all at once.

Rows keep their column names and values as stored.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from worker import __version__
from worker.clock import utc_now
from worker.store import journal, submissions
from worker.store.actions import actions_of
from worker.store.alerts import alerts_of
from worker.store.conflicts import all_conflicts
from worker.store.db import Db
from worker.store.deposits import get_deposit_row
from worker.store.facts import facts_of
from worker.store.findings import ledger_row_by_id
from worker.store.pg import dialect
from worker.store.retention import SUBJECT as RETENTION_SUBJECT
from worker.store.tx import conn_of

FORMAT = "depositd-evidence/1"


def _plain(value: Any) -> Any:
    """A column's value as JSON holds it (money is text already; a Decimal stays exact)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, memoryview | bytes):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


def _row(row: Any) -> dict[str, Any]:
    return {key: _plain(value) for key, value in dict(row).items()}


def _json_column(text: Any) -> Any:
    """A column holding JSON text, as the JSON it holds (None stays None; text that is not
    JSON stays text)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _ledger_row(db: Db, transaction_id: str) -> dict[str, Any] | None:
    row = db.execute("SELECT * FROM ledger WHERE transaction_id = ?", [transaction_id]).fetchone()
    return None if row is None else _row(row)


def _body(raw: Any) -> dict[str, Any]:
    """A stored body's bytes: base64 always, the text too when it is UTF-8."""
    data = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
    out: dict[str, Any] = {"body_base64": base64.b64encode(data).decode("ascii")}
    try:
        out["body_text"] = data.decode("utf-8")
    except UnicodeDecodeError:
        out["body_text"] = None
    out["body_sha256"] = journal.sha256_hex(data)
    out["body_bytes"] = len(data)
    return out


_EVENT_SELECT = (
    "SELECT seq, event_id, event_type, reference_id, transaction_id, body, headers,"
    " received_at, status, error, processed_at FROM events"
)


# Every stored event passed these before it was stored (`checks_at_receipt` says which).
_VERIFIED = "at receipt, before it was stored: API-KEY, API-TIMESTAMP and API-SIGNATURE"


def _event(row: Any) -> dict[str, Any]:
    event = {k: _plain(v) for k, v in dict(row).items() if k not in ("body", "headers")}
    event["headers"] = _json_column(row["headers"]) or {}
    event["verified"] = _VERIFIED
    event.update(_body(row["body"]))
    return event


def _webhooks(db: Db, transaction_id: str, referenced: Iterable[str]) -> dict[str, Any]:
    """The deposit's stored events with their bodies and kept headers; the eventIds its facts
    or actions name whose rows are gone (pruned after `storage.retention_days`)."""
    rows = db.execute(f"{_EVENT_SELECT} WHERE transaction_id = ? ORDER BY seq", [transaction_id])
    events = {str(row["event_id"]): _event(row) for row in rows.fetchall()}
    gone = []
    for event_id in dict.fromkeys(referenced):
        if event_id in events:
            continue
        row = db.execute(f"{_EVENT_SELECT} WHERE event_id = ?", [event_id]).fetchone()
        if row is None:
            gone.append(event_id)
        else:
            events[event_id] = _event(row)
    return {
        "events": sorted(events.values(), key=lambda e: int(e["seq"])),
        "not_stored_any_more": sorted(gone),
    }


# Where a fact came from, by its row's source (the row does not say which poll read it).
_SOURCES = {
    "webhook": "webhook event {event_id}",
    "poll": "a poll of the provider (history, detail or catch-up: the row does not say which)",
    "submit": "the provider's answer to a submission of payer details",
}


def _facts(db: Db, transaction_id: str) -> list[dict[str, Any]]:
    out = []
    for row in facts_of(db, transaction_id):
        fact = _row(row)
        fact["fact"] = _json_column(fact["fact"])
        fact["from"] = _SOURCES.get(str(fact["source"]), str(fact["source"])).format(**fact)
        out.append(fact)
    return out


_RULE_COLUMNS = ("trigger", "rule_set", "rule_set_version", "rule", "action", "event_id")
_ANSWER_COLUMNS = ("action", "status", "attempts", "outcome", "idempotency_key", "updated_at")


def _actions(db: Db, transaction_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(each rule that matched, what each action's run answered), by action id."""
    matched, answers = [], []
    for row in actions_of(db, transaction_id):
        action = _row(row)
        matched.append(
            {
                "action_id": action["id"],
                "at": action["created_at"],
                **{k: action.get(k) for k in _RULE_COLUMNS},
                "params": _json_column(action.get("params")),
            }
        )
        answers.append({"action_id": action["id"], **{k: action.get(k) for k in _ANSWER_COLUMNS}})
    return matched, answers


def _submissions(db: Db, transaction_id: str, *, personal_data: bool) -> list[dict[str, Any]]:
    out = []
    for row in submissions.of_deposit(db, transaction_id):
        sent = _row(row)
        body = sent.pop("body")
        sent["fields"] = _json_column(sent["fields"])
        if personal_data:
            sent["payload"] = None if body is None else json.loads(body)
        out.append(sent)
    return out


def _findings_about(db: Db, transaction_id: str, tx_hash: str | None) -> list[dict[str, Any]]:
    if tx_hash:  # a report record depositd never booked names the txHash only
        rows = db.execute(
            "SELECT * FROM findings WHERE transaction_id = ? OR lower(tx_hash) = lower(?)"
            " ORDER BY day, id",
            [transaction_id, tx_hash],
        ).fetchall()
    else:
        rows = db.execute(
            "SELECT * FROM findings WHERE transaction_id = ? ORDER BY day, id", [transaction_id]
        ).fetchall()
    return [_row(r) for r in rows]


def _reconciliation(db: Db, days: Iterable[str]) -> list[dict[str, Any]]:
    """Each day's runs and every finding of the day (open, acknowledged or resolved)."""
    out = []
    for day in sorted(set(days)):
        runs = db.execute("SELECT * FROM reconcile_runs WHERE day = ? ORDER BY id", [day])
        findings = db.execute("SELECT * FROM findings WHERE day = ? ORDER BY id", [day])
        out.append(
            {
                "day": day,
                "runs": [_row(r) for r in runs.fetchall()],
                "findings": [_row(r) for r in findings.fetchall()],
            }
        )
    return out


def _operator_actions(db: Db, subjects: Iterable[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for subject in subjects:
        found = db.execute(
            "SELECT * FROM operator_actions WHERE subject = ? ORDER BY id", [subject]
        ).fetchall()
        rows += [_row(r) for r in found]
    rows.sort(key=lambda r: int(r["id"]))
    for row in rows:
        row["by"] = row.pop("remote")
    return rows


def _entries(db: Db, subjects: Iterable[str], action_ids: set[int]) -> list[journal.Entry]:
    """The journal entries about the subjects, and the retention entries naming one of the
    deposit's submissions, in order."""
    found: dict[int, journal.Entry] = {}
    for subject in subjects:
        for entry in journal.entries_about(db, subject):
            found[entry.seq] = entry
    for entry in journal.entries_about(db, RETENTION_SUBJECT):
        named = entry.body.get("action_ids") or []
        if action_ids.intersection(int(i) for i in named if str(i).isdigit()):
            found[entry.seq] = entry
    return [found[seq] for seq in sorted(found)]


_BEGIN_SNAPSHOT = {"sqlite": "BEGIN", "postgres": "BEGIN ISOLATION LEVEL REPEATABLE READ"}


@contextmanager
def snapshot(db: Db) -> Iterator[None]:
    """One read transaction for the block, so that every row read is of one moment (a
    command's connection; the store's reads are one already)."""
    conn = conn_of(db)
    conn.execute(_BEGIN_SNAPSHOT[dialect(db)])
    try:
        yield
    finally:
        conn.execute("ROLLBACK")


def known(db: Db, transaction_id: str) -> bool:
    """Whether anything is known of the deposit: tracked, booked, or journaled about."""
    for sql in (
        "SELECT 1 FROM deposits WHERE transaction_id = ?",
        "SELECT 1 FROM ledger WHERE transaction_id = ?",
        "SELECT 1 FROM journal WHERE subject = ? LIMIT 1",
    ):
        if db.execute(sql, [transaction_id]).fetchone() is not None:
            return True
    return False


def gather(
    db: Db,
    transaction_id: str,
    *,
    personal_data: bool,
    receipt: Mapping[str, Any],
    by: str,
) -> dict[str, Any] | None:
    """The bundle's content for one deposit, but for its proof's digests (`digests` reads them:
    from the proof's `from` to its `head`); None when nothing is known of it (no tracked
    deposit, no ledger row, no journal entry). Run it in one read transaction."""
    if not known(db, transaction_id):
        return None
    deposit = get_deposit_row(db, transaction_id)
    ledger = _ledger_row(db, transaction_id)
    facts = _facts(db, transaction_id)
    matched, answers = _actions(db, transaction_id)
    sent = _submissions(db, transaction_id, personal_data=personal_data)
    alerts = [_row(a) for a in alerts_of(db, transaction_id)]
    referenced = [str(f["event_id"]) for f in facts if f.get("event_id")]
    referenced += [str(a["event_id"]) for a in matched if a.get("event_id")]
    webhooks = _webhooks(db, transaction_id, referenced)
    tx_hash = (ledger or {}).get("tx_hash") or (deposit or {}).get("tx_hash")
    findings_about = _findings_about(db, transaction_id, tx_hash)
    booked = ledger_row_by_id(db, transaction_id)
    days = {str(booked[5])} if booked is not None and booked[5] else set()
    days |= {str(f["day"]) for f in findings_about}
    subjects = [
        transaction_id,
        *(f"action#{a['action_id']}" for a in matched),
        *(f"alert#{a['id']}" for a in alerts),
        *(f"event#{e['event_id']}" for e in webhooks["events"]),
        *(f"finding#{f['id']}" for f in findings_about),
        *(f"day#{d}" for d in sorted(days)),
    ]
    entries = _entries(
        db, [*subjects, *(f"day:{d}" for d in sorted(days))], {int(s["action_id"]) for s in sent}
    )
    hashes = sorted({str(e.body["rules_hash"]) for e in entries if e.body.get("rules_hash")})
    head = journal.head(db)
    proof = proof_frame(db, entries[0].seq, head) if entries and head is not None else None
    return {
        "format": FORMAT,
        "transaction_id": transaction_id,
        "written_at": utc_now(),
        "written_by": by,
        "depositd_version": __version__,
        "with_personal_data": personal_data,
        "deposit": None if deposit is None else {k: _plain(v) for k, v in deposit.items()},
        "webhooks": {"checks_at_receipt": dict(receipt), **webhooks},
        "facts": facts,
        "rules": {"matched": matched, "rules_hashes": hashes},
        "provider_answers": answers,
        "submissions": sent,
        "alerts": alerts,
        "operator": {
            "actions": _operator_actions(db, subjects),
            "conflicts": all_conflicts(db, transaction_id),
            "findings_acknowledged": [f for f in findings_about if f.get("acknowledged_at")],
        },
        "ledger": ledger,
        "reconciliation": _reconciliation(db, days),
        "journal": {"entries": [e.as_json() for e in entries], "proof": proof},
    }


def proof_frame(db: Db, first: int, upto: journal.Head) -> dict[str, Any]:
    """The fixed part of `journal.proof(db, first, upto)`: everything but its digests."""
    before = journal.entry_at(db, first - 1) if first > 1 else None
    return {
        "from": first,
        "prev_hash": journal.GENESIS if before is None else before.hash,
        "head": str(upto),
    }


def digests(db: Db, after: int, upto: int, *, limit: int) -> list[str]:
    """The digests of the entries after seq `after` up to `upto`, at most `limit`, in order."""
    rows = db.execute(
        "SELECT digest FROM journal WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
        [after, upto, limit],
    ).fetchall()
    return [str(r[0]) for r in rows]
