"""The scheduler's leader: one instance at a time runs the jobs, another takes over."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time

from tests.support.waits import until
from worker.clock import utc_now
from worker.schedule.leader import Leader, lease_time
from worker.store.leases import SCHEDULER_LEASE, Lease, get_lease
from worker.store.sqlitestore import Store

TTL_S = 1.0


def leader(store: Store, name: str, jobs: list[str]) -> Leader:
    """A leader whose jobs are a record of starts and stops."""

    async def gain() -> None:
        jobs.append(f"{name} started")

    async def loss() -> None:
        jobs.append(f"{name} stopped")

    return Leader(store, name, TTL_S, on_gain=gain, on_loss=loss)


async def test_one_instance_leads_and_another_takes_over_once_it_is_gone(
    sqlite_store: Store,
) -> None:
    """The first instance leads; the second only once the first's lease lapsed; the first,
    back, learns it lost the lease and stops its jobs."""
    jobs: list[str] = []
    a, b = leader(sqlite_store, "a", jobs), leader(sqlite_store, "b", jobs)
    await a.tick()
    await b.tick()
    assert (a.leading, b.leading) == (True, False)
    assert jobs == ["a started"]
    await asyncio.sleep(TTL_S * 1.1)  # a stops renewing (hung, or dead)
    await b.tick()
    held = await b.holder()
    assert b.leading and held is not None and held.holder == "b"
    await a.tick()
    assert (a.leading, b.leading) == (False, True)
    assert jobs == ["a started", "b started", "a stopped"]


async def test_a_clean_stop_hands_the_lead_over_at_once(sqlite_store: Store) -> None:
    """A leader that stops gives its lease up: the other leads at its next try."""
    jobs: list[str] = []
    a, b = leader(sqlite_store, "a", jobs), leader(sqlite_store, "b", jobs)
    stop = asyncio.Event()
    await a.tick()
    running = asyncio.create_task(a.run(stop))
    await b.tick()
    assert not b.leading
    stop.set()
    await running
    await b.tick()
    assert b.leading
    assert jobs == ["a started", "a stopped", "b started"]


async def test_a_leader_that_cannot_renew_in_time_stops_its_jobs(sqlite_store: Store) -> None:
    """Renewal blocked (the store busy past three quarters of the lease): the jobs stop
    before the lease can lapse, so a new leader never runs beside them."""
    jobs: list[str] = []
    a = leader(sqlite_store, "a", jobs)
    await a.tick()
    await sqlite_store.close()  # every write now fails
    await asyncio.sleep(TTL_S * 0.8)
    await a.tick()
    assert not a.leading
    assert jobs == ["a started", "a stopped"]
    await sqlite_store.open()


async def test_a_live_leader_whose_lease_lapsed_holds_it_again_at_its_next_try(
    sqlite_store: Store,
) -> None:
    """The lease can lapse under a live leader: its renewals fail (the store unavailable, or
    slower than the lease's last quarter) for longer than the lease. It is not current from
    then until the first renewal the store takes: the leader's next try, within a quarter of
    the lease once the store answers again, when the leader runs its jobs again."""
    jobs: list[str] = []
    a = leader(sqlite_store, "a", jobs)
    stop = asyncio.Event()
    await a.tick()
    running = asyncio.create_task(a.run(stop))
    try:
        await until(lambda: jobs == ["a started"], "a to lead")
        await sqlite_store.close()  # every renewal fails from now on
        await until(lambda: jobs == ["a started", "a stopped"], "a to stop its jobs", 5)
        await until(lambda: not current(recorded(sqlite_store)), "the lease to lapse", 5)
        assert recorded(sqlite_store) is not None  # still a's: nobody else took it
        await sqlite_store.open()
        answering = time.monotonic()
        await until(lambda: a.leading, "a to lead again", 5)
        took = time.monotonic() - answering
        assert current(await a.holder())
        assert jobs == ["a started", "a stopped", "a started"]
        # One try every quarter of the lease; a busy machine may add a little to it.
        assert took < TTL_S / 4 + 1.0, took
    finally:
        stop.set()
        await running


def recorded(store: Store) -> Lease | None:
    """The scheduler's lease as the database holds it (read beside the store, closed or not)."""
    with contextlib.closing(sqlite3.connect(store.path)) as conn:
        return get_lease(conn, SCHEDULER_LEASE)


def current(lease: Lease | None) -> bool:
    """As `depositd status` says: the lease has not lapsed."""
    return lease is not None and lease.expires_at > utc_now()


def test_the_lease_is_at_most_the_shortest_interval() -> None:
    """The lead passes within two intervals of the shortest job, whatever `lease_s` says."""
    assert lease_time(60, [300, 30, 3600]) == 30
    assert lease_time(10, [300, 30]) == 10
    assert lease_time(60, [0.2]) == 1.0
