"""Day-2 operations against a running `serve`: SIGHUP reload, online backup, replay,
retry-failed, status, and event retention."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.configs import make_config, write_config
from tests.support.paths import ROOT
from tests.support.processes import Processes, cli
from tests.support.service import Service
from tests.support.stores import StoreMaker, rows
from tests.support.waits import until
from tests.support.webhooks import envelope
from worker import __version__
from worker.clock import utc_now
from worker.service.maintenance import prune_events, prune_unchanged_facts
from worker.store.sqlitestore import Store

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]


def names(folder: Path) -> list[str]:
    """The names in a folder, sorted."""
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
async def slack(aiohttp_server: ServerFactory) -> AsyncIterator[tuple[str, list[Any]]]:
    """A Slack incoming-webhook stand-in on loopback: its URL and the payloads it received."""
    received: list[Any] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/slack", hook)
    server = await aiohttp_server(app)
    yield str(server.make_url("/slack")), received


# --- SIGHUP reload -------------------------------------------------------------------------

NEW_RULE = """
  - name: flag every new deposit
    on: [needs_details]
    then:
      - alert: {severity: warning, message: new rule}
"""


async def test_sighup_keeps_old_rules_on_a_bad_file_and_applies_a_good_one(
    tmp_path: Path, provider_url: str, slack: tuple[str, list[Any]], processes: Processes
) -> None:
    """SIGHUP: a broken rule file alerts reload_failed and keeps the rules; a good one applies."""
    slack_url, slack_posts = slack
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    rule_file = rules_dir / "default.yaml"
    original = (ROOT / "rules" / "default.yaml").read_text()
    rule_file.write_text(original)
    service = processes.own(
        Service(
            tmp_path,
            provider_url,
            rules=str(rules_dir),
            notify={"slack": {"webhook_url": slack_url}},
        )
    )
    await service.start()
    try:
        assert await service.post(envelope("ev-1", "DEPOSIT_WHITELIST_REQUIRED", "tx-1")) == 200
        first = await until(lambda: service.actions("tx-1"), "tx-1 actions")
        assert [(a, r) for a, r, _, _ in first] == [("alert", "payer details needed")]
        version = first[0][2]

        broken = original.replace("then: [book]", "then: [book_twice]")
        assert broken != original
        rule_file.write_text(broken)
        os.kill(service.pid, signal.SIGHUP)
        await until(
            lambda: rows(
                service.db,
                "SELECT id FROM actions WHERE action = 'alert' AND params LIKE '%reload_failed%'",
            ),
            "reload_failed alert row",
        )
        await until(
            lambda: any("reload_failed" in json.dumps(p) for p in slack_posts),
            "reload_failed on Slack",
        )
        failure = next(json.dumps(p) for p in slack_posts if "reload_failed" in json.dumps(p))
        assert "book_twice" in failure  # the alert names what is wrong
        assert await service.healthy()

        assert await service.post(envelope("ev-2", "DEPOSIT_WHITELIST_REQUIRED", "tx-2")) == 200
        second = await until(lambda: service.actions("tx-2"), "tx-2 actions")
        assert [(a, r, v) for a, r, v, _ in second] == [("alert", "payer details needed", version)]

        rule_file.write_text(original + NEW_RULE)
        os.kill(service.pid, signal.SIGHUP)
        await until(lambda: "rules and profiles reloaded" in service.log.read_text(), "reload")
        assert await service.post(envelope("ev-3", "DEPOSIT_WHITELIST_REQUIRED", "tx-3")) == 200
        await until(lambda: len(service.actions("tx-3")) == 2, "tx-3 actions")
        third = service.actions("tx-3")
        assert [r for _, r, _, _ in third] == ["payer details needed", "flag every new deposit"]
        assert {v for _, _, v, _ in third} != {version}
        assert await service.stop() == 0
    finally:
        await service.kill()


# --- backup --------------------------------------------------------------------------------


async def prefill(db: Path, count: int) -> None:
    """Processed events of today (4 KB each), so the database spans many backup pages."""
    store = Store(db)
    await store.open()
    try:
        padding, now = b"x" * 4096, utc_now()
        await store.write(
            lambda d: d.conn.executemany(
                "INSERT INTO events (event_id, event_type, body, received_at, status)"
                " VALUES (?, 'DEPOSIT_ORDER_NOTIFICATION', ?, ?, 'processed')",
                [(f"old-{n}", padding, now) for n in range(count)],
            )
        )
    finally:
        await store.close()


async def test_backup_under_write_load_holds_every_acknowledged_event(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """`backup` taken while webhooks stream in opens clean and holds every event acked before it."""
    service = processes.own(Service(tmp_path, provider_url))
    await prefill(service.db, 3000)
    await service.start()
    acked: list[str] = []
    stop = asyncio.Event()
    counter = iter(range(1_000_000))

    async def sender(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            n = next(counter)
            event = envelope(f"load-{n}", "DEPOSIT_ORDER_NOTIFICATION", f"tx-load-{n}")
            if await service.post(event, session) == 200:
                acked.append(event["eventId"])

    try:
        async with aiohttp.ClientSession() as session:
            senders = [asyncio.create_task(sender(session)) for _ in range(4)]
            await until(lambda: len(acked) >= 50, "some acknowledged events")
            before = list(acked)
            target = tmp_path / "backups" / "copy.db"
            # Copied in steps, each commit of the service restarted the copy: it could run for ever.
            rc, out, err = await cli(service.config, "backup", str(target), within=10)
            during = len(acked) - len(before)
            stop.set()
            await asyncio.gather(*senders)
        assert rc == 0, err
        assert str(target) in out
        assert during > 0, "no webhook was acknowledged while the backup ran"
        assert not target.with_name("copy.db.partial").exists()

        assert rows(target, "PRAGMA integrity_check") == [("ok",)]
        assert rows(target, "PRAGMA journal_mode") == [("delete",)]  # one self-contained file
        stored = {r[0] for r in rows(target, "SELECT event_id FROM events")}
        assert set(before) <= stored
        assert {f"old-{n}" for n in range(3000)} <= stored
        assert await service.stop() == 0
    finally:
        await service.kill()


async def test_backup_refuses_the_live_database_and_its_files(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """`backup` onto the running service's database, its -wal/-shm/-journal, or another name of
    the database (relative, symlink, hard link) exits 2 and writes nothing: the database stays
    whole and keeps every event."""
    service = processes.own(Service(tmp_path, provider_url))
    await service.start()
    db = service.db
    try:
        assert await service.post(envelope("ev-1", "DEPOSIT_ORDER_NOTIFICATION", "tx-1")) == 200
        await until(lambda: service.event_status("ev-1") == "processed", "ev-1")
        (tmp_path / "link.db").symlink_to(db)
        os.link(db, tmp_path / "hard.db")
        targets = [
            db,
            *(db.with_name(db.name + suffix) for suffix in ("-wal", "-shm", "-journal")),
            Path(os.path.relpath(db, ROOT)),  # noqa: ASYNC240 (no I/O); `cli` runs in ROOT
            tmp_path / "link.db",
            tmp_path / "hard.db",
        ]
        for target in targets:
            rc, out, err = await cli(service.config, "backup", str(target))
            assert rc == 2, (target, out, err)
            assert "live database file" in err and "Traceback" not in err
        assert await service.post(envelope("ev-2", "DEPOSIT_ORDER_NOTIFICATION", "tx-2")) == 200
        await until(lambda: service.event_status("ev-2") == "processed", "ev-2")
        assert await service.stop() == 0
    finally:
        await service.kill()
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]
    assert rows(db, "SELECT event_id FROM events ORDER BY seq") == [("ev-1",), ("ev-2",)]
    assert not [name for name in names(tmp_path) if name.endswith(".partial")]


async def test_backup_refuses_a_target_whose_temporary_copy_is_the_database(
    tmp_path: Path,
) -> None:
    """`backup X` writes X.partial first: with the database at X.partial, that is refused too."""
    db = tmp_path / "copy.db.partial"
    await prefill(db, 1)
    config = write_config(tmp_path, make_config(db))
    rc, _, err = await cli(config, "backup", str(tmp_path / "copy.db"))
    assert rc == 2 and "temporary copy" in err
    assert rows(db, "SELECT COUNT(*) FROM events") == [(1,)]
    assert not (tmp_path / "copy.db").exists()


async def test_backup_to_a_folder_or_an_unwritable_place_fails_cleanly(
    tmp_path: Path, processes: Processes
) -> None:
    """A folder as the target is refused (exit 2) before anything is written; a target that
    cannot be created, or a write failing midway, exits 1 with a message, no traceback and no
    `.partial` file left behind."""
    db = tmp_path / "depositd.db"
    await prefill(db, 50)  # ~200 KB
    config = write_config(tmp_path, make_config(db))
    folder = tmp_path / "backups"
    folder.mkdir()
    rc, _, err = await cli(config, "backup", str(folder))
    assert rc == 2 and "is a directory" in err and "Traceback" not in err
    assert [n for n in names(tmp_path) if not n.startswith("depositd.db")] == [
        "backups",
        "depositd.yaml",
    ]
    assert names(folder) == []

    (tmp_path / "a-file").write_text("")
    rc, _, err = await cli(config, "backup", str(tmp_path / "a-file" / "copy.db"))
    assert rc == 1 and "backup to" in err and "Traceback" not in err

    # A disk filling up midway, as a file-size limit for the command (which root obeys too).
    limited = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536));"
        " from worker.commands.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = processes.own(
        await asyncio.create_subprocess_exec(
            *[
                sys.executable,
                "-c",
                limited,
                "backup",
                str(folder / "copy.db"),
                "--config",
                str(config),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    )
    _, raw_err = await asyncio.wait_for(proc.communicate(), 30)
    err = raw_err.decode()
    assert proc.returncode == 1 and "backup to" in err and "Traceback" not in err, err
    assert names(folder) == []


# --- replay, retry-failed, status ----------------------------------------------------------


async def test_replay_reprocesses_an_event_without_acting_twice(
    tmp_path: Path, provider_url: str, make_store: StoreMaker, processes: Processes
) -> None:
    """`replay` re-runs a stored event through the running service; it books nothing twice
    (on SQLite and on PostgreSQL)."""
    service = processes.own(Service(tmp_path, provider_url, make_store.storage()))
    await service.start()
    try:
        assert await service.post(envelope("ev-req", "DEPOSIT_WHITELIST_REQUIRED", "tx-r")) == 200
        credited = envelope("ev-cred", "DEPOSIT_WHITELIST_CREDITED", "tx-r")
        assert await service.post(credited) == 200
        await until(lambda: service.event_status("ev-cred") == "processed", "processing")
        done = [("alert", "done"), ("book", "done")]
        await until(
            lambda: [(a, s) for a, _, _, s in service.actions("tx-r")] == done, "the actions"
        )
        before = service.actions("tx-r")
        assert rows(service.db, "SELECT COUNT(*) FROM ledger") == [(1,)]

        rc, out, err = await cli(service.config, "replay", "ev-cred")
        assert rc == 0, err
        assert "ev-cred" in out
        # The processor sweeps the inbox periodically: a fact row per run of the event.
        await until(
            lambda: (
                rows(service.db, "SELECT COUNT(*) FROM facts WHERE event_id='ev-cred'") == [(2,)]
            ),
            "the replayed event to run again",
        )
        assert service.event_status("ev-cred") == "processed"
        assert service.actions("tx-r") == before
        assert rows(service.db, "SELECT COUNT(*) FROM ledger") == [(1,)]

        rc, _, err = await cli(service.config, "replay", "no-such-event")
        assert rc == 1
        assert "no-such-event" in err
        assert await service.stop() == 0
    finally:
        await service.kill()


async def test_status_then_retry_failed_keeps_idempotency_keys(
    tmp_path: Path, provider_url: str, make_store: StoreMaker, processes: Processes
) -> None:
    """`status` counts failures and waiting deposits; `retry-failed` re-runs them, same keys
    (on SQLite and on PostgreSQL)."""
    service = processes.own(Service(tmp_path, provider_url, make_store.storage()))
    await service.start()
    try:
        # Wallet 1002 has a fallback profile, so this is submitted; the sandbox never saw the
        # deposit, so the submission fails for good ("deposit gone").
        gone = envelope("ev-gone", "DEPOSIT_WHITELIST_REQUIRED", "tx-gone", walletId=1002)
        assert await service.post(gone) == 200
        broken = envelope("ev-bad", "DEPOSIT_WHITELIST_REQUIRED", "tx-bad", amount="lots")
        assert await service.post(broken) == 200
        await until(lambda: service.event_status("ev-bad") == "failed", "the broken event to fail")
        submit = (
            "SELECT status, attempts, idempotency_key FROM actions WHERE action='submit_profile'"
        )
        [(_, attempts, key)] = await until(
            lambda: rows(service.db, submit + " AND status='failed'"), "the submission to fail"
        )
        assert (attempts, len(key)) == (1, 40)
        last_webhook = rows(service.db, "SELECT MAX(received_at) FROM events")[0][0]

        rc, out, err = await cli(service.config, "status")
        assert rc == 0, err
        report = json.loads(out)
        assert report["version"] == __version__
        assert report["lastWebhookAt"] == last_webhook
        assert report["pendingEvents"] == 0
        assert report["failedEvents"] == 1
        assert report["failedActions"] == 1
        assert report["waitingOnHuman"] == 1  # tx-gone still needs payer details
        assert report["deposits"] == {"needs_details": 1}

        rc, out, err = await cli(service.config, "retry-failed")
        assert rc == 0, err
        assert "1 event(s), 1 action(s)" in out
        # The service runs them again: the submission with the same key, the event anew.
        again = await until(
            lambda: rows(service.db, submit + " AND attempts=2"), "the submission to run again"
        )
        assert again[0][2] == key
        await until(lambda: rows(service.db, submit)[0][0] == "failed", "the submission to settle")
        assert rows(service.db, submit) == [("failed", 2, key)]
        await until(
            lambda: rows(service.db, "SELECT error FROM events WHERE event_id='ev-bad'")[0][0],
            "the broken event to run again",
        )
        assert service.event_status("ev-bad") == "failed"
        assert await service.stop() == 0
    finally:
        await service.kill()


async def test_status_is_running_only_while_serve_has_the_database_open(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """`status` after serve was SIGKILLed (start recorded, no stop) says not running and an
    unclean stop, with no uptime; while serve runs, and after a clean stop, it says so."""
    service = processes.own(Service(tmp_path, provider_url))
    try:
        await service.start()
        rc, out, err = await cli(service.config, "status")
        assert rc == 0, err
        report = json.loads(out)
        assert (report["running"], report["uncleanStop"]) == (True, False)
        assert report["uptimeSeconds"] >= 0
        assert report["leader"] is None  # the scheduler is off here: nobody leads it

        assert await service.signal(signal.SIGKILL, 20) == -signal.SIGKILL
        started = rows(service.db, "SELECT value FROM meta WHERE key='started_at'")[0][0]
        rc, out, err = await cli(service.config, "status")
        assert rc == 0, err
        report = json.loads(out)
        assert (report["running"], report["uncleanStop"], report["uptimeSeconds"]) == (
            False,
            True,
            None,
        )
        assert (report["startedAt"], report["stoppedAt"]) == (started, None)

        await service.start()
        rc, out, _ = await cli(service.config, "status")
        assert json.loads(out)["running"] is True
        assert await service.stop() == 0
        rc, out, _ = await cli(service.config, "status")
        report = json.loads(out)
        assert (report["running"], report["uncleanStop"]) == (False, False)
        assert report["stoppedAt"] > report["startedAt"]
    finally:
        await service.kill()


async def test_ops_commands_without_a_database_exit_1(tmp_path: Path) -> None:
    """`status` before any `serve` ran says there is no database and exits 1."""
    config = write_config(tmp_path, make_config(tmp_path / "none.db"))
    rc, _, err = await cli(config, "status")
    assert rc == 1
    assert "no database" in err
    assert not (tmp_path / "none.db").exists()


# --- retention -----------------------------------------------------------------------------


async def test_prune_events_keeps_history_and_unfinished_events(tmp_path: Path) -> None:
    """prune_events drops only processed/ignored events past retention; ledger/actions stay."""
    store = Store(tmp_path / "depositd.db")
    await store.open()
    old, recent = "2020-01-01T00:00:00.000Z", "2099-01-01T00:00:00.000Z"
    events = [
        ("old-processed", "processed", old),
        ("old-ignored", "ignored", old),
        ("old-pending", "pending", old),
        ("old-failed", "failed", old),
        ("new-processed", "processed", recent),
    ]

    def seed(db: Any) -> None:
        db.conn.executemany(
            "INSERT INTO events (event_id, event_type, transaction_id, body, received_at, status)"
            " VALUES (?, 'DEPOSIT_WHITELIST_CREDITED', 'tx-1', x'7b7d', ?, ?)",
            [(e, t, s) for e, s, t in events],
        )
        db.execute(
            "INSERT INTO deposits (transaction_id, state, created_at)"
            " VALUES ('tx-1', 'credited', ?)",
            [old],
        )
        db.execute(
            "INSERT INTO actions (transaction_id, event_id, action, status, created_at)"
            " VALUES ('tx-1', 'old-processed', 'book', 'done', ?)",
            [old],
        )
        db.execute(
            "INSERT INTO ledger (transaction_id, amount, booked_at) VALUES ('tx-1', '1.5', ?)",
            [old],
        )

    try:
        await store.write(seed)
        assert await store.write(lambda db: prune_events(db, 30)) == 2
        assert await store.write(lambda db: prune_events(db, 30)) == 0
    finally:
        await store.close()
    db = tmp_path / "depositd.db"
    assert {r[0] for r in rows(db, "SELECT event_id FROM events")} == {
        "old-pending",
        "old-failed",
        "new-processed",
    }
    for table in ("deposits", "actions", "ledger"):
        assert rows(db, f"SELECT COUNT(*) FROM {table}") == [(1,)], table


async def test_prune_unchanged_facts_keeps_the_ones_that_moved_a_deposit(tmp_path: Path) -> None:
    """Facts that changed nothing (repeated polls) go after the retention; the rest stay."""
    store = Store(tmp_path / "depositd.db")
    await store.open()
    old, recent = "2020-01-01T00:00:00.000Z", "2099-01-01T00:00:00.000Z"
    facts = [("old-same", 0, old), ("old-moved", 1, old), ("new-same", 0, recent)]

    def seed(db: Any) -> None:
        db.conn.executemany(
            "INSERT INTO facts (transaction_id, source, event_id, fact, changed, recorded_at)"
            " VALUES ('tx-1', 'poll', ?, '{}', ?, ?)",
            facts,
        )

    try:
        await store.write(seed)
        assert await store.write(lambda db: prune_unchanged_facts(db, 30)) == 1
        assert await store.write(lambda db: prune_unchanged_facts(db, 30)) == 0
    finally:
        await store.close()
    kept = {r[0] for r in rows(tmp_path / "depositd.db", "SELECT event_id FROM facts")}
    assert kept == {"old-moved", "new-same"}
