"""Stores of either engine for the tests that run on both (the `make_store` fixture), and rows
read beside a running worker on a connection of their own."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.pgcluster import Cluster
from worker.store.pg import connect as pg_connect
from worker.store.pgstore import PgStore
from worker.store.sqlitestore import Store


class StoreMaker:
    """Stores of one engine for one test: `store(name)` twice is the same database."""

    def __init__(self, engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.engine = engine
        self._tmp_path = tmp_path
        self._request = request
        self._urls: dict[str, str] = {}

    def url(self, name: str = "depositd.db") -> str:
        """The PostgreSQL database standing for file `name` (created on first use)."""
        if name not in self._urls:
            cluster: Cluster = self._request.getfixturevalue("pg_cluster")
            self._urls[name] = cluster.create_database()
        return self._urls[name]

    def storage(self, name: str = "depositd.db") -> dict[str, str]:
        """The `storage` section of a configuration for this database."""
        if self.engine == "postgres":
            return {"url": self.url(name)}
        return {"path": str(self._tmp_path / name)}

    def __call__(self, name: str = "depositd.db", **kw: Any) -> Store:
        if self.engine == "postgres":
            return PgStore(self.url(name))
        return Store(self._tmp_path / name, **kw)

    def drop(self) -> None:
        if self._urls:
            cluster: Cluster = self._request.getfixturevalue("pg_cluster")
            for url in self._urls.values():
                with contextlib.suppress(Exception):
                    cluster.drop_database(url)


def stack_rows(stack: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of a query on a stack's database on its own connection (the worker may be
    stopped), as plain tuples."""
    storage = getattr(stack, "storage", None)
    if storage and "url" in storage:
        pg = pg_connect(storage["url"])
        try:
            return [tuple(r) for r in pg.execute(sql, params).fetchall()]
        finally:
            pg.close()
    path = storage["path"] if storage else stack.db_path
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [tuple(r) for r in db.execute(sql, params).fetchall()]


def rows(db: Path | str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of one query on a database file or PostgreSQL URL (a short-lived connection beside
    the service)."""
    if isinstance(db, str):
        pg = pg_connect(db)
        try:
            return [tuple(r) for r in pg.execute(sql, args).fetchall()]
        finally:
            pg.close()
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]
