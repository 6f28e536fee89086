"""Which deposits' transaction detail the detail poll reads in a run (docs/polling.md).

- A deposit waiting on a person (`needs_details`, `rejected`) that the last read of the work
  queues listed is seen by that read itself: the combined reading of a queued deposit is
  PENDING, so its detail has nothing more to tell. It is not read while it stays listed. One
  that the queues no longer list (its details were sent on the hosted page, its webhooks were
  lost) is read at the next detail run.
- Every other deposit that is not final (submitted and under review, credited and sweeping,
  processing) is read every `detail_interval_s` while young, then less often as it ages with no
  new fact: the wait doubles each time its age doubles past `detail_young_s`, up to
  `detail_max_interval_s`. Any new fact makes it young again.
- A queue listing older than `LISTING_STALE_RUNS` history intervals (the history poll keeps
  failing) is not trusted: the waiting deposits then get the schedule of the others.

The plan lives in memory: after a start (or a new leader) every deposit in motion is read once
at its first run, as before, and waiting ones are left to the first queue read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from worker.config.settings import SchedulerSettings
from worker.track.tracker import State

WAITING = frozenset({State.NEEDS_DETAILS.value, State.REJECTED.value})
# A queue listing is trusted for this many history intervals after it was taken.
LISTING_STALE_RUNS = 3


def detail_wait_ms(age_ms: int, settings: SchedulerSettings) -> int:
    """How long after its last read a deposit with no new fact for `age_ms` is read again."""
    base = settings.detail_interval_s * 1000
    young = settings.detail_young_s * 1000
    cap = max(base, settings.detail_max_interval_s * 1000)
    wait = base
    threshold = young
    # Doubling: twice the interval from `young` on, four times from twice `young`, ...
    while young > 0 and age_ms >= threshold and wait < cap:
        wait *= 2
        threshold *= 2
    return int(min(wait, cap))


@dataclass(frozen=True)
class Listing:
    """What one read of the work queues saw: when it started and ended, the deposits it listed."""

    started_ms: int
    ended_ms: int
    ids: frozenset[str]
    initial: bool = False  # no read yet since the poller started: every waiting deposit waits


class DetailPlan:
    """The detail poll's memory: the last queue listing and when each deposit was last read."""

    def __init__(self, settings: SchedulerSettings, started_ms: int) -> None:
        self._settings = settings
        self._listing = Listing(started_ms, started_ms, frozenset(), initial=True)
        self._last_read: dict[str, int] = {}
        self._held: set[str] = set()  # waiting deposits left to the queue reads at the last run

    def listed(self, listing: Listing) -> None:
        """A read of the work queues ended (complete or cut short: what it listed is listed)."""
        self._listing = listing

    def read(self, transaction_id: str, now_ms: int) -> None:
        """The deposit's detail was read (or tried) now."""
        self._last_read[transaction_id] = now_ms

    def last_read(self, transaction_id: str) -> int | None:
        """When the deposit's detail was last read in this process (None: never)."""
        return self._last_read.get(transaction_id)

    def _trusted(self, now_ms: int) -> bool:
        stale_ms = LISTING_STALE_RUNS * self._settings.history_interval_s * 1000
        return now_ms - self._listing.ended_ms <= stale_ms

    def left_to_queues(self, transaction_id: str, state: str, updated_ms: int, now_ms: int) -> bool:
        """True when the queue reads show this waiting deposit, so its detail is not read."""
        if state not in WAITING or not self._trusted(now_ms):
            return False
        listing = self._listing
        # New since the listing began (a webhook announced it): the next queue read lists it.
        return listing.initial or transaction_id in listing.ids or updated_ms >= listing.started_ms

    def due(self, rows: Iterable[tuple[str, str, int]], now_ms: int) -> list[str]:
        """The transactionIds (of `rows`: id, state, last change in ms) whose detail is due;
        forgets the deposits no longer among `rows` (final now, or gone)."""
        rows = list(rows)
        tracked = {tx for tx, _, _ in rows}
        for tx in [t for t in self._last_read if t not in tracked]:
            del self._last_read[tx]
        s = self._settings
        # A run reaches a deposit about as far into the run as the last one did: half an
        # interval's slack keeps "due 0.2 s after this run started" from waiting a whole run.
        slack = s.detail_interval_s * 500
        held: set[str] = set()
        due: list[str] = []
        for tx, state, updated_ms in rows:
            if self.left_to_queues(tx, state, updated_ms, now_ms):
                held.add(tx)
                continue
            last = self._last_read.get(tx)
            if last is None or tx in self._held:
                due.append(tx)  # never read, or it just left the queues: read it now
            elif now_ms - last + slack >= detail_wait_ms(max(0, now_ms - updated_ms), s):
                due.append(tx)
        self._held = held
        return due
