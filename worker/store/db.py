"""What the table helpers run on, on either engine: the parts both engines' objects answer.

SQLite's are `worker.store.sqlite.Connection` and sqlite-utils' `Database` around it (the store's),
PostgreSQL's `worker.store.pg.PgConnection` and `PgDatabase` around it. Each is typed here by
what it is, not by one engine's class:

- `Db`: anything a statement runs on, the store's database or a command's connection.
- `Connection`: a connection; a command's, or the one a store's database holds.
- `Database`: the store's database, as `Store.read` and `Store.write` hand it to a function.

Their statements raise the store's errors (`worker.store.errors`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Protocol, Self


class Cursor(Protocol):
    """A statement's result: its rows, the rows it changed."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor:
        """Run one statement (its result replaces the last one's)."""

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed."""

    @property
    def description(self) -> Any:
        """The columns of the result (None for a statement without rows)."""

    def fetchone(self) -> Any:
        """The next row, or None."""

    def fetchall(self) -> list[Any]:
        """The remaining rows."""

    def fetchmany(self, size: int, /) -> list[Any]:
        """Up to `size` of the remaining rows."""

    def __iter__(self) -> Iterator[Any]:
        """The remaining rows, one at a time."""


class Db(Protocol):
    """Anything a statement runs on."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor:
        """Run one statement."""


class Connection(Db, Protocol):
    """A connection: statements, transactions (`with conn:` is one), and closing it."""

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open."""

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Cursor:
        """Run one statement once per parameter set."""

    def cursor(self) -> Cursor:
        """A new cursor."""

    def close(self) -> None:
        """Close the connection."""

    def __enter__(self) -> Self:
        """Begin a transaction (if none is open)."""

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> bool | None:
        """Commit it, or roll it back on an error."""


class Database(Db, Protocol):
    """The store's database: statements, rows as dicts, transactions, and its connection."""

    @property
    def conn(self) -> Connection:
        """The connection (statements on it skip the wrapper's own work)."""

    def query(self, sql: str, parameters: Sequence[Any] = ..., /) -> Iterator[dict[str, Any]]:
        """The rows of a SELECT as dicts (a write returning rows goes through `execute`: on
        SQLite, sqlite-utils' `query` would wait for `sqlite3`'s own error to finish it)."""

    def atomic(self) -> AbstractContextManager[object]:
        """One transaction for the block (a savepoint inside an open one)."""

    def close(self) -> None:
        """Close the connection."""
