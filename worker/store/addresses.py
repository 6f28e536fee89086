"""The `addresses` table: the known deposit addresses (registered here or announced by webhook)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.store.db import Db


def address_status(db: Db, address_id: str) -> str | None:
    """The stored status of an address record, or None when there is no row."""
    row = db.execute("SELECT status FROM addresses WHERE id = ?", [address_id]).fetchone()
    return None if row is None else str(row[0])


def insert_announced(
    db: Db,
    address_id: str,
    *,
    wallet_address: str | None,
    network: str | None,
    status: str,
    fail_message: str | None,
    now: str,
) -> None:
    """A new row for an address a webhook announced."""
    db.execute(
        "INSERT INTO addresses (id, wallet_address, network, status, fail_message,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [address_id, wallet_address, network, status, fail_message, now, now],
    )


def update_announced(
    db: Db,
    address_id: str,
    *,
    wallet_address: str | None,
    network: str | None,
    status: str,
    fail_message: str | None,
    now: str,
) -> None:
    """Update a row from a webhook's announcement."""
    db.execute(
        "UPDATE addresses SET wallet_address = ?, network = ?, status = ?, fail_message = ?,"
        " updated_at = ? WHERE id = ?",
        [wallet_address, network, status, fail_message, now, address_id],
    )


def insert_registered(
    db: Db,
    address_id: str,
    *,
    wallet_id: int | None,
    wallet_address: str | None,
    network: str | None,
    memo: str | None,
    status: str,
    fail_message: str | None,
    profile: str | None,
    now: str,
) -> None:
    """A new row for an address read from the provider."""
    db.execute(
        "INSERT INTO addresses (id, wallet_id, wallet_address, network, memo, status,"
        " fail_message, profile, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
        [
            address_id,
            wallet_id,
            wallet_address,
            network,
            memo,
            status,
            fail_message,
            profile,
            now,
            now,
        ],
    )


def keep_profile(db: Db, address_id: str, profile: str | None) -> None:
    """Record the profile an address was registered with (when given), nothing else."""
    db.execute(
        "UPDATE addresses SET profile=COALESCE(?, profile) WHERE id=?", [profile, address_id]
    )


def update_registered(
    db: Db,
    address_id: str,
    *,
    status: str,
    fail_message: str | None,
    profile: str | None,
    now: str,
) -> None:
    """Update a row from the provider's answer (the profile only when given)."""
    db.execute(
        "UPDATE addresses SET status=?, fail_message=?, updated_at=?,"
        " profile=COALESCE(?, profile) WHERE id=?",
        [status, fail_message, now, profile, address_id],
    )


def networks_among(db: Db, networks: Sequence[str]) -> set[str]:
    """Which of `networks` some address record is on."""
    if not networks:
        return set()
    marks = ",".join("?" for _ in networks)
    rows = db.execute(
        f"SELECT DISTINCT network FROM addresses WHERE network IN ({marks})", list(networks)
    ).fetchall()
    return {str(r[0]) for r in rows}


def list_addresses(conn: Db) -> list[Any]:
    """Every address row, oldest first."""
    return conn.execute("SELECT * FROM addresses ORDER BY created_at").fetchall()


def snapshot(db: Db) -> tuple[Any, ...]:
    """Figures that change whenever an address does."""
    return tuple(db.execute("SELECT COUNT(*), MAX(updated_at) FROM addresses").fetchone())


def search_addresses(db: Db, text: str) -> list[Any]:
    """Registered source addresses that are `text`, whatever its case."""
    return db.execute(
        "SELECT * FROM addresses WHERE lower(wallet_address) = lower(?) ORDER BY created_at",
        [text],
    ).fetchall()
