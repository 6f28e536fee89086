"""The submissions table: the payer details each accepted or refused submission sent, as sent
(docs/audit.md). The values are personal data: kept for evidence until retention removes them
(`worker.store.retention`); the journal keeps their hash, so what was sent stays provable
without them.

Each function runs inside the caller's transaction (`Store.write` jobs) or on a reader.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from worker.store.db import Db
from worker.store.journal import canonical, sha256_hex


def payload_sha256(body: Mapping[str, Any]) -> str:
    """The hash the journal keeps of a payload sent (its canonical encoding)."""
    return sha256_hex(canonical(body))


def field_names(body: Mapping[str, Any]) -> list[str]:
    """The names of the fields a payload sent, nested ones as `outer.inner`, sorted."""
    names: list[str] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        else:
            names.append(prefix[:-1])

    walk("", body)
    return sorted(names)


def record_sent(
    db: Db,
    *,
    action_id: int,
    transaction_id: str,
    profile: str,
    body: Mapping[str, Any],
    sent_at: str,
    outcome: str,
) -> str:
    """Keep what one submission sent (its action row's id; once); the payload's hash."""
    digest = payload_sha256(body)
    db.execute(
        "INSERT INTO submissions (action_id, transaction_id, profile, fields, body,"
        " payload_sha256, sent_at, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (action_id, payload_sha256) DO NOTHING",
        [
            action_id,
            transaction_id,
            profile,
            json.dumps(field_names(body)),
            canonical(body).decode(),
            digest,
            sent_at,
            outcome,
        ],
    )
    return digest


def of_deposit(db: Db, transaction_id: str) -> list[dict[str, Any]]:
    """A deposit's submissions in the order they were sent (body None once purged)."""
    rows = db.execute(
        "SELECT * FROM submissions WHERE transaction_id = ? ORDER BY sent_at, action_id",
        [transaction_id],
    )
    return [dict(r) for r in rows]


def every(db: Db) -> list[dict[str, Any]]:
    """Every submission kept, by action id."""
    return [dict(r) for r in db.execute("SELECT * FROM submissions ORDER BY action_id")]
