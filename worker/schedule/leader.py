"""One instance at a time runs the scheduler's jobs: the holder of the `scheduler` lease.

Every instance runs a `Leader`: every quarter of the lease's time it tries to take or renew the
lease (`worker.store.leases.acquire`, one statement only one instance can win). The holder starts
the jobs (`on_gain`); an instance that learns it lost the lease, or that could not renew it
before three quarters of its time had passed, stops them (`on_loss`, cancelling a run in flight)
before the lease can lapse, so another instance that takes it over never polls beside it. A
clean stop gives the lease up at once. When the holder dies, its lease lapses after `ttl_s` and
another instance takes it at its next try: within `ttl_s * 1.25`, which `serve` keeps within two
of the shortest job interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from worker.aio import first_done
from worker.clock import iso_from_ms, now_ms
from worker.errors import StorageError
from worker.logs import get_logger
from worker.store.db import Db
from worker.store.leases import SCHEDULER_LEASE, Lease, acquire, get_lease, release
from worker.store.sqlitestore import Store

log = get_logger(__name__)

STOPPING = "stopping"  # why a lease is handed back at a stop


def lease_time(lease_s: float, intervals: list[float]) -> float:
    """The scheduler lease's time: `instance.lease_s`, at most the shortest job interval (so a
    dead leader's jobs are taken over within two intervals), at least a second."""
    return max(1.0, min([lease_s, *intervals]))


class Leader:
    """Holds (or waits for) one lease and starts or stops what only its holder runs."""

    def __init__(
        self,
        store: Store,
        instance: str,
        ttl_s: float,
        *,
        on_gain: Callable[[], Awaitable[None]],
        on_loss: Callable[[], Awaitable[None]],
        name: str = SCHEDULER_LEASE,
    ) -> None:
        self._store = store
        self.instance = instance
        self.ttl_s = ttl_s
        self.name = name
        self._on_gain = on_gain
        self._on_loss = on_loss
        self.leading = False
        self.lease: Lease | None = None  # as last read
        self._valid_until = 0.0  # monotonic time by which the jobs stop unless renewed

    async def run(self, stop: asyncio.Event) -> None:
        """Try for the lease until `stop` (the first try is the caller's `tick`); then stop
        the jobs and give the lease up."""
        try:
            while not stop.is_set():
                wait_s = self.ttl_s / 4
                if self.leading:
                    wait_s = max(0.0, min(wait_s, self._valid_until - time.monotonic()))
                await first_done(stop.wait(), at_most_s=wait_s)
                if not stop.is_set():
                    await self.tick()
        finally:
            await self._lose(STOPPING)
            try:
                await self._store.write(lambda db: release(db, self.name, self.instance))
            except StorageError as exc:  # it lapses by itself
                log.warning("lease not released", lease=self.name, error=str(exc))

    async def tick(self) -> None:
        """Take or renew the lease once; start or stop the jobs as the outcome says."""
        sent = time.monotonic()
        start_ms = now_ms()

        def take(db: Db) -> Lease:
            return acquire(
                db,
                self.name,
                self.instance,
                now=iso_from_ms(start_ms),
                until=iso_from_ms(start_ms + round(self.ttl_s * 1000)),
            )

        budget = self._valid_until - sent if self.leading else self.ttl_s / 2
        try:
            lease = await asyncio.wait_for(self._store.write(take), max(0.05, budget))
        except (StorageError, TimeoutError) as exc:
            if not self._store.outage.note("leaseRenewalsFailed"):  # counted in the outage
                log.warning("lease not renewed", lease=self.name, error=str(exc) or "timeout")
            if self.leading and time.monotonic() >= self._valid_until:
                await self._lose("lease not renewed in time")
            return
        self.lease = lease
        if lease.holder == self.instance:
            self._valid_until = sent + self.ttl_s * 0.75
            if not self.leading:
                self.leading = True
                log.info("leading", lease=self.name, instance=self.instance)
                await self._on_gain()
        elif self.leading:
            await self._lose(f"taken by {lease.holder}")

    async def _lose(self, why: str) -> None:
        if not self.leading:
            return
        self.leading = False
        # Handing the lease back at a stop is the plan, not a problem: a clean stop logs no
        # warning (docs/operator.md); a lease lost or taken over is one.
        level = log.info if why == STOPPING else log.warning
        level("no longer leading", lease=self.name, instance=self.instance, why=why)
        await self._on_loss()

    async def holder(self) -> Lease | None:
        """The lease as recorded now (for `/metrics` and readiness)."""
        return await self._store.read(lambda db: get_lease(db, self.name))
