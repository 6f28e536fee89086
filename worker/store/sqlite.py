"""A SQLite connection with depositd's pragmas: the store's own and every command's.

Apart from `worker.store.sqlitestore` so that a command that only reads (`depositd status`)
opens the database without loading the writer and sqlite-utils.

Its errors are the store's (`worker.store.errors`), raised by the connection and its cursors
(`Connection`, passed to `sqlite3.connect` as its factory): callers catch one family on both
engines. A statement that succeeds costs one Python call more than on a plain connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from worker.store.errors import StoreUnavailable, from_sqlite

# The C methods themselves, called without another lookup on each statement.
_cursor = sqlite3.Connection.cursor
_execute = sqlite3.Cursor.execute
_executemany = sqlite3.Cursor.executemany
_fetchone = sqlite3.Cursor.fetchone
_fetchmany = sqlite3.Cursor.fetchmany
_fetchall = sqlite3.Cursor.fetchall
_next = sqlite3.Cursor.__next__


class Cursor(sqlite3.Cursor):
    """A `sqlite3.Cursor` raising the store's errors."""

    __slots__ = ()

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        """Run one statement."""
        try:
            _execute(self, sql, parameters)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc
        return self

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor:
        """Run one statement once per parameter set."""
        try:
            _executemany(self, sql, parameters)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc
        return self

    def executescript(self, sql_script: str, /) -> Cursor:
        """Run several statements."""
        try:
            super().executescript(sql_script)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc
        return self

    def fetchone(self) -> Any:
        """The next row, or None."""
        try:
            return _fetchone(self)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc

    def fetchmany(self, size: int | None = 1) -> list[Any]:
        """Up to `size` of the remaining rows."""
        try:
            return _fetchmany(self, size)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc

    def fetchall(self) -> list[Any]:
        """The remaining rows."""
        try:
            return _fetchall(self)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # not the cursor itself
        # The rows at once, as PostgreSQL's cursor hands them: one call instead of one per row.
        return iter(self.fetchall())

    def __next__(self) -> Any:
        try:
            return _next(self)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc


class Connection(sqlite3.Connection):
    """A `sqlite3.Connection` raising the store's errors, its cursors too."""

    def cursor(self, factory: Any = Cursor) -> Any:
        """A new cursor (a `Cursor` unless another factory is given)."""
        try:
            return _cursor(self, factory)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        """Run one statement on a new cursor."""
        try:
            cursor: Cursor = _cursor(self, Cursor)
            _execute(cursor, sql, parameters)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc
        return cursor

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor:
        """Run one statement once per parameter set, on a new cursor."""
        try:
            cursor: Cursor = _cursor(self, Cursor)
            _executemany(cursor, sql, parameters)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc
        return cursor

    def executescript(self, sql_script: str, /) -> Cursor:
        """Run several statements on a new cursor."""
        return self.cursor().executescript(sql_script)  # type: ignore[no-any-return]

    def commit(self) -> None:
        """Commit the open transaction, if any."""
        try:
            super().commit()
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc

    def rollback(self) -> None:
        """Roll the open transaction back, if any."""
        try:
            super().rollback()
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc

    def backup(self, target: sqlite3.Connection, **kwargs: Any) -> None:
        """Copy this database into `target` (`sqlite3.Connection.backup`)."""
        try:
            super().backup(target, **kwargs)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> Literal[False]:
        """`with conn:` commits at the end, or rolls back on an error."""
        try:
            return super().__exit__(kind, value, traceback)
        except sqlite3.Error as exc:
            raise from_sqlite(exc) from exc


def open_file(target: str, *, uri: bool = False, timeout: float = 5.0, **kwargs: Any) -> Connection:
    """`sqlite3.connect` with the store's errors (`Connection`); `StoreUnavailable` when the
    file cannot be opened."""
    try:
        conn: Connection = sqlite3.connect(
            target, uri=uri, timeout=timeout, factory=Connection, **kwargs
        )
    except sqlite3.Error as exc:  # as on PostgreSQL: a database not opened is unavailable
        raise StoreUnavailable(str(exc), code=getattr(exc, "sqlite_errorname", None)) from exc
    return conn


def connect(
    path: Path, *, synchronous: str = "FULL", readonly: bool = False, immutable: bool = False
) -> Connection:
    """A connection with depositd's pragmas (WAL, synchronous, busy timeout, Row factory,
    removed content zeroed); `immutable`: read-only, the file read as it is (no WAL reader,
    nothing created beside it)."""
    if readonly or immutable:
        query = "mode=ro&immutable=1" if immutable else "mode=ro"
        conn = open_file(f"{path.resolve().as_uri()}?{query}", uri=True)
    else:
        conn = open_file(str(path), check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 5000")
    if not (readonly or immutable):
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA temp_store = MEMORY")
        # What a write removes or moves is overwritten with zeros (Debian's build does so by
        # default; others may not): personal data removed by retention leaves no copy behind
        # in the file (docs/audit.md, "Retention of personal data").
        conn.execute("PRAGMA secure_delete = ON")
    return conn
