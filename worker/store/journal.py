"""The journal (docs/audit.md): an append-only record of every decision that moves money or
personal data, each entry chained to the one before it by SHA-256.

An entry is (seq, at, kind, subject, body); its digest is the SHA-256 of its canonical encoding
(`canonical`), and its hash the SHA-256 of the previous entry's hash (64 zeros before the
first) followed by its digest, both as hex text. Changing, removing or inserting any entry
changes every hash after it: a head (seq and hash) kept outside the database proves the journal
up to it unchanged. A proof that one entry is in the chain up to a head needs the digests of
the entries between, never their bodies (`proof`, `check_proof`).

Appends run inside the caller's write transaction, so an entry commits with the rows it
describes or not at all. On PostgreSQL with several instances they take a transaction lock
first: the chain has one order. The decisions of the running service append theirs at the end
of their transaction (`append_at_commit`, `worker.store.atcommit`), so that lock is the last
one a transaction takes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from worker.clock import utc_now
from worker.store import atcommit
from worker.store.db import Db
from worker.store.pg import InsertRows, is_postgres
from worker.store.tx import conn_of, insert_rows

GENESIS = "0" * 64  # the hash before the first entry

# The kinds of entry (the body's keys for each are in docs/audit.md).
BOOKED = "booked"  # a ledger row written
HELD = "held"  # a credited deposit not booked, waiting on a txHash or a person
RELEASED = "released"  # a held deposit decided (`resolve`), booked or not
SUBMITTED = "submitted"  # payer details sent for a deposit (field names, payload hash)
OPERATOR = "operator"  # what an operator did (command or console), who and the note
RECONCILED = "reconciled"  # one day's reconciliation result
PURGED = "purged"  # payer values removed from stored submissions (retention)
EXPORTED = "exported"  # an evidence bundle with personal data written
ADOPTED = "adopted"  # a row that existed before the journal did (its first migration)
REVERSED = "reversed"  # a booking reversed by a person's correction (`worker.store.corrections`)
REBOOKED = "rebooked"  # the booking that replaces it, with the decided amount and asset


def canonical(value: Any) -> bytes:
    """The one encoding that is hashed: JSON, keys sorted, no spaces, UTF-8. Money is text
    already (Decimal strings), so no number is rounded on the way."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    """SHA-256 as lower-case hex."""
    return hashlib.sha256(data).hexdigest()


def digest_of(seq: int, at: str, kind: str, subject: str, body: Mapping[str, Any]) -> str:
    """An entry's digest: what its hash chains."""
    fields = {"seq": seq, "at": at, "kind": kind, "subject": subject, "body": body}
    return sha256_hex(canonical(fields))


def chain(prev_hash: str, digest: str) -> str:
    """The hash of an entry whose digest is `digest`, after the entry whose hash is
    `prev_hash`."""
    return sha256_hex((prev_hash + digest).encode("ascii"))


@dataclass(frozen=True)
class Entry:
    """One journal entry as stored."""

    seq: int
    at: str
    kind: str
    subject: str
    body: dict[str, Any]
    digest: str
    prev_hash: str
    hash: str

    def as_json(self) -> dict[str, Any]:
        """The entry as one JSON object (evidence bundles, `depositd verify` output)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        """The entry `as_json` wrote."""
        return cls(
            seq=int(data["seq"]),
            at=str(data["at"]),
            kind=str(data["kind"]),
            subject=str(data["subject"]),
            body=dict(data["body"]),
            digest=str(data["digest"]),
            prev_hash=str(data["prev_hash"]),
            hash=str(data["hash"]),
        )

    def problem(self) -> str | None:
        """What is wrong with the entry on its own (its digest or its hash), if anything."""
        if digest_of(self.seq, self.at, self.kind, self.subject, self.body) != self.digest:
            return f"journal entry {self.seq}: its content does not match its digest"
        if chain(self.prev_hash, self.digest) != self.hash:
            return f"journal entry {self.seq}: its hash does not chain its digest"
        return None


@dataclass(frozen=True)
class Head:
    """The last entry's place in the chain: what is published and kept elsewhere."""

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"

    def spaced(self) -> str:
        """`SEQ HASH`, as `depositd verify --head` prints it."""
        return f"{self.seq} {self.hash}"

    @classmethod
    def parse(cls, text: str) -> Head:
        """`SEQ:HASH` as `str` writes it, or `SEQ HASH` as `spaced` does; ValueError naming
        what is wrong."""
        seq, sep, hash_ = text.strip().replace(" ", ":", 1).partition(":")
        hash_ = hash_.strip()
        if not sep or not seq.isdigit() or len(hash_) != 64:
            raise ValueError(f"an anchor is SEQ:HASH (a number, a colon, 64 hex digits): {text!r}")
        try:
            int(hash_, 16)
        except ValueError:
            raise ValueError(f"an anchor's hash is 64 hex digits: {hash_!r}") from None
        return cls(int(seq), hash_.lower())


_COLUMNS = "seq, at, kind, subject, body, digest, prev_hash, hash"
_INSERT = InsertRows(f"INSERT INTO journal ({_COLUMNS}) VALUES ", "(?, ?, ?, ?, ?, ?, ?, ?)")
_HEAD = "SELECT seq, hash FROM journal ORDER BY seq DESC LIMIT 1"


def _lock(db: Db) -> None:
    # PostgreSQL: instances append one transaction at a time, to the end of it (the head read
    # next is then the last committed one). SQLite's write lock orders every write already.
    if is_postgres(db):
        conn_of(db).execute("SELECT pg_advisory_xact_lock(hashtext('depositd:journal'))").fetchall()


def append(db: Db, kind: str, subject: str, body: Mapping[str, Any]) -> Entry:
    """Append one entry inside the caller's write transaction; the entry."""
    return append_many(db, [(kind, subject, body)])[0]


def append_many(db: Db, items: Iterable[tuple[str, str, Mapping[str, Any]]]) -> list[Entry]:
    """Append entries in order inside the caller's write transaction (one head read)."""
    # The body as it reads back: exactly what is hashed.
    return [
        Entry(seq, at, kind, subject, json.loads(body), digest, prev, hash_)
        for seq, at, kind, subject, body, digest, prev, hash_ in _append(db, items)
    ]


def _append(db: Db, items: Iterable[tuple[str, str, Mapping[str, Any]]]) -> list[tuple[Any, ...]]:
    """`append_many`; the rows inserted (the body as its canonical text)."""
    items = list(items)
    if not items:
        return []
    _lock(db)
    last = head(db)
    seq, prev = (0, GENESIS) if last is None else (last.seq, last.hash)
    at = utc_now()
    at_text = canonical(at)
    rows: list[tuple[Any, ...]] = []
    for kind, subject, body in items:
        seq += 1
        text = canonical(body)  # encoded once, for the digest and the row
        digest = _digest_of_text(seq, at_text, kind, subject, text)
        hash_ = chain(prev, digest)
        rows.append((seq, at, kind, subject, text.decode(), digest, prev, hash_))
        prev = hash_
    insert_rows(db, _INSERT, rows)
    return rows


def _digest_of_text(seq: int, at_text: bytes, kind: str, subject: str, body_text: bytes) -> str:
    """`digest_of` from the canonical text of the time and of the body (encoded once for
    both the digest and the row): the same bytes `canonical` gives the entry's five fields,
    keys in their sorted order."""
    return sha256_hex(
        b'{"at":'
        + at_text
        + b',"body":'
        + body_text
        + b',"kind":'
        + canonical(kind)
        + b',"seq":'
        + str(seq).encode("ascii")
        + b',"subject":'
        + canonical(subject)
        + b"}"
    )


def append_at_commit(db: Db, kind: str, subject: str, body: Mapping[str, Any]) -> None:
    """Append one entry at the end of the caller's write transaction, just before its COMMIT,
    when the transaction queues its entries (a store round, a command's `transaction`:
    `worker.store.atcommit`); else at once. The body is copied (its top level): the caller
    gives values it does not change afterwards."""
    item = (kind, subject, dict(body))
    if not atcommit.add(conn_of(db), item):
        _append(db, [item])


def append_queued(db: Db) -> int:
    """Append what the transaction queued (`append_at_commit`), in order; its queue is closed.
    The last thing a write transaction does before its COMMIT. How many were appended."""
    return len(_append(db, atcommit.take(conn_of(db))))


def head(db: Db) -> Head | None:
    """The last entry's seq and hash; None while the journal is empty."""
    row = conn_of(db).execute(_HEAD).fetchone()
    return None if row is None else Head(int(row[0]), str(row[1]))


def _entry(row: Any) -> Entry:
    seq, at, kind, subject, body, digest, prev_hash, hash_ = tuple(row)
    return Entry(
        int(seq),
        str(at),
        str(kind),
        str(subject),
        json.loads(body),
        str(digest),
        str(prev_hash),
        str(hash_),
    )


def entries(
    db: Db, *, after: int = 0, upto: int | None = None, chunk: int = 1000
) -> Iterator[Entry]:
    """Every entry with after < seq (<= upto), in order, read a chunk at a time."""
    while True:
        params: list[Any] = [after]
        where = "seq > ?"
        if upto is not None:
            where += " AND seq <= ?"
            params.append(upto)
        rows = db.execute(
            f"SELECT {_COLUMNS} FROM journal WHERE {where} ORDER BY seq LIMIT ?", [*params, chunk]
        ).fetchall()
        for row in rows:
            yield _entry(row)
        if len(rows) < chunk:
            return
        after = int(rows[-1][0])


def entries_about(db: Db, subject: str) -> list[Entry]:
    """The entries about one subject (a transactionId, `day:YYYY-MM-DD`, ...), in order."""
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM journal WHERE subject = ? ORDER BY seq", [subject]
    ).fetchall()
    return [_entry(r) for r in rows]


def entry_at(db: Db, seq: int) -> Entry | None:
    """The entry with this seq, if any."""
    row = db.execute(f"SELECT {_COLUMNS} FROM journal WHERE seq = ?", [seq]).fetchone()
    return None if row is None else _entry(row)


def chain_problem(items: Iterable[Entry], *, start: Head | None = None) -> str | None:
    """The first thing wrong in a run of consecutive entries (their digests, their hashes, a
    gap or a break between two), starting after `start` (the genesis when None); None when the
    run holds."""
    seq, prev = (0, GENESIS) if start is None else (start.seq, start.hash)
    for entry in items:
        if entry.seq != seq + 1:
            return f"journal entry {seq + 1} is missing (the next one is {entry.seq})"
        if entry.prev_hash != prev:
            return f"journal entry {entry.seq}: it does not follow entry {seq} (hash chain broken)"
        problem = entry.problem()
        if problem is not None:
            return problem
        seq, prev = entry.seq, entry.hash
    return None


def proof(db: Db, first: int, upto: Head) -> dict[str, Any]:
    """What proves the entries from `first` on are in the chain up to `upto`: the hash before
    `first` and the digest of every entry from `first` to the head, in order."""
    before = entry_at(db, first - 1) if first > 1 else None
    rows = db.execute(
        "SELECT seq, digest FROM journal WHERE seq >= ? AND seq <= ? ORDER BY seq",
        [first, upto.seq],
    ).fetchall()
    return {
        "from": first,
        "prev_hash": GENESIS if before is None else before.hash,
        "digests": [str(r[1]) for r in rows],
        "head": str(upto),
    }


def check_proof(proof_: Mapping[str, Any], entries_: Iterable[Entry]) -> str | None:
    """What is wrong with a proof (`proof`) and the entries it is to cover, if anything: each
    entry's own digest and hash, its digest at its place in the proof, and the chain of the
    digests ending at the proof's head."""
    entries_ = list(entries_)
    try:
        first, prev = int(proof_["from"]), str(proof_["prev_hash"])
        digests = [str(d) for d in proof_["digests"]]
        end = Head.parse(str(proof_["head"]))
    except (KeyError, TypeError, ValueError) as exc:
        return f"the proof is not readable: {exc}"
    if first + len(digests) - 1 != end.seq:
        return f"the proof covers entries {first} to {first + len(digests) - 1}, not to {end.seq}"
    for entry in entries_:
        problem = entry.problem()
        if problem is not None:
            return problem
        at = entry.seq - first
        if not 0 <= at < len(digests) or digests[at] != entry.digest:
            return f"journal entry {entry.seq} is not in the proof's chain"
    hashes: dict[int, str] = {}
    for offset, digest in enumerate(digests):
        prev = chain(prev, digest)
        hashes[first + offset] = prev
    if prev != end.hash:
        return f"the proof's chain does not end at the head {end}"
    for entry in entries_:
        if hashes.get(entry.seq) != entry.hash:
            return f"journal entry {entry.seq}: its hash is not the chain's"
    return None


# A ledger row's columns, as a BOOKED or ADOPTED entry's body holds them (`depositd verify`
# compares the row with them).
LEDGER_FIELDS = (
    "transaction_id",
    "wallet_id",
    "wallet_name",
    "currency",
    "network",
    "amount",
    "from_address",
    "tx_hash",
    "booked_at",
    "trigger",
)


def ledger_body(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ledger row's columns as an entry's body holds them."""
    return {name: row[name] for name in LEDGER_FIELDS}


def adopt_ledger(db: Db) -> int:
    """One ADOPTED entry per ledger row that has no entry yet (a database older than its
    journal): from here on, an edit of those rows is found as well. How many were adopted."""
    rows = (
        conn_of(db)
        .execute(
            f"SELECT {', '.join(LEDGER_FIELDS)} FROM ledger l WHERE NOT EXISTS"
            " (SELECT 1 FROM journal j WHERE j.subject = l.transaction_id"
            " AND j.kind IN ('booked', 'adopted')) ORDER BY booked_at, transaction_id"
        )
        .fetchall()
    )
    items = [
        (ADOPTED, str(row[0]), dict(zip(LEDGER_FIELDS, tuple(row), strict=True))) for row in rows
    ]
    append_many(db, items)
    return len(items)
