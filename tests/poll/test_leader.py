"""The scheduler's leader: one instance at a time runs the jobs, another takes over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from worker.poll.leader import Leader, lease_time
from worker.store.writer import Store

TTL_S = 1.0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = Store(tmp_path / "d.db")
    await s.open()
    yield s
    await s.close()


def leader(store: Store, name: str, jobs: list[str]) -> Leader:
    """A leader whose jobs are a record of starts and stops."""

    async def gain() -> None:
        jobs.append(f"{name} started")

    async def loss() -> None:
        jobs.append(f"{name} stopped")

    return Leader(store, name, TTL_S, on_gain=gain, on_loss=loss)


async def test_one_instance_leads_and_another_takes_over_once_it_is_gone(store: Store) -> None:
    """The first instance leads; the second only once the first's lease lapsed; the first,
    back, learns it lost the lease and stops its jobs."""
    jobs: list[str] = []
    a, b = leader(store, "a", jobs), leader(store, "b", jobs)
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


async def test_a_clean_stop_hands_the_lead_over_at_once(store: Store) -> None:
    """A leader that stops gives its lease up: the other leads at its next try."""
    jobs: list[str] = []
    a, b = leader(store, "a", jobs), leader(store, "b", jobs)
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


async def test_a_leader_that_cannot_renew_in_time_stops_its_jobs(store: Store) -> None:
    """Renewal blocked (the store busy past three quarters of the lease): the jobs stop
    before the lease can lapse, so a new leader never runs beside them."""
    jobs: list[str] = []
    a = leader(store, "a", jobs)
    await a.tick()
    await store.close()  # every write now fails
    await asyncio.sleep(TTL_S * 0.8)
    await a.tick()
    assert not a.leading
    assert jobs == ["a started", "a stopped"]
    await store.open()


def test_the_lease_is_at_most_the_shortest_interval() -> None:
    """The lead passes within two intervals of the shortest job, whatever `lease_s` says."""
    assert lease_time(60, [300, 30, 3600]) == 30
    assert lease_time(10, [300, 30]) == 10
    assert lease_time(60, [0.2]) == 1.0
