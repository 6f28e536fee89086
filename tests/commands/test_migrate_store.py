"""`depositd migrate-store --to`: a SQLite database copied into an empty PostgreSQL one and back,
checked on both sides; refused while a serve runs or into a database that holds rows; a failure
leaves the target as it was."""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import make_config, write_config
from tests.support.pgcluster import Cluster
from worker.commands import migrate as migrate_command
from worker.commands.cli import main
from worker.config.settings import StorageSettings, load_settings
from worker.store.actions import insert_action
from worker.store.ledger import insert_booking
from worker.store.pg import PgConnection
from worker.store.pg import connect as pg_connect
from worker.store.pgstore import PgStore
from worker.store.pgstore import serve_lock as pg_serve_lock
from worker.store.servelock import serve_lock
from worker.store.sqlitestore import Store, event_row
from worker.store.writelock import command_writes

AMOUNTS = ["1234.567800", "0.000001", "99.99"]


async def seed_sqlite(path: Path) -> None:
    """Events, bookings in two currencies and actions, written the way serve writes them."""
    store = Store(path)
    await store.open()
    try:
        for n in range(5):
            row = event_row(
                f"ev-{n}",
                "DEPOSIT_ORDER_NOTIFICATION",
                f"tx-{n}",
                f"tx-{n}",
                b'{"eventId": "x"}\x00\xff',
                {},
                "2026-01-01T00:00:00Z",
            )
            await store.queue_event(row)

        def book(db: Any) -> None:
            for n, amount in enumerate(AMOUNTS):
                insert_booking(
                    db,
                    transaction_id=f"tx-{n}",
                    wallet_id=1001,
                    wallet_name="w",
                    currency="USDT",
                    network="TRON",
                    amount=amount,
                    from_address="a",
                    tx_hash=f"h{n}",
                    trigger="credited",
                )
            insert_booking(
                db,
                transaction_id="tx-9",
                wallet_id=1001,
                wallet_name="w",
                currency="BTC",
                network="BTC",
                amount="0.5",
                from_address="a",
                tx_hash="h9",
                trigger="credited",
            )
            for n in range(3):
                insert_action(
                    db,
                    transaction_id=f"tx-{n}",
                    event_id=f"ev-{n}",
                    trigger="credited",
                    rule_set=None,
                    rule_set_version=None,
                    rule=None,
                    action="book",
                    params="{}",
                    idempotency_key=f"k{n}",
                    status="done",
                    outcome="booked",
                )

        await store.write(book)
    finally:
        await store.close()


def pg_rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    conn = pg_connect(url)
    try:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    finally:
        conn.close()


def pg_tables(url: str) -> list[str]:
    return [
        r[0]
        for r in pg_rows(
            url,
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema()",
        )
    ]


async def test_a_sqlite_database_moves_to_postgresql_and_back(
    tmp_path: Path, pg_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every row arrives, blobs and decimal strings unchanged; the figures both sides were
    checked by are printed; the generated keys go on past the copied ones; and the way back
    into a new SQLite file gives the same rows."""
    db = tmp_path / "depositd.db"
    await seed_sqlite(db)
    url = pg_cluster.create_database()
    config = write_config(tmp_path, make_config(db))

    assert main(["migrate-store", "--config", str(config), "--to", url]) == 0
    out = capsys.readouterr().out
    assert "rows per table and ledger sums match" in out
    assert any(line.split() == ["events", "5", "5"] for line in out.splitlines())
    assert any(line.split() == ["USDT", "1334.557801", "1334.557801"] for line in out.splitlines())
    assert "BTC" in out

    assert sorted(r[0] for r in pg_rows(url, "SELECT amount FROM ledger")) == sorted(
        [*AMOUNTS, "0.5"]
    )
    bodies = pg_rows(url, "SELECT body FROM events ORDER BY seq")
    assert [bytes(b[0]) for b in bodies] == [b'{"eventId": "x"}\x00\xff'] * 5

    store = PgStore(url)
    await store.open()
    try:
        await store.queue_event(
            event_row("ev-new", None, None, None, b"{}", {}, "2026-01-02T00:00:00Z")
        )
        seq = await store.read(
            lambda d: d.execute("SELECT seq FROM events WHERE event_id = 'ev-new'").fetchone()[0]
        )
        action = await store.write(
            lambda d: insert_action(
                d,
                transaction_id=None,
                event_id=None,
                trigger="t",
                rule_set=None,
                rule_set_version=None,
                rule=None,
                action="a",
                params="{}",
                idempotency_key=None,
                status="pending",
                outcome=None,
            )
        )
    finally:
        await store.close()
    assert seq == 6 and action == 4

    back = tmp_path / "back.db"
    pg_config = write_config(tmp_path / "pg.yaml", make_config({"url": url}))
    assert main(["migrate-store", "--config", str(pg_config), "--to", str(back)]) == 0
    assert "rows per table and ledger sums match" in capsys.readouterr().out
    conn = sqlite3.connect(back)
    try:
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 6
        amounts = [Decimal(r[0]) for r in conn.execute("SELECT amount FROM ledger")]
        assert sum(amounts) == Decimal("1335.057801")
        assert conn.execute("SELECT body FROM events WHERE seq = 1").fetchone()[0] == (
            b'{"eventId": "x"}\x00\xff'
        )
    finally:
        conn.close()


async def test_a_target_with_rows_or_a_running_serve_is_refused(
    tmp_path: Path, pg_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 and nothing written when the target holds depositd rows, or while a `serve`
    holds the source; a target with the empty schema (an instance started on it) is taken."""
    db = tmp_path / "depositd.db"
    await seed_sqlite(db)
    config = write_config(tmp_path, make_config(db))
    url = pg_cluster.create_database()
    store = PgStore(url)
    await store.open()
    await store.close()  # the empty schema only

    with serve_lock(db):
        assert main(["migrate-store", "--config", str(config), "--to", url]) == 2
    assert "a depositd serve runs on" in capsys.readouterr().err
    assert pg_rows(url, "SELECT COUNT(*) FROM events") == [(0,)]

    assert main(["migrate-store", "--config", str(config), "--to", url]) == 0
    capsys.readouterr()
    assert main(["migrate-store", "--config", str(config), "--to", url]) == 2
    err = capsys.readouterr().err
    assert "the target holds depositd rows" in err and "events (5 rows)" in err
    assert pg_rows(url, "SELECT COUNT(*) FROM events") == [(5,)]


async def test_a_failed_copy_leaves_the_target_empty(
    tmp_path: Path, pg_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row PostgreSQL refuses (text SQLite kept in an INTEGER column) fails the command
    (exit 1) and leaves no table behind: schema and rows were one transaction."""
    db = tmp_path / "depositd.db"
    await seed_sqlite(db)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE actions SET attempts = 'three' WHERE id = 2")
    conn.commit()
    conn.close()
    url = pg_cluster.create_database()
    config = write_config(tmp_path, make_config(db))
    assert main(["migrate-store", "--config", str(config), "--to", url]) == 1
    assert "the target is left as it was" in capsys.readouterr().err
    assert pg_tables(url) == []


async def test_the_password_file_is_read_and_never_shown(
    tmp_path: Path,
    pg_cluster: Cluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--password-file NAME` names a credential the unit loads (depositctl); a file that
    cannot be read is refused (exit 2) before anything is copied; the password is never
    printed."""
    db = tmp_path / "depositd.db"
    await seed_sqlite(db)
    config = write_config(tmp_path, make_config(db))
    url = pg_cluster.create_database()
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "db_password").write_text("pw-from-credential\n")
    assert (
        main(
            [
                "migrate-store",
                "--config",
                str(config),
                "--to",
                url,
                "--password-file",
                "db_password",
            ]
        )
        == 2
    )
    assert "cannot read the password file" in capsys.readouterr().err
    assert pg_tables(url) == []
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    assert (
        main(
            [
                "migrate-store",
                "--config",
                str(config),
                "--to",
                url,
                "--password-file",
                "db_password",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "rows per table and ledger sums match" in out
    assert "pw-from-credential" not in out + err


@pytest.mark.parametrize(
    "url", ["postgresql://depositd:s3cret@127.0.0.1:1/db", "postgresql://h/db?password=s3cret"]
)
def test_a_password_in_the_url_is_refused_and_never_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """A password in `--to` would sit in the process list and the shell's history: refused
    (exit 2) before anything is opened, naming --password-file, never the password."""
    config = tmp_path / "depositd.yaml"
    config.write_text(
        "provider: {base_url: 'https://p.acme.com', api_key: k, api_secret: s}\n"
        "webhook: {api_key: k, secret: s}\n"
        f"storage: {{path: '{tmp_path / 'd.db'}'}}\n"
    )
    assert main(["migrate-store", "--config", str(config), "--to", url]) == 2
    err = capsys.readouterr().err
    assert "--password-file" in err and "s3cret" not in err
    assert not (tmp_path / "d.db").exists()


async def _source(kind: str, tmp_path: Path, pg_cluster: Cluster) -> tuple[Path, str, Any]:
    """A seeded source database of `kind` with one failed action: its config, a `--to` of the
    other engine, and a raw connection to the source that takes no lock of depositd's."""
    db = tmp_path / "depositd.db"
    await seed_sqlite(db)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE actions SET status = 'failed' WHERE id = 1")
    conn.commit()
    conn.close()
    config = write_config(tmp_path, make_config(db))
    if kind == "sqlite":
        return (
            config,
            pg_cluster.create_database(),
            lambda: sqlite3.connect(db, isolation_level=None),
        )
    url = pg_cluster.create_database()
    assert main(["migrate-store", "--config", str(config), "--to", url]) == 0
    pg_config = write_config(tmp_path / "pg.yaml", make_config({"url": url}))
    return pg_config, str(tmp_path / "back.db"), lambda: pg_connect(url)


def _target_rows(to: str, sql: str) -> list[tuple[Any, ...]] | None:
    """Rows of the target (None: no such table, or no such file)."""
    if to.startswith("postgresql://"):
        return pg_rows(to, sql) if "actions" in pg_tables(to) else None
    if not Path(to).exists():
        return None
    conn = sqlite3.connect(to)
    try:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    finally:
        conn.close()


def _during_copy(monkeypatch: pytest.MonkeyPatch, act: Any) -> list[Any]:
    """Run `act()` once while the copy copies its first table; what it returned."""
    done: list[Any] = []

    def progress() -> Any:
        def show(table: str, copied: int, total: int) -> None:
            if not done:
                done.append(act())

        return show

    monkeypatch.setattr(migrate_command, "_progress", progress)
    return done


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_command_that_writes_during_the_copy_is_refused(
    tmp_path: Path,
    pg_cluster: Cluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """`retry-failed` run while the copy runs writes nothing (exit 1, naming the copy): the
    copy and the source hold the same rows, the failed action is failed on both."""
    config, to, _raw = await _source(kind, tmp_path, pg_cluster)
    capsys.readouterr()
    retried = _during_copy(monkeypatch, lambda: main(["retry-failed", "--config", str(config)]))
    assert main(["migrate-store", "--config", str(config), "--to", to]) == 0
    err = capsys.readouterr().err
    assert retried == [1]
    assert "migrate-store is copying" in err and "nothing was written" in err
    assert _target_rows(to, "SELECT status FROM actions WHERE id = 1") == [("failed",)]
    monkeypatch.setattr(migrate_command, "_progress", lambda: None)
    assert main(["retry-failed", "--config", str(config)]) == 0  # the copy is done: it writes
    assert "queued again: 0 event(s), 1 action(s)" in capsys.readouterr().out


async def test_the_commands_after_a_copy_are_not_refused_by_its_closed_sessions(
    tmp_path: Path, pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL frees a closed session's locks once its backend has noticed the close, which
    can be after the command ended. A copy gives its locks back before it closes: run here with
    every close held back (as a loaded server can), a second copy of the same database and a
    command that writes, right after the first copy, are not refused."""
    left_open: list[PgConnection] = []
    monkeypatch.setattr(PgConnection, "close", lambda self: left_open.append(self))
    try:
        config, to, _raw = await _source("postgres", tmp_path, pg_cluster)
        assert main(["migrate-store", "--config", str(config), "--to", to]) == 0
        again = str(tmp_path / "again.db")
        assert main(["migrate-store", "--config", str(config), "--to", again]) == 0
        assert main(["retry-failed", "--config", str(config)]) == 0
        assert main(["migrate-store", "--config", str(config), "--to", str(tmp_path / "3.db")]) == 0
    finally:
        for conn in left_open:
            conn.raw.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_copy_is_refused_while_a_command_writes(
    tmp_path: Path, pg_cluster: Cluster, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A command holding the write lock (as `resolve --set`, `submit`, `reconcile` do while
    they run) keeps the copy from starting: exit 2, the target untouched."""
    config, to, _raw = await _source(kind, tmp_path, pg_cluster)
    capsys.readouterr()
    with command_writes(load_settings(config).storage):
        assert main(["migrate-store", "--config", str(config), "--to", to]) == 2
    assert "a depositd command writes to" in capsys.readouterr().err
    assert _target_rows(to, "SELECT COUNT(*) FROM actions") in (None, [(0,)])
    assert main(["migrate-store", "--config", str(config), "--to", to]) == 0


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_change_to_the_source_during_the_copy_fails_it(
    tmp_path: Path,
    pg_cluster: Cluster,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """A write that takes no lock of depositd's (a sqlite3 or psql session), committed after
    the copy's snapshot, is found by the source's check: exit 1, the target left empty, though
    no row count or ledger sum changed."""
    config, to, raw = await _source(kind, tmp_path, pg_cluster)
    capsys.readouterr()

    def write() -> None:
        conn = raw()
        try:
            conn.execute("UPDATE actions SET status = 'pending' WHERE id = 1")
        finally:
            conn.close()

    _during_copy(monkeypatch, write)
    assert main(["migrate-store", "--config", str(config), "--to", to]) == 1
    out, err = capsys.readouterr()
    assert "the source changed during the copy" in err and "rows per table" not in out
    assert _target_rows(to, "SELECT COUNT(*) FROM actions") is None


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_target_a_serve_uses_is_refused(
    tmp_path: Path, pg_cluster: Cluster, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A target database a `serve` runs on (its empty schema, its serve lock held) is refused:
    exit 2, nothing copied into it."""
    config, to, _raw = await _source(kind, tmp_path, pg_cluster)
    capsys.readouterr()
    if to.startswith("postgresql://"):
        store = PgStore(to)
        await store.open()
        await store.close()  # the empty schema, as a serve starting on it leaves
        held: Any = pg_serve_lock(StorageSettings(url=to))
    else:
        held = serve_lock(Path(to))
    with held:
        assert main(["migrate-store", "--config", str(config), "--to", to]) == 2
    assert "a depositd serve runs on" in capsys.readouterr().err
    assert _target_rows(to, "SELECT COUNT(*) FROM actions") in (None, [(0,)])
