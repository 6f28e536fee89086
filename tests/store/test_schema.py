"""The schema each engine holds, as its migrations make it: a new database, and one of every
older version migrated, hold exactly the tables, columns, types, keys, indexes and triggers
listed in `schema.txt` (written from the schema as it was before each statement was written out
per engine, so that no install sees its tables change).

After adding a migration, write the listing again with `DEPOSITD_WRITE_SCHEMA=1` set, and read
its diff: it is the change every existing database goes through.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from tests.support.stores import StoreMaker
from worker.store.meta import set_meta
from worker.store.pg import PgDatabase
from worker.store.pg import connect as pg_connect
from worker.store.schema import MIGRATIONS, SCHEMA_VERSION
from worker.store.sqlite import connect as sqlite_connect
from worker.store.sqlitestore import transaction

LISTING = Path(__file__).with_name("schema.txt")


def _rows(db: Any, sql: str) -> list[list[str | None]]:
    rows = [[None if v is None else str(v) for v in r] for r in db.execute(sql).fetchall()]
    return sorted(rows, key=json.dumps)  # not by the server's collation


def postgres_listing(db: Any) -> dict[str, list[list[str | None]]]:
    """What PostgreSQL holds of the schema, names and definitions (no object ids)."""
    return {
        "columns": _rows(
            db,
            "SELECT table_name, column_name, ordinal_position, data_type, is_nullable,"
            " column_default, is_identity, identity_generation FROM information_schema.columns"
            " WHERE table_schema = current_schema()",
        ),
        "indexes": _rows(
            db,
            "SELECT tablename, indexname, indexdef FROM pg_indexes"
            " WHERE schemaname = current_schema()",
        ),
        "constraints": _rows(
            db,
            "SELECT t.relname, c.conname, c.contype, pg_get_constraintdef(c.oid)"
            " FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid"
            " WHERE t.relnamespace = current_schema()::regnamespace"
            " AND c.contype IN ('p', 'u', 'f', 'c')",
        ),
        "triggers": _rows(
            db,
            "SELECT event_object_table, trigger_name, event_manipulation, action_timing,"
            " action_orientation, action_statement FROM information_schema.triggers"
            " WHERE trigger_schema = current_schema()",
        ),
        "functions": _rows(
            db,
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p"
            " WHERE p.pronamespace = current_schema()::regnamespace",
        ),
        "options": _rows(
            db,
            "SELECT relname, relkind, array_to_string(reloptions, ',') FROM pg_class"
            " WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'i', 'S')",
        ),
    }


def sqlite_listing(db: Any) -> dict[str, list[list[str | None]]]:
    """What SQLite holds of the schema: every object with the statement that made it."""
    return {"objects": _rows(db, "SELECT type, name, tbl_name, sql FROM sqlite_master")}


def as_lines(engine: str, listing: dict[str, list[list[str | None]]]) -> list[str]:
    """One line per row, `[engine, part, values...]` as JSON."""
    return [json.dumps([engine, part, *row]) for part, rows in listing.items() for row in rows]


def recorded(engine: str) -> list[str]:
    """The listing's lines of one engine."""
    lines = LISTING.read_text().splitlines()
    return [line for line in lines if json.loads(line)[0] == engine]


def _open(make_store: StoreMaker) -> Any:
    if make_store.engine == "postgres":
        return PgDatabase(pg_connect(make_store.url()))
    return sqlite_utils.Database(sqlite_connect(make_store.storage()["path"]))


def _listing(make_store: StoreMaker) -> list[str]:
    db = _open(make_store)
    try:
        if make_store.engine == "postgres":
            return as_lines("postgres", postgres_listing(db))
        return as_lines("sqlite", sqlite_listing(db))
    finally:
        db.close()


def write(engine: str, lines: list[str]) -> None:
    """Record the listing's lines of one engine."""
    known = LISTING.read_text().splitlines() if LISTING.exists() else []
    kept = [line for line in known if json.loads(line)[0] != engine]
    LISTING.write_text("\n".join([*kept, *lines]) + "\n")


async def test_a_new_database_has_the_recorded_schema(make_store: StoreMaker) -> None:
    """Every table, column (type, nullability, default, identity), key, index and trigger of a
    new database is as recorded."""
    store = make_store()
    await store.open()
    await store.close()
    found = _listing(make_store)
    if os.environ.get("DEPOSITD_WRITE_SCHEMA"):
        write(make_store.engine, found)
    assert found == recorded(make_store.engine)


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
async def test_a_database_of_an_older_version_migrates_to_the_recorded_schema(
    make_store: StoreMaker, version: int
) -> None:
    """A database left at an older version by an earlier depositd is migrated to the schema
    of a new one, on either engine."""
    db = _open(make_store)
    try:
        with transaction(db):
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        for done in range(version):
            with transaction(db):
                MIGRATIONS[done](db)
                set_meta(db, "schema_version", str(done + 1))
    finally:
        db.close()
    store = make_store()
    await store.open()
    await store.close()
    assert _listing(make_store) == recorded(make_store.engine)
