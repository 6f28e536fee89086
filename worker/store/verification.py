"""Verification of the journal (docs/audit.md, "How to verify"): the chain recomputed from the
first entry, each entry checked against the rows it describes, then every ledger row and every
kept submission checked to have its entry.

What is checked, in this order, stopping at the first problem:

1. Every entry, in seq order: its digest and hash, its place after the one before (the chain),
   and the hash of an anchor's entry when one is given. A `booked` or `adopted` entry against
   the deposit's ledger row, column by column
   (`journal.LEDGER_FIELDS`, as text); a `submitted` entry against the submission's row (deposit,
   profile, field names, payload hash, and the kept payload's own hash unless a `purged` entry
   names the submission and the row says it was purged). A deposit is booked once, so a
   second `booked` or `adopted` entry about it is a problem (rows are never updated: an entry
   appended by hand must not make an edited row verify), and so is an `adopted` entry after
   the journal's first other entry (only the migration that starts the journal adopts rows).
2. Every ledger row has a `booked` or `adopted` entry (a row inserted by hand).
3. Every kept submission has a `submitted` entry (a record inserted by hand).

Everything is read a chunk at a time, each chunk in a read transaction of its own, so a
verification neither holds a merchant's whole ledger in memory nor keeps the service's reads
waiting. It needs no one snapshot: an entry commits with the rows it describes, and each side
is looked up after the other was read, so a booking committed meanwhile is seen whole. The
journal is read to its end as it is then (entries appended during the run included).

The last verification (when, its outcome, the head) is kept in the `meta` table: `status` and
the console show it. Nothing here reads or prints a payer value: a problem names entries,
deposits, submissions and column names, never what they hold.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from typing import Any, Protocol, TypeVar

from worker.store import journal
from worker.store.db import Db
from worker.store.journal import ADOPTED, BOOKED, LEDGER_FIELDS, PURGED, SUBMITTED, Entry, Head
from worker.store.meta import get_meta, set_meta

T = TypeVar("T")

# meta keys: the last verification (JSON, `Verification.as_json`), and the UTC day whose head
# the daily job published (`claim_publication`).
LAST_VERIFICATION = "journal_verification"
HEAD_PUBLISHED = "journal_head_published"

CHUNK = 1000  # entries or rows read at a time
_LEDGER_KINDS = (BOOKED, ADOPTED)


class Reader(Protocol):
    """What runs a read on the database: `Store.read`."""

    def __call__(self, fn: Callable[[Any], T], /) -> Awaitable[T]: ...


@dataclass(frozen=True)
class Verification:
    """One verification's outcome: `problem` names the first entry or row that does not hold
    (None: everything holds)."""

    at: str
    entries: int
    head: Head | None
    ledger_rows: int
    submissions: int
    problem: str | None
    anchor: Head | None = None

    @property
    def verified(self) -> bool:
        """Everything holds."""
        return self.problem is None

    def as_json(self) -> dict[str, Any]:
        """The outcome as `verify --json` prints it and the `meta` table keeps it."""
        return {
            "verified": self.verified,
            "at": self.at,
            "entries": self.entries,
            "head": None if self.head is None else str(self.head),
            "ledgerRows": self.ledger_rows,
            "submissions": self.submissions,
            "anchor": None if self.anchor is None else str(self.anchor),
            "problem": self.problem,
        }

    def summary(self) -> str:
        """One line: what was verified up to which head, or the first problem."""
        if self.problem is not None:
            return f"journal does not verify: {self.problem}"
        if self.head is None:
            text = "journal verified: empty (no entry yet)"
        else:
            text = f"journal verified: {self.entries} entries, head {self.head}"
        text += (
            f"; {self.ledger_rows} ledger row{_s(self.ledger_rows)} and {self.submissions}"
            f" submission{_s(self.submissions)} match their entries"
        )
        if self.anchor is not None:
            text += f"; the anchor {self.anchor} holds"
        return text


def _s(n: int) -> str:
    return "" if n == 1 else "s"


@dataclass
class _Run:
    """A verification under way: where the entries' pass is, what waits for a purge entry."""

    anchor: Head | None
    chunk: int
    last: Head | None = None
    entries: int = 0
    ledger_rows: int = 0
    submissions: int = 0
    # Kept submissions whose payload is gone (purged_at set), by action id, with their deposit:
    # each must be named by a `purged` entry, usually a later one than its `submitted` entry.
    awaiting_purge: dict[int, str] = field(default_factory=dict)
    # An entry other than `adopted` was seen: no `adopted` entry may follow.
    past_adoption: bool = False


async def verify(
    read: Reader, *, at: str, anchor: Head | None = None, chunk: int = CHUNK
) -> Verification:
    """Verify the journal and the rows it describes, read through `read` (`Store.read`) a chunk
    at a time; `at`: the time recorded with the outcome."""
    run = _Run(anchor=anchor, chunk=chunk)
    problem = await _entries(read, run)
    if problem is None:
        problem = await _ledger(read, run)
    if problem is None:
        problem = await _submissions(read, run)
    return Verification(
        at=at,
        entries=run.entries,
        head=run.last,
        ledger_rows=run.ledger_rows,
        submissions=run.submissions,
        problem=problem,
        anchor=anchor,
    )


# --- 1. the entries, in seq order ----------------------------------------------------------


async def _entries(read: Reader, run: _Run) -> str | None:
    while True:
        done, problem = await read(partial(_entries_chunk, run=run))
        if problem is not None or done:
            break
    end = 0 if run.last is None else run.last.seq
    if problem is None and run.anchor is not None and end < run.anchor.seq:
        problem = (
            f"the journal ends at entry {end}, before the anchor's entry {run.anchor.seq}:"
            " entries were removed, or the anchor is another database's"
        )
    if problem is None and run.awaiting_purge:
        problem = await _purges(read, run)
    return problem


def _entries_chunk(db: Db, run: _Run) -> tuple[bool, str | None]:
    """One chunk of entries checked; (no entry left, the first problem)."""
    after = 0 if run.last is None else run.last.seq
    batch = list(islice(journal.entries(db, after=after, chunk=run.chunk), run.chunk))
    subjects = sorted({e.subject for e in batch if e.kind in _LEDGER_KINDS})
    ledger, first = _ledger_rows(db, subjects), _first_ledger_entries(db, subjects)
    action_ids = sorted({a for a in map(_action_id, batch) if a is not None})
    kept = _kept_submissions(db, action_ids)
    for entry in batch:
        problem = journal.chain_problem([entry], start=run.last) or _anchor_problem(entry, run)
        if problem is None:
            if entry.kind == ADOPTED and run.past_adoption:
                problem = (
                    f"journal entry {entry.seq} (adopted {entry.subject}): an adopted entry after"
                    " the journal's first decision; only the migration that starts the journal"
                    " adopts rows (appended by hand?)"
                )
            elif entry.kind in _LEDGER_KINDS and first.get(entry.subject) != entry.seq:
                problem = (
                    f"journal entry {entry.seq} ({entry.kind} {entry.subject}): a second entry"
                    f" booking the deposit (the first is entry {first.get(entry.subject)}); a"
                    " deposit is booked once (appended by hand?)"
                )
            elif entry.kind in _LEDGER_KINDS:
                problem = _ledger_problem(entry, ledger.get(entry.subject))
            elif entry.kind == SUBMITTED:
                problem = _submission_problem(entry, kept, run)
            elif entry.kind == PURGED:
                for action_id in _purged_ids(entry):
                    run.awaiting_purge.pop(action_id, None)
        if problem is not None:
            return True, problem
        run.last = Head(entry.seq, entry.hash)
        run.entries += 1
        run.past_adoption = run.past_adoption or entry.kind != ADOPTED
    return len(batch) < run.chunk, None


def _anchor_problem(entry: Entry, run: _Run) -> str | None:
    if run.anchor is None or entry.seq != run.anchor.seq or entry.hash == run.anchor.hash:
        return None
    return (
        f"journal entry {entry.seq}: its hash is {entry.hash}, the anchor's is"
        f" {run.anchor.hash}: the journal up to the anchor was changed"
    )


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


def _ledger_rows(db: Db, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The ledger rows of these deposits, by transactionId."""
    if not ids:
        return {}
    rows = db.execute(
        f"SELECT {', '.join(LEDGER_FIELDS)} FROM ledger WHERE transaction_id IN ({_marks(ids)})",
        list(ids),
    ).fetchall()
    return {str(r[0]): dict(zip(LEDGER_FIELDS, tuple(r), strict=True)) for r in rows}


def _first_ledger_entries(db: Db, subjects: Sequence[str]) -> dict[str, int]:
    """The seq of the first `booked` or `adopted` entry of each deposit: the one its ledger row
    is compared with (any later one is a problem)."""
    if not subjects:
        return {}
    rows = db.execute(
        "SELECT subject, MIN(seq) FROM journal WHERE kind IN (?, ?)"
        f" AND subject IN ({_marks(subjects)}) GROUP BY subject",
        [*_LEDGER_KINDS, *subjects],
    ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def _ledger_problem(entry: Entry, row: Mapping[str, Any] | None) -> str | None:
    if row is None:
        return (
            f"journal entry {entry.seq} ({entry.kind} {entry.subject}): the deposit's ledger"
            " row is missing (deleted by hand?)"
        )
    differ = [name for name in LEDGER_FIELDS if not _same(entry.body.get(name), row[name])]
    if differ:
        return (
            f"ledger row {entry.subject}: {', '.join(differ)} differ{'s' * (len(differ) == 1)}"
            f" from journal entry {entry.seq} (edited by hand?)"
        )
    return None


def _same(recorded: Any, stored: Any) -> bool:
    """A column as the entry recorded it and as the row holds it: the same value, compared as
    text (a walletId the engine stores as a number is the same as its digits)."""
    if recorded is None or stored is None:
        return recorded is None and stored is None
    return recorded == stored or str(recorded) == str(stored)


def _action_id(entry: Entry) -> int | None:
    if entry.kind != SUBMITTED:
        return None
    try:
        return int(entry.body["action_id"])
    except (KeyError, TypeError, ValueError):
        return None


def _purged_ids(entry: Entry) -> list[int]:
    ids = entry.body.get("action_ids")
    if not isinstance(ids, list):
        return []
    return [i for i in ids if isinstance(i, int)]


_SUBMISSION_COLUMNS = (
    "action_id",
    "transaction_id",
    "profile",
    "fields",
    "body",
    "payload_sha256",
    "purged_at",
)


def _kept_submissions(db: Db, action_ids: Sequence[int]) -> dict[tuple[int, str], dict[str, Any]]:
    """The kept submissions of these action ids, by action id and payload hash (a submission
    retried with a corrected profile sent another payload under the same action)."""
    if not action_ids:
        return {}
    rows = db.execute(
        f"SELECT {', '.join(_SUBMISSION_COLUMNS)} FROM submissions"
        f" WHERE action_id IN ({_marks(action_ids)})",
        list(action_ids),
    ).fetchall()
    kept = [dict(zip(_SUBMISSION_COLUMNS, tuple(r), strict=True)) for r in rows]
    return {(int(r["action_id"]), str(r["payload_sha256"])): r for r in kept}


def _fields(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def _submission_problem(
    entry: Entry, kept: Mapping[tuple[int, str], Mapping[str, Any]], run: _Run
) -> str | None:
    action_id = _action_id(entry)
    where = f"journal entry {entry.seq} (submitted {entry.subject})"
    if action_id is None:
        return f"{where}: names no submission (no action_id)"
    row = kept.get((action_id, str(entry.body.get("payload_sha256"))))
    if row is None:  # none with that payload: compared with the action's other, to say what
        row = next((r for (a, _), r in sorted(kept.items()) if a == action_id), None)
    record = f"submission record of action {action_id} (deposit {entry.subject})"
    if row is None:
        return f"{where}: the {record} is missing (deleted by hand?)"
    differ = [
        name
        for name, same in (
            ("deposit", row["transaction_id"] == entry.subject),
            ("profile", row["profile"] == entry.body.get("profile")),
            ("field names", _fields(row["fields"]) == entry.body.get("fields")),
            ("payload_sha256", row["payload_sha256"] == entry.body.get("payload_sha256")),
        )
        if not same
    ]
    if differ:
        return f"{record}: {', '.join(differ)} differ from {where} (changed by hand?)"
    if row["body"] is None:
        if row["purged_at"] is None:
            return f"{record}: its payload is gone but it was never purged (changed by hand?)"
        run.awaiting_purge[action_id] = entry.subject
        return None
    if journal.sha256_hex(str(row["body"]).encode("utf-8")) != row["payload_sha256"]:
        return (
            f"{record}: its payload does not hash to the payload_sha256 of {where}"
            " (changed by hand?)"
        )
    return None


async def _purges(read: Reader, run: _Run) -> str | None:
    """The purged submissions no `purged` entry named on the way (an entry before its
    submission's, if ever): every `purged` entry read again; the first one still unnamed."""
    after = 0
    while run.awaiting_purge:
        rows = await read(partial(_purge_entries, after=after, limit=run.chunk))
        for seq, ids in rows:
            after = seq
            for action_id in ids:
                run.awaiting_purge.pop(action_id, None)
        if len(rows) < run.chunk:
            break
    if not run.awaiting_purge:
        return None
    action_id = min(run.awaiting_purge)
    return (
        f"submission record of action {action_id} (deposit {run.awaiting_purge[action_id]}):"
        " its payload is gone but no purge entry names it (changed by hand?)"
    )


def _purge_entries(db: Db, after: int, limit: int) -> list[tuple[int, list[int]]]:
    rows = db.execute(
        "SELECT seq, body FROM journal WHERE kind = ? AND seq > ? ORDER BY seq LIMIT ?",
        [PURGED, after, limit],
    ).fetchall()
    out = []
    for seq, body in rows:
        ids = _fields(body)
        ids = ids.get("action_ids") if isinstance(ids, dict) else None
        out.append((int(seq), [i for i in ids or () if isinstance(i, int)]))
    return out


# --- 2. every ledger row has its entry -----------------------------------------------------


async def _ledger(read: Reader, run: _Run) -> str | None:
    after = ""
    while True:
        ids, missing = await read(partial(_ledger_chunk, after=after, limit=run.chunk))
        run.ledger_rows += len(ids)
        if missing:
            return f"ledger row {missing} has no journal entry (inserted by hand?)"
        if len(ids) < run.chunk:
            return None
        after = ids[-1]


def _ledger_chunk(db: Db, after: str, limit: int) -> tuple[list[str], str | None]:
    """A chunk of ledger rows after `after` (transactionId order); (their ids, the first
    without a `booked` or `adopted` entry)."""
    ids = [
        str(r[0])
        for r in db.execute(
            "SELECT transaction_id FROM ledger WHERE transaction_id > ?"
            " ORDER BY transaction_id LIMIT ?",
            [after, limit],
        ).fetchall()
    ]
    if not ids:
        return ids, None
    found = {
        str(r[0])
        for r in db.execute(
            "SELECT DISTINCT subject FROM journal WHERE kind IN (?, ?)"
            f" AND subject IN ({_marks(ids)})",
            [*_LEDGER_KINDS, *ids],
        ).fetchall()
    }
    return ids, next((i for i in ids if i not in found), None)


# --- 3. every kept submission has its entry -------------------------------------------------


async def _submissions(read: Reader, run: _Run) -> str | None:
    after: tuple[int, str] = (0, "")
    while True:
        ids, missing = await read(partial(_submissions_chunk, after=after, limit=run.chunk))
        run.submissions += len(ids)
        if missing is not None:
            action_id, tx = missing
            return (
                f"submission record of action {action_id} (deposit {tx}) has no journal entry"
                " (inserted by hand?)"
            )
        if len(ids) < run.chunk:
            return None
        after = ids[-1]


def _submissions_chunk(
    db: Db, after: tuple[int, str], limit: int
) -> tuple[list[tuple[int, str]], tuple[int, str] | None]:
    """A chunk of kept submissions after (action id, payload hash) `after`; (their keys, the
    first without a `submitted` entry, as its action id and deposit)."""
    rows = [
        (int(r[0]), str(r[1]), str(r[2]))
        for r in db.execute(
            "SELECT action_id, payload_sha256, transaction_id FROM submissions"
            " WHERE action_id > ? OR (action_id = ? AND payload_sha256 > ?)"
            " ORDER BY action_id, payload_sha256 LIMIT ?",
            [after[0], after[0], after[1], limit],
        ).fetchall()
    ]
    if not rows:
        return [], None
    subjects = sorted({tx for _, _, tx in rows})
    named: set[tuple[int, str]] = set()
    for (body,) in db.execute(
        f"SELECT body FROM journal WHERE kind = ? AND subject IN ({_marks(subjects)})",
        [SUBMITTED, *subjects],
    ).fetchall():
        value = _fields(body)
        if isinstance(value, dict) and isinstance(value.get("action_id"), int):
            named.add((value["action_id"], str(value.get("payload_sha256"))))
    keys = [(a, h) for a, h, _ in rows]
    return keys, next(((a, tx) for a, h, tx in rows if (a, h) not in named), None)


# --- the head, and the last verification in `meta` -----------------------------------------


def record(db: Db, outcome: Verification) -> None:
    """Keep `outcome` as the last verification."""
    set_meta(db, LAST_VERIFICATION, json.dumps(outcome.as_json(), sort_keys=True))


def last_verification(db: Db) -> dict[str, Any] | None:
    """The last verification kept (`Verification.as_json`), if any."""
    raw = get_meta(db, LAST_VERIFICATION)
    if not raw:
        return None
    value: dict[str, Any] = json.loads(raw)
    return value


def claim_publication(db: Db, day: str) -> bool:
    """Claim the publication of the head for the UTC day `day` (YYYY-MM-DD): False when it was
    published for that day already (by this instance or another)."""
    cur = db.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE"
        " SET value = excluded.value WHERE meta.value <> excluded.value",
        [HEAD_PUBLISHED, day],
    )
    return int(cur.rowcount) == 1


def published_day(db: Db) -> str | None:
    """The last UTC day whose head was published."""
    return get_meta(db, HEAD_PUBLISHED)


def journal_status(db: Db) -> dict[str, Any]:
    """The head and the last verification, as `status` and the console show them."""
    last = journal.head(db)
    return {
        "head": None if last is None else str(last),
        "lastVerification": last_verification(db),
    }
