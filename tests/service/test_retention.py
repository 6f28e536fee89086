"""Retention of personal data on both engines: the payer values of submissions whose deposit
finished more than `retention.personal_data_days` ago are gone from the database (every table,
and on SQLite the file and its WAL), those of deposits still waiting or finished recently stay,
one PURGED journal entry per chunk names the rows and the chain holds, a second run changes
nothing, several instances purge each row once, and an unset key keeps everything."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlite_utils
import yaml

from tests.support.stores import StoreMaker
from tests.support.waits import until_async
from worker.clock import iso_from_ms, now_ms
from worker.commands.ops import status_report
from worker.dev.harness import Stack
from worker.provider.models import CreditStatus, OrderStatus, WhiteListStatus
from worker.service.retention import Retention, purge_personal_data
from worker.store import journal
from worker.store.meta import get_meta
from worker.store.pg import is_postgres
from worker.store.pgstore import PgStore
from worker.store.retention import LAST_RUN, SUBJECT
from worker.store.sqlite import connect
from worker.store.sqlitestore import Store
from worker.store.submissions import every, record_sent
from worker.track.processor import apply_fact
from worker.track.tracker import Fact

DAY_MS = 86_400_000
DAYS = 30


@dataclass(frozen=True)
class Sent:
    """One submission written as the submission flow writes it: its action id, deposit and the
    payer values it sent (each unique to it, to be searched for in the database)."""

    action_id: int
    transaction_id: str
    values: tuple[str, ...]


def _payer(tag: str) -> dict[str, Any]:
    return {
        "correspondentType": "INDIVIDUAL",
        "firstName": f"Ottilie{tag}",
        "lastName": f"Vandermeer{tag}",
        "birthday": "1980-02-03",
        "countryCode": "DE",
        "residentialAddress": f"Lindenweg {tag}, Berlin",
        "walletType": "SELF_HOSTED",
    }


def _facts(tx: str, end: str, ago_days: float, now: int) -> list[Fact]:
    """The facts of a deposit that waited for details and then reached `end` (completed,
    failed, blocked, rejected, or conflict: completed, then a later fact stating another
    amount) `ago_days` days before `now`."""
    start = now - int((ago_days + 3) * DAY_MS)
    at = now - int(ago_days * DAY_MS)
    common: dict[str, Any] = {
        "transaction_id": tx,
        "source": "webhook",
        "wallet_id": 7,
        "currency": "USDT",
        "network": "TRON",
        "amount": Decimal("125.50"),
        "from_address": f"T{tx}",
    }
    first = Fact(
        **common,
        observed_at=start,
        event_id=f"{tx}-1",
        status=OrderStatus.PROCESSING,
        white_list_status=WhiteListStatus.INIT,
    )
    ends: dict[str, dict[str, Any]] = {
        "completed": {
            "status": OrderStatus.SUCCESS,
            "white_list_status": WhiteListStatus.APPROVED,
            "credit_status": CreditStatus.CREDITED,
            "tx_hash": f"0x{tx}",
        },
        "failed": {"status": OrderStatus.FAIL},
        "blocked": {"credit_status": CreditStatus.BLOCKED},
        "rejected": {"white_list_status": WhiteListStatus.REJECTED},
    }
    last = Fact(
        **common, observed_at=at, event_id=f"{tx}-2", **ends[end.replace("conflict", "completed")]
    )
    facts = [first, last]
    if end == "conflict":
        later = {**common, "amount": Decimal("999")}
        facts.append(Fact(**later, observed_at=at + 1000, event_id=f"{tx}-3"))
    return facts


async def _deposit(store: Store, tx: str, end: str, ago_days: float, now: int) -> None:
    """The deposit in the store, as the tracker folds its facts in."""

    def write(db: sqlite_utils.Database) -> None:
        for fact in _facts(tx, end, ago_days, now):
            apply_fact(db, fact, None)

    await store.write(write)


async def _sent(store: Store, action_id: int, tx: str, sent_at: int) -> Sent:
    """A submission kept with its SUBMITTED entry, as the submission flow keeps it."""
    body = _payer(f"{tx}x{action_id}")

    def write(db: sqlite_utils.Database) -> None:
        digest = record_sent(
            db,
            action_id=action_id,
            transaction_id=tx,
            profile="alice",
            body=body,
            sent_at=iso_from_ms(sent_at),
            outcome="accepted",
        )
        journal.append(
            db,
            journal.SUBMITTED,
            tx,
            {
                "action_id": action_id,
                "profile": "alice",
                "fields": sorted(body),
                "payload_sha256": digest,
                "rule_set": "default",
                "rule_set_version": "1",
                "rules_hash": "0" * 64,
                "outcome": "accepted",
            },
        )

    await store.write(write)
    return Sent(action_id, tx, (body["firstName"], body["lastName"], body["residentialAddress"]))


async def _stored_text(store: Store) -> str:
    """Every value of every table of the database, as one text."""

    def read(db: Any) -> str:
        if is_postgres(db):
            names = [
                r[0]
                for r in db.execute(
                    "SELECT table_name FROM information_schema.tables"
                    " WHERE table_schema = current_schema()"
                ).fetchall()
            ]
        else:
            names = [
                r[0]
                for r in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                ).fetchall()
            ]
        parts: list[str] = []
        for name in names:
            for row in db.execute(f"SELECT * FROM {name}").fetchall():
                parts.extend(str(v) for v in tuple(row))
        return "\n".join(parts)

    return await store.read(read)


def _file_bytes(store: Store) -> bytes:
    """The SQLite file and its WAL as they are on disk."""
    data = store.path.read_bytes()
    wal = Path(f"{store.path}-wal")
    return data + (wal.read_bytes() if wal.exists() else b"")


async def _world(store: Store, now: int) -> dict[str, list[Sent]]:
    """Deposits in every case retention tells apart, each with its submissions."""
    cases = {
        # finished long ago: purged (a rejected first submission, then the accepted one)
        "completed_old": ("completed", 40),
        "failed_old": ("failed", 31),
        # finished recently, or still waiting on the provider or a person: kept
        "completed_recent": ("completed", 29),
        "rejected_old": ("rejected", 90),
        "blocked_old": ("blocked", 90),
        "conflict_old": ("conflict", 90),
    }
    sent: dict[str, list[Sent]] = {}
    action_id = 100
    for case, (end, ago) in cases.items():
        tx = f"T{case.replace('_', '')}"
        await _deposit(store, tx, end, ago, now)
        sent[case] = []
        for offset in (2, 1):  # sent before the deposit finished
            action_id += 1
            sent_at = now - int((ago + offset) * DAY_MS)
            sent[case].append(await _sent(store, action_id, tx, sent_at))
    return sent


PURGED_CASES = ("completed_old", "failed_old")


def _on_sqlite(store: Store) -> bool:
    return not isinstance(store, PgStore)


async def test_values_of_deposits_finished_long_ago_are_gone_and_the_rest_stays(
    store: Store,
) -> None:
    now = now_ms()
    world = await _world(store, now)
    text = await _stored_text(store)
    raw = _file_bytes(store) if _on_sqlite(store) else b""
    for sents in world.values():
        for s in sents:
            assert all(v in text for v in s.values)
            assert all(v.encode() in raw for v in s.values) or not _on_sqlite(store)

    run = await purge_personal_data(store, DAYS, now=now)

    purged = sorted(s.action_id for c in PURGED_CASES for s in world[c])
    assert run.action_ids == purged
    assert run.before == iso_from_ms(now - DAYS * DAY_MS) and run.wal_emptied
    text = await _stored_text(store)
    raw = _file_bytes(store) if _on_sqlite(store) else b""
    rows = {r["action_id"]: r for r in await store.read(every)}
    for case, sents in world.items():
        for s in sents:
            row = rows[s.action_id]
            if case in PURGED_CASES:
                # Gone from every table, and from the file and its WAL.
                assert not [v for v in s.values if v in text], case
                assert not [v for v in s.values if v.encode() in raw], case
                assert row["body"] is None and row["purged_at"] is not None
            else:
                assert all(v in text for v in s.values), case
                assert json.loads(row["body"])["firstName"] == s.values[0]
                assert row["purged_at"] is None


async def test_one_purged_entry_names_the_rows_and_the_evidence_still_holds(
    store: Store,
) -> None:
    now = now_ms()
    world = await _world(store, now)
    rows_before = {r["action_id"]: r for r in await store.read(every)}

    run = await purge_personal_data(store, DAYS, now=now)

    entries = await store.read(lambda db: list(journal.entries(db)))
    assert journal.chain_problem(entries) is None
    purged = [e for e in entries if e.kind == journal.PURGED]
    assert [e.seq for e in purged] == run.entries and len(purged) == 1
    assert purged[0].subject == SUBJECT
    assert purged[0].body == {
        "action_ids": sorted(s.action_id for c in PURGED_CASES for s in world[c]),
        "before": iso_from_ms(now - DAYS * DAY_MS),
        "days": DAYS,
    }
    # What was sent stays provable: the row's hash and field names are those of its
    # SUBMITTED entry, as they were before the values went.
    submitted = {e.body["action_id"]: e.body for e in entries if e.kind == journal.SUBMITTED}
    for row in await store.read(every):
        before = rows_before[row["action_id"]]
        assert row["payload_sha256"] == before["payload_sha256"]
        assert row["payload_sha256"] == submitted[row["action_id"]]["payload_sha256"]
        assert json.loads(row["fields"]) == json.loads(before["fields"])
        assert json.loads(row["fields"]) == submitted[row["action_id"]]["fields"]
    # No value in the journal, before or after.
    journal_text = json.dumps([e.as_json() for e in entries])
    assert not [v for sents in world.values() for s in sents for v in s.values if v in journal_text]


async def test_a_second_run_purges_nothing_and_appends_nothing(store: Store) -> None:
    now = now_ms()
    await _world(store, now)
    first = await purge_personal_data(store, DAYS, now=now)
    head = await store.read(journal.head)

    again = await purge_personal_data(store, DAYS, now=now + 3_600_000)

    assert first.action_ids and again.action_ids == [] and again.entries == []
    assert await store.read(journal.head) == head
    # The record for `depositd status` keeps the last run and the last one that purged.
    record = json.loads(await store.read(lambda db: get_meta(db, LAST_RUN) or "null"))
    assert record["purged"] == 0 and record["days"] == DAYS
    assert record["lastPurged"] == len(first.action_ids)


async def test_a_deposit_finishing_later_is_purged_by_the_run_once_it_is_due(
    store: Store,
) -> None:
    now = now_ms()
    world = await _world(store, now)
    await purge_personal_data(store, DAYS, now=now)

    # Two days on, the deposit that finished 29 days ago is due; the waiting ones are not.
    later = await purge_personal_data(store, DAYS, now=now + 2 * DAY_MS)

    assert later.action_ids == [s.action_id for s in world["completed_recent"]]
    entries = await store.read(lambda db: list(journal.entries(db)))
    assert journal.chain_problem(entries) is None
    named = [i for e in entries if e.kind == journal.PURGED for i in e.body["action_ids"]]
    assert sorted(named) == sorted(set(named))  # each row named once


async def test_a_large_backlog_is_purged_a_chunk_per_transaction(store: Store) -> None:
    now = now_ms()
    world = await _world(store, now)
    due = sorted(s.action_id for c in PURGED_CASES for s in world[c])
    commits = store.commits

    run = await purge_personal_data(store, DAYS, now=now, chunk=3)

    # The 6 submissions of finished deposits looked at 3 at a time: 3 transactions (and the
    # run's record), the first two appending the entry of the rows they purged.
    assert store.commits - commits >= 4
    entries = await store.read(lambda db: list(journal.entries(db)))
    purged = [e for e in entries if e.kind == journal.PURGED]
    assert [e.seq for e in purged] == run.entries and len(purged) == 2
    assert all(len(e.body["action_ids"]) <= 3 for e in purged)
    assert sorted(i for e in purged for i in e.body["action_ids"]) == due == run.action_ids
    assert journal.chain_problem(entries) is None


async def test_instances_on_one_database_purge_each_row_once(make_store: StoreMaker) -> None:
    """Two instances' runs at once (two stores on one database): each row is named by one
    PURGED entry only, and the chain holds."""
    first, second = make_store(), make_store()
    await first.open()
    await second.open()
    try:
        now = now_ms()
        world = await _world(first, now)
        due = sorted(s.action_id for c in PURGED_CASES for s in world[c])

        runs = await asyncio.gather(
            purge_personal_data(first, DAYS, now=now, chunk=2),
            purge_personal_data(second, DAYS, now=now, chunk=2),
        )

        assert sorted(runs[0].action_ids + runs[1].action_ids) == due
        entries = await first.read(lambda db: list(journal.entries(db)))
        assert journal.chain_problem(entries) is None
        named = [i for e in entries if e.kind == journal.PURGED for i in e.body["action_ids"]]
        assert sorted(named) == due
    finally:
        await second.close()
        await first.close()


async def test_one_instance_a_day_runs_it(store: Store) -> None:
    """The instance that takes the day's lease runs it; another, and the same one an hour
    later, do not."""
    now = now_ms()
    await _world(store, now)
    a, b = Retention(store, DAYS, "host-a:1:aa"), Retention(store, DAYS, "host-b:2:bb")

    ran = await a.run_if_due()

    assert ran is not None and ran.action_ids
    assert await b.run_if_due() is None
    assert await a.run_if_due() is None


async def test_status_says_when_retention_last_ran(tmp_path: Path) -> None:
    store = Store(tmp_path / "d.db")
    await store.open()
    try:
        now = now_ms()
        await _world(store, now)
        run = await purge_personal_data(store, DAYS, now=now)
    finally:
        await store.close()
    with contextlib.closing(connect(tmp_path / "d.db")) as conn:
        report = status_report(conn, False)
    shown = report["personalDataRetention"]
    assert shown["days"] == DAYS and shown["before"] == run.before
    assert shown["purged"] == shown["lastPurged"] == len(run.action_ids)


class _Stack(Stack):
    """A stack whose configuration sets `retention.personal_data_days` (unless None)."""

    def __init__(self, workdir: Path, *, personal_data_days: int | None, **kw: Any) -> None:
        super().__init__(workdir, **kw)
        self.personal_data_days = personal_data_days

    def _config_yaml(self) -> str:
        text = super()._config_yaml()
        if self.personal_data_days is None:
            return text
        return text + yaml.safe_dump({"retention": {"personal_data_days": self.personal_data_days}})


async def _tasks_up(stack: Stack) -> dict[str, float]:
    """The long-running tasks of the serve as its /metrics shows them (1: running)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{stack.worker_url}/metrics") as answer,
    ):
        text = await answer.text()
    up = {}
    for line in text.splitlines():
        if line.startswith("depositd_task_up{"):
            labels, _, value = line.rpartition(" ")
            up[labels.split('task="')[1].split('"')[0]] = float(value)
    return up


@pytest.mark.parametrize("days", [DAYS, None])
async def test_serve_purges_at_its_start_only_when_a_retention_is_set(
    make_store: StoreMaker, tmp_path: Path, days: int | None
) -> None:
    """A serve with `retention.personal_data_days` runs the day's purge as it starts (and shows
    the task in /metrics and the run in `status`); without the key nothing is ever removed."""
    store = make_store()
    await store.open()
    try:
        world = await _world(store, now_ms())
    finally:
        await store.close()
    due = sorted(s.action_id for c in PURGED_CASES for s in world[c])
    stack = _Stack(
        tmp_path / "stack",
        personal_data_days=days,
        storage=make_store.storage(),
        scheduler=False,
        notify=False,
    )
    async with stack:

        async def purged() -> list[int]:
            rows = await stack.store.read(every)
            return sorted(r["action_id"] for r in rows if r["purged_at"] is not None)

        async def running() -> bool:
            return (await _tasks_up(stack)).get("daily") == 1

        await until_async(running, "the serve's daily task")
        if days is not None:
            await until_async(lambda: _equal(purged(), due), "the purge at the start")
            assert (await _tasks_up(stack)).get("retention") == 1
            entries = await stack.store.read(lambda db: list(journal.entries(db)))
            assert journal.chain_problem(entries) is None
            assert [e.body["action_ids"] for e in entries if e.kind == journal.PURGED] == [due]
        else:
            assert "retention" not in await _tasks_up(stack)
            assert await purged() == []
            assert await stack.store.read(lambda db: get_meta(db, LAST_RUN)) is None
            texts = await _stored_text(stack.store)
            assert all(v in texts for sents in world.values() for s in sents for v in s.values)


async def _equal(value: Awaitable[Any], expected: Any) -> bool:
    return bool(await value == expected)
