"""PostgreSQL behind the same table modules as SQLite: a connection adapter.

The table modules run on the store's threads with the sync API of psycopg 3 here. `PgDatabase`
looks like the part of `sqlite_utils.Database` they use (`execute`, `query`, `conn`, `atomic`),
`PgConnection` like `sqlite3.Connection` (`execute`, `executemany`, `cursor`, `in_transaction`),
rows answer by index and by name like `sqlite3.Row`, and a psycopg error is raised as the
store's own (`worker.store.errors`), as SQLite's are, so that every caller keeps one error path
for both engines.

Each statement is written as its engine runs it: once where both engines take the same text
(`ON CONFLICT ... DO NOTHING`, `RETURNING`), else side by side in the module that runs it,
`{"sqlite": ..., "postgres": ...}` picked by `dialect(db)` (SQLite's `x IS ?` is PostgreSQL's
`x IS NOT DISTINCT FROM ?`, which SQLite has only from 3.39). The one rewrite here is of the
placeholders (`placeholders`: the n-th `?` -> `$n`). An INSERT a module runs for many rows is
written as its parts (`InsertRows`): on PostgreSQL the rows run as statements of many rows each.
A generated key is read from the `RETURNING` row (there is no `lastrowid`). Parameters go to the
server untyped (like literals), so that an int compared with a TEXT column or a bool stored in
an INTEGER one behaves as on SQLite.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from decimal import Decimal
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, Literal

from worker.store.errors import StoreError, StoreUnavailable, from_psycopg
from worker.urls import mask_url

if TYPE_CHECKING:
    import psycopg

# psycopg is imported by the functions that need it, not here: the table modules import this
# one for `is_postgres`, and a command on SQLite (`depositd status`) should not load psycopg.

CONNECT_TIMEOUT_S = 5


@cache
def _untyped_dumper() -> type[Any]:
    from psycopg.adapt import Dumper

    class UntypedDumper(Dumper):
        """A number or bool sent like a literal: the server gives it the type its context
        wants."""

        oid = 0

        def dump(self, obj: Any) -> bytes:
            if isinstance(obj, bool):
                return b"1" if obj else b"0"
            return str(obj).encode()

    return UntypedDumper


class Row(tuple[Any, ...]):
    """A result row by index or by column name, like `sqlite3.Row`."""

    _names: tuple[str, ...]
    _index: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        """The column names, in order."""
        return list(self._names)


def _row_factory(cursor: Any) -> Any:
    description = cursor.description
    if description is None:
        return tuple
    names = tuple(c.name for c in description)
    index = {name: i for i, name in enumerate(names)}

    def make(values: Sequence[Any]) -> Row:
        row = Row(values)
        row._names = names
        row._index = index
        return row

    return make


# --- placeholders ---------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def placeholders(sql: str) -> str:
    """The statement with PostgreSQL's numbered placeholders: the n-th `?` outside quotes
    becomes `$n`. Every statement is otherwise written as its engine runs it (`dialect`), and
    sent as it is (psycopg's raw cursors, which parse no placeholders of their own)."""
    out: list[str] = []
    quote: str | None = None
    count = 0
    for char in sql:
        if quote is not None:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "?":
            count += 1
            out.append(f"${count}")
            continue
        out.append(char)
    return "".join(out)


# --- many rows in one statement -----------------------------------------------------------

# Rows per statement of `InsertRows` on PostgreSQL: powers of two (each size one statement
# text, prepared once it repeats), at most this many, never more than the protocol's 65,535
# parameters.
_MOST_ROWS = 256
_MOST_PARAMS = 65535


class InsertRows:
    """An INSERT written as its parts: `head` (up to VALUES), one row of values `row` (with `?`
    placeholders) and `tail` (an ON CONFLICT clause, a RETURNING one). `sql` is the statement of
    one row, which both engines run; on PostgreSQL the rows of many run as statements of many
    rows each (`PgConnection.insert_rows`), which write what one statement per row, in order,
    writes: the rows are independent values, a row whose key an earlier row of the same
    statement took is passed over by DO NOTHING (as it would be a statement later), and DO
    UPDATE, which would refuse to update a row twice in one statement, names its conflict key
    (`key`, the positions of its values in a row): rows in which a key comes twice are sent one
    statement per row."""

    __slots__ = ("_pieces", "_sql", "head", "key", "most", "row", "sql", "tail", "width")

    def __init__(
        self, head: str, row: str, tail: str = "", *, key: tuple[int, ...] | None = None
    ) -> None:
        self.head, self.row, self.tail, self.key = head, row, tail, key
        self.sql = head + row + tail
        self._pieces = row.split("?")  # the row's text around its placeholders
        self.width = len(self._pieces) - 1
        self.most = _MOST_ROWS
        while self.most > 1 and self.most * self.width > _MOST_PARAMS:
            self.most //= 2
        self._sql: dict[int, bytes] = {}

    def statement(self, rows: int) -> bytes:
        """The PostgreSQL statement of `rows` rows (a power of two), its placeholders numbered."""
        text = self._sql.get(rows)
        if text is None:
            parts = [self.head]
            n = 0
            for i in range(rows):
                parts.append(", " + self._pieces[0] if i else self._pieces[0])
                for piece in self._pieces[1:]:
                    n += 1
                    parts.append(f"${n}{piece}")
            parts.append(self.tail)
            text = self._sql[rows] = "".join(parts).encode()
        return text

    def parts(self, count: int) -> list[int]:
        """The rows of each statement for `count` rows, largest first."""
        sizes = []
        while count:
            size = min(self.most, 1 << (count.bit_length() - 1))
            sizes.append(size)
            count -= size
        return sizes

    def distinct(self, rows: Sequence[Sequence[Any]]) -> bool:
        """Whether the rows can share statements (DO UPDATE: no key twice)."""
        key = self.key
        if key is None:
            return True
        return len({tuple(row[i] for i in key) for row in rows}) == len(rows)


# --- errors ---------------------------------------------------------------------------------


@contextmanager
def store_errors() -> Iterator[None]:
    """A psycopg error in the block is raised as the store's (`worker.store.errors`)."""
    import psycopg

    try:
        yield
    except psycopg.Error as exc:
        raise from_psycopg(exc) from exc


# --- connection and cursor ------------------------------------------------------------------


class Cursor:
    """A psycopg cursor answering like a `sqlite3.Cursor`.

    In pipeline mode (`PgConnection.pipeline`) a statement is sent without waiting for its
    result: `rowcount` and the rows are fetched when first asked for, so the statements nobody
    reads the result of share one round trip with the next that is read.
    """

    def __init__(self, cursor: psycopg.Cursor[Any], conn: PgConnection) -> None:
        self._cursor = cursor
        self._conn = conn
        self._rowcount = -1
        self._pending = False

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Cursor:
        """Run one statement (PostgreSQL's SQL with `?` placeholders)."""
        conn = self._conn
        with conn.errors():
            conn.send_held()
            self._cursor.execute(placeholders(sql), tuple(params or ()))
            self._pending = True
            if conn.pipelining is None:
                self._settle()
            else:
                conn.sent()
        return self

    def executemany(self, sql: str, seq: Iterable[Sequence[Any]]) -> Cursor:
        """Run one statement once per parameter set."""
        conn = self._conn
        with conn.errors():
            conn.send_held()
            self._cursor.executemany(placeholders(sql), [tuple(p) for p in seq])
            self._pending = True
            if conn.pipelining is None:
                self._settle()
            else:
                conn.sent()
        return self

    def _settle(self) -> None:
        """The statement's outcome, waited for now if it was only sent."""
        if not self._pending:
            return
        self._pending = False
        if self._conn.pipelining is not None and not self._cursor.pgresult:
            self._conn.sync()
        self._rowcount = self._cursor.rowcount

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed."""
        with self._conn.errors():
            self._settle()
        return self._rowcount

    @property
    def description(self) -> Any:
        """The columns of the result."""
        with self._conn.errors():
            self._settle()
        return self._cursor.description

    def _rows(self) -> bool:
        with self._conn.errors():
            self._settle()
        return self._cursor.description is not None

    def fetchone(self) -> Any:
        """The next row, or None."""
        if not self._rows():
            return None
        with store_errors():
            return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        """The remaining rows."""
        if not self._rows():
            return []
        with store_errors():
            return self._cursor.fetchall()

    def fetchmany(self, size: int) -> list[Any]:
        """Up to `size` of the remaining rows."""
        if not self._rows():
            return []
        with store_errors():
            return self._cursor.fetchmany(size)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def close(self) -> None:
        """Close the cursor."""
        self._cursor.close()


class PgConnection:
    """A psycopg connection (autocommit: transactions are the statements BEGIN and COMMIT)
    answering like a `sqlite3.Connection`."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn
        self.pipelining: psycopg.Pipeline | None = None
        # The rows `add_row` keeps (in pipeline mode), of one INSERT, not sent yet.
        self._held: InsertRows | None = None
        self._held_rows: list[tuple[Any, ...]] = []
        self._unsynced = False  # a statement was sent in pipeline mode since the last sync

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        """Pipeline mode for the block: statements are sent without waiting, results fetched
        when read (see `Cursor`); a savepoint's RELEASE (`release`) waits for the statements
        before it, so that a failure is raised inside the block it belongs to. All are waited
        for at the end.
        """
        if self.pipelining is not None:
            yield
            return
        with store_errors(), self.raw.pipeline() as pipeline:
            self.pipelining = pipeline
            try:
                yield
                self.send_held()
            finally:
                self._held, self._held_rows = None, []
                self.pipelining = None
                self._unsynced = False

    @contextmanager
    def errors(self) -> Iterator[None]:
        """`store_errors` for the block; in pipeline mode, a failure raised while sending (the
        result of a statement sent earlier, read meanwhile) leaves the pipeline synced, so that
        the statements after it (a ROLLBACK TO) run rather than fail as aborted."""
        import psycopg

        try:
            yield
        except psycopg.Error as exc:
            pipeline = self.pipelining
            if pipeline is not None and not self.broken:
                with suppress(psycopg.Error):
                    pipeline.sync()
                self._unsynced = False
            raise from_psycopg(exc) from exc

    def add_row(self, insert: InsertRows, values: Sequence[Any]) -> None:
        """Insert one row (`insert.sql`), its outcome not read. In pipeline mode the row waits
        to be sent with the rows of the same INSERT added right after it, as statements of many
        rows (`insert_rows`); whatever else the connection is asked first (another statement,
        a result, a RELEASE) sends them before it, so that the server runs the same statements
        in the same order, one INSERT of many rows in place of many of one."""
        if self.pipelining is None:
            self.execute(insert.sql, values)
            return
        if self._held is not insert:
            self.send_held()
            self._held = insert
        self._held_rows.append(tuple(values))

    def send_held(self) -> None:
        """Send the rows `add_row` kept."""
        insert, rows = self._held, self._held_rows
        if insert is None:
            return
        self._held, self._held_rows = None, []
        self.insert_rows(insert, rows)

    def insert_rows(self, insert: InsertRows, rows: Sequence[Sequence[Any]]) -> int | None:
        """Insert the rows, in statements of many rows each (one per row where `insert` cannot
        take them together); how many were written, or None in pipeline mode (not waited
        for)."""
        with self.errors():
            self.send_held()
            cursors = self._send_rows(insert, [tuple(row) for row in rows])
            if self.pipelining is not None:
                return None
            return sum(cursor.rowcount for cursor in cursors)

    def insert_returning(self, insert: InsertRows, rows: Sequence[Sequence[Any]]) -> list[Any]:
        """`insert_rows` of an INSERT ending in RETURNING: the rows it returned, in the order
        inserted (a row DO NOTHING passed over returns none)."""
        with self.errors():
            self.send_held()
            cursors = self._send_rows(insert, [tuple(row) for row in rows])
            if self.pipelining is not None:
                self.sync()
            return [row for cursor in cursors for row in cursor.fetchall()]

    def _send_rows(
        self, insert: InsertRows, rows: list[tuple[Any, ...]]
    ) -> list[psycopg.Cursor[Any]]:
        """Send the rows; their statements' cursors (outside pipeline mode, waited for, in one
        round trip)."""
        sizes = insert.parts(len(rows)) if insert.distinct(rows) else [1] * len(rows)
        if self.pipelining is None and len(sizes) > 1:
            with self.pipeline():
                return self._send_rows(insert, rows)
        sent = []
        start = 0
        for size in sizes:
            cursor = self.raw.cursor()
            part = rows[start : start + size]
            start += size
            values = part[0] if size == 1 else tuple(v for row in part for v in row)
            cursor.execute(insert.statement(size), values)
            sent.append(cursor)
        self.sent()
        return sent

    def sent(self) -> None:
        """A statement was sent: in pipeline mode, the next RELEASE waits for it."""
        self._unsynced = self.pipelining is not None

    @property
    def _unsettled(self) -> bool:
        """In pipeline mode, whether something was sent (or is held) since the last wait."""
        return self.pipelining is not None and (self._unsynced or self._held is not None)

    def sync(self) -> None:
        """Wait for the statements sent in pipeline mode (their errors are raised here)."""
        assert self.pipelining is not None
        self.send_held()
        self._unsynced = False
        self.pipelining.sync()

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (a failed one too, until it is rolled back)."""
        from psycopg import pq

        return self.raw.info.transaction_status in (
            pq.TransactionStatus.INTRANS,
            pq.TransactionStatus.INERROR,
            pq.TransactionStatus.ACTIVE,
        )

    @property
    def broken(self) -> bool:
        """Whether the connection is lost, or cannot be used again: left in pipeline mode
        outside a pipeline block (the server going away while a pipeline was busy can leave it
        so: "cannot exit pipeline mode while busy"), where every statement would be refused."""
        from psycopg import pq

        raw = self.raw
        if raw.closed or raw.broken:
            return True
        return self.pipelining is None and raw.pgconn.pipeline_status != pq.PipelineStatus.OFF

    def cursor(self) -> Cursor:
        """A new cursor."""
        with store_errors():  # a closed connection refuses one
            return Cursor(self.raw.cursor(), self)

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Cursor:
        """Run one statement on a new cursor."""
        return self.cursor().execute(sql, params)

    def settle(self) -> None:
        """In pipeline mode, wait for the statements sent (the rows held sent first), their
        errors dropped: a block that raised is about to be rolled back to its savepoint, and a
        ROLLBACK TO sent while an earlier statement of the block failed unread would be skipped
        as aborted, leaving the savepoint open for the next block's failure to land on."""
        if self._unsettled:
            with suppress(StoreError), self.errors():
                self.sync()

    def release(self, name: str) -> None:
        """RELEASE the savepoint `name`; in pipeline mode once the statements sent before it
        are done (unless none was sent since the last wait), so that a failure of the
        savepoint's block is raised inside that block."""
        if self._unsettled:
            with self.errors():
                self.sync()
        self.execute(f"RELEASE {name}")

    def executemany(self, sql: str, seq: Iterable[Sequence[Any]]) -> Cursor:
        """Run one statement once per parameter set."""
        return self.cursor().executemany(sql, seq)

    def commit(self) -> None:
        """Commit the open transaction, if any."""
        if self.in_transaction:
            self.execute("COMMIT")

    def rollback(self) -> None:
        """Roll the open transaction back, if any."""
        if self.in_transaction:
            self.execute("ROLLBACK")

    def close(self) -> None:
        """Close the connection."""
        with store_errors():
            self.raw.close()

    def close_releasing_locks(self) -> None:
        """Give the session's advisory locks back, then close. The server releases a closed
        session's locks only once its backend has noticed the end, which can come after
        `close` returns: a command run just after this one (a second `migrate-store`, a command
        after the copy) would find them still held and be refused."""
        raw = self.raw
        if not raw.closed and not raw.broken and not self.in_transaction:
            # On an error, closing anyway: the server frees them at the session's end.
            with suppress(StoreError), store_errors():
                raw.execute("SELECT pg_advisory_unlock_all()")
        self.close()

    def __enter__(self) -> PgConnection:
        """`with conn:` is one transaction, committed at the end or rolled back on an error
        (as with a `sqlite3.Connection`)."""
        if not self.in_transaction:
            self.execute("BEGIN")
        return self

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        if kind is None:
            self.commit()
        elif not self.broken:
            self.rollback()


class PgDatabase:
    """What the table modules run on, on PostgreSQL (the part of `sqlite_utils.Database` used)."""

    engine = "postgres"

    def __init__(self, conn: PgConnection) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Cursor:
        """Run one statement."""
        return self.conn.execute(sql, params)

    def query(self, sql: str, params: Sequence[Any] | None = None) -> Iterator[dict[str, Any]]:
        """The rows of a query as dicts."""
        for row in self.conn.execute(sql, params).fetchall():
            yield dict(zip(row.keys(), row, strict=True))

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One transaction for the block (a savepoint inside an open one)."""
        if self.conn.in_transaction:
            self.conn.execute("SAVEPOINT atomic")
            try:
                yield
            except BaseException:
                self.conn.execute("ROLLBACK TO atomic")
                raise
            self.conn.release("atomic")
            return
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        try:
            yield
        except BaseException:
            if not self.conn.broken:
                self.conn.rollback()
            raise
        self.conn.commit()

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def connect(
    url: str, *, password: str | None = None, application_name: str = "depositd"
) -> PgConnection:
    """A connection in autocommit mode with rows by name; `StoreUnavailable` (the URL's
    password masked) when the server cannot be reached."""
    import psycopg

    try:
        extra: dict[str, Any] = {"password": password} if password is not None else {}
        raw = psycopg.connect(
            url,
            autocommit=True,
            # Statements go as written (`placeholders`): psycopg parses no `%s` of its own.
            cursor_factory=psycopg.RawCursor,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=application_name,
            # A server that vanished from the network (no RST) is noticed within ~10 s, so
            # a round or a /readyz probe fails instead of waiting for TCP's own timeout.
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
            tcp_user_timeout=10_000,
            **extra,
        )
    except psycopg.Error as exc:
        message = str(exc).replace(url, mask_url(url)).strip()
        if password:
            message = message.replace(password, "***")
        raise StoreUnavailable(
            f"cannot connect to {mask_url(url)}: {message}", code=exc.sqlstate
        ) from exc
    raw.row_factory = _row_factory
    dumper = _untyped_dumper()
    for kind in (int, bool, float):
        raw.adapters.register_dumper(kind, dumper)
    # The Decimal strings of money columns stay exact; a Decimal sent is sent as its text.
    raw.adapters.register_dumper(Decimal, dumper)
    # A statement psycopg prepared (after its fifth run) is planned at each run, for the tables
    # as they are then: a plan kept from when the tables were small (a fresh database) read
    # whole tables where an index finds the rows once they have grown. And no JIT compiling: a
    # batch's statements run for milliseconds, and compiling one (where the server's estimate
    # of its cost passes `jit_above_cost`) took as long again.
    try:
        raw.execute("SET plan_cache_mode = force_custom_plan")
        raw.execute("SET jit = off")
    except psycopg.Error as exc:
        raw.close()
        raise from_psycopg(exc) from exc
    return PgConnection(raw)


def is_postgres(db: Any) -> bool:
    """Whether `db` (a store's database or a command's connection) is on PostgreSQL."""
    return isinstance(db, PgDatabase | PgConnection)


Dialect = Literal["sqlite", "postgres"]


def dialect(db: Any) -> Dialect:
    """The SQL `db` runs (a store's database or a command's connection): the key of a
    statement written per engine, `{"sqlite": ..., "postgres": ...}`."""
    return "postgres" if is_postgres(db) else "sqlite"
