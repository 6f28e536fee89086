"""The abnormal_funds table: one row per abnormal fund by the provider's id, with when its
triggers fired (`abnormal_fund` once, `abnormal_expiring` once). No payer data is stored."""

from __future__ import annotations

from typing import Any

from worker.store.db import Db

COLUMNS = (
    "id",
    "amount",
    "currency",
    "network",
    "tx_hash",
    "tx_time",
    "expires_time",
    "status",
    "order_id",
    "address_risk_status",
)


def get_abnormal(db: Db, fund_id: str) -> dict[str, Any] | None:
    """One stored abnormal fund, or None."""
    row = db.execute("SELECT * FROM abnormal_funds WHERE id=?", [fund_id]).fetchone()
    return None if row is None else dict(row)


def upsert_abnormal(db: Db, row: dict[str, Any], now: str) -> bool:
    """Store or update one record; True when it was new."""
    values = [row.get(c) for c in COLUMNS]
    cur = db.execute(
        f"INSERT INTO abnormal_funds ({', '.join(COLUMNS)}, first_seen, updated_at)"
        f" VALUES ({','.join('?' for _ in COLUMNS)}, ?, ?) ON CONFLICT DO NOTHING",
        [*values, now, now],
    )
    if cur.rowcount == 1:
        return True
    sets = ", ".join(f"{c}=?" for c in COLUMNS[1:])
    db.execute(
        f"UPDATE abnormal_funds SET {sets}, updated_at=? WHERE id=?", [*values[1:], now, row["id"]]
    )
    return False


def mark_alerted(db: Db, fund_id: str, column: str, now: str) -> bool:
    """Set `alerted_at` or `expiring_alerted_at` once; False when it was set already."""
    if column not in ("alerted_at", "expiring_alerted_at"):
        raise ValueError(column)
    cur = db.execute(
        f"UPDATE abnormal_funds SET {column}=? WHERE id=? AND {column} IS NULL", [now, fund_id]
    )
    return cur.rowcount == 1


def list_abnormal(db: Db, *, limit: int = 10000) -> list[dict[str, Any]]:
    """Stored abnormal funds, newest first."""
    rows = db.execute(
        "SELECT * FROM abnormal_funds ORDER BY tx_time DESC, id DESC LIMIT ?", [limit]
    )
    return [dict(r) for r in rows]


def counts_by_status(db: Db) -> dict[str, int]:
    """Stored abnormal funds per status."""
    rows = db.execute("SELECT status, COUNT(*) FROM abnormal_funds GROUP BY status")
    return {str(r[0]): int(r[1]) for r in rows}


def search_abnormal(db: Db, tx_hash: str, *, limit: int) -> list[dict[str, Any]]:
    """Abnormal funds whose txHash is `tx_hash`, whatever its case: the first `limit` seen."""
    rows = db.execute(
        "SELECT * FROM abnormal_funds WHERE lower(tx_hash) = lower(?) ORDER BY first_seen, id"
        " LIMIT ?",
        [tx_hash, limit],
    )
    return [dict(r) for r in rows]
