"""The daily removal of personal data (docs/audit.md, "Retention of personal data").

With `retention.personal_data_days` set, every instance looks once an hour whether the day's
run is due: the one that takes the `retention` lease (free, or lapsed after a day) runs it, so
among instances sharing a database it runs once a day. A run removes the payer values of the
submissions whose deposit finished more than that many days ago, a chunk per write
transaction (`worker.store.retention.purge_chunk`) so that a large backlog never holds the
write lock long, each chunk with the PURGED journal entry naming its rows; then it empties
SQLite's WAL, which still holds the pages as they were before, and records the run for
`depositd status`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

from worker.clock import iso_from_ms, now_ms, utc_now
from worker.errors import StorageError
from worker.logs import get_logger
from worker.store import journal
from worker.store.db import Db
from worker.store.leases import acquire, get_lease, release
from worker.store.retention import cutoff, entries_naming, purge_chunk, record_run
from worker.store.sqlitestore import Store

log = get_logger(__name__)

LEASE = "retention"  # held for a day by the instance that ran the day's purge
CHECK_S = 3600.0  # how often an instance looks whether the day's run is due
# The lease lapses a little before a day has passed, so that the hourly look finds it free
# about a day after the last run (not an hour later).
LEASE_MS = int(timedelta(hours=23, minutes=30).total_seconds() * 1000)
CHUNK = 500  # submissions looked at per write transaction


@dataclass(frozen=True)
class PurgeRun:
    """What one run did: the cutoff, the days, the action ids purged and the journal entries
    appended (their seqs)."""

    before: str
    days: int
    action_ids: list[int]
    entries: list[int]
    wal_emptied: bool


async def purge_personal_data(
    store: Store, days: int, *, now: int | None = None, chunk: int = CHUNK
) -> PurgeRun:
    """Remove the payer values of every submission whose deposit finished more than `days`
    days before `now` (epoch ms; the clock's when None), a chunk per transaction."""
    before = cutoff(now_ms() if now is None else now, days)
    start = await store.read(journal.head)
    after, purged = 0, []
    while True:
        done = await store.write(
            partial(purge_chunk, before=before, days=days, after=after, limit=chunk)
        )
        purged += done.purged
        if not done.more:
            break
        after = done.last
    entries: list[int] = []
    if purged:
        entries = await store.read(
            partial(entries_naming, after=start.seq if start else 0, action_ids=purged)
        )
    emptied = await _empty_wal(store)
    await store.write(
        partial(record_run, ran_at=utc_now(), days=days, before=before, purged=len(purged))
    )
    return PurgeRun(before, days, purged, entries, emptied)


async def _empty_wal(store: Store, tries: int = 3, pause_s: float = 5.0) -> bool:
    """Empty the WAL (`Store.empty_wal`), a few tries while reads and writes keep it busy: at
    every run, so that one left busy is emptied the next day."""
    for attempt in range(tries):
        if await store.empty_wal():
            return True
        if attempt + 1 < tries:
            await asyncio.sleep(pause_s)
    return False


def _take_day(db: Db, *, holder: str, now: int) -> bool:
    """Take the `retention` lease for a day unless someone (this instance too) holds it."""
    lease = get_lease(db, LEASE)
    at = iso_from_ms(now)
    if lease is not None and lease.expires_at >= at:
        return False
    return acquire(db, LEASE, holder, now=at, until=iso_from_ms(now + LEASE_MS)).holder == holder


class Retention:
    """The hourly look of one instance, and the day's run when it is this instance's."""

    def __init__(self, store: Store, days: int, instance: str, *, check_s: float = CHECK_S):
        self.store = store
        self.days = days
        self.instance = instance
        self.check_s = check_s

    async def run_if_due(self) -> PurgeRun | None:
        """The day's run if no instance ran it in the last day (this one runs it now); None
        when it is not due here."""
        now = now_ms()
        if not await self.store.write(partial(_take_day, holder=self.instance, now=now)):
            return None
        try:
            run = await purge_personal_data(self.store, self.days, now=now)
        except StorageError:
            # The next look (this instance's or another's) tries again, not tomorrow's.
            with contextlib.suppress(StorageError):
                await self.store.write(partial(release, name=LEASE, holder=self.instance))
            raise
        log.info(
            "personal data retention",
            days=run.days,
            before=run.before,
            purged=len(run.action_ids),
            journalEntries=run.entries,
        )
        if not run.wal_emptied:
            log.warning(
                "personal data retention: the WAL was busy and is emptied by a later run;"
                " until then it may still hold removed values"
            )
        return run

    async def run(self, stop: asyncio.Event) -> None:
        """Look once every `check_s` until `stop`; a database error waits for the next look."""
        while not stop.is_set():
            try:
                await self.run_if_due()
            except StorageError as exc:
                log.error("personal data retention failed", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.check_s)
