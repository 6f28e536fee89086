"""The database's unavailability told in a few log lines (docs/operations.md, "When the database
is unavailable").

The store reports each group transaction that failed (`failed`) and each that committed
(`recovered`). The first failure opens an outage, logged once with what the instance does
meanwhile; the loops that find the database gone meanwhile (processing, the outbox, the
scheduler's lease) report it here (`note`) instead of logging a line each time; the first
commit closes it with one line: how long it lasted and what failed meanwhile, counted. An outage
that lasts `alert_after_s` is logged once more and handed to the `on_long` callbacks (the
service sends an alert through its channels directly: the database that would queue it is
what is missing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from worker.clock import utc_now
from worker.logs import get_logger

log = get_logger(__name__)

REFUSED = "deliveriesRefused"  # deliveries answered 503 (`failed(..., refused=n)`)
ROUNDS = "transactionsFailed"  # group transactions that did not commit
DEFAULT_ALERT_AFTER_S = 60.0


class Outage:
    """Whether the database is unavailable to this instance now, since when, and what failed."""

    def __init__(
        self,
        where: str,
        *,
        alert_after_s: float = DEFAULT_ALERT_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.where = where
        self.servers: str | None = None  # PostgreSQL: the servers the URL names, host:port each
        self.alert_after_s = alert_after_s
        self._clock = clock
        self.since: str | None = None  # UTC, while unavailable
        self._started = 0.0
        self.counts: dict[str, int] = {}
        self.on_long: list[Callable[[str, float, str], None]] = []  # (since, seconds, error)
        self._first_error = ""
        self._long: asyncio.TimerHandle | None = None

    @property
    def active(self) -> bool:
        """True from the first failed transaction until the next one commits."""
        return self.since is not None

    def failed(self, error: str, *, refused: int = 0) -> None:
        """A group transaction did not commit (`refused`: the deliveries in it, answered 503)."""
        if self.since is None:
            self.since = utc_now()
            self._started = self._clock()
            self._first_error = error
            self.counts = {}
            log.error(
                "database unavailable: deliveries answered 503 until it is back; processing,"
                " actions and the scheduler wait",
                database=self.where,
                **({"servers": self.servers} if self.servers else {}),
                error=error,
            )
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                self._long = loop.call_later(self.alert_after_s, self._lasting)
        self._count(ROUNDS)
        if refused:
            self._count(REFUSED, refused)

    def note(self, what: str) -> bool:
        """A loop's failure (`what`: the count's name, e.g. `processingFailed`): counted, and
        True while the outage is open (the caller logs nothing); False otherwise (the caller
        logs it as usual)."""
        if self.since is None:
            return False
        self._count(what)
        return True

    def recovered(self) -> None:
        """A group transaction committed: an open outage ends, in one line."""
        if self.since is None:
            return
        seconds = round(self._clock() - self._started, 1)
        since, counts = self.since, dict(self.counts)
        self.since = None
        if self._long is not None:
            self._long.cancel()
            self._long = None
        log.warning(
            "database available again: deliveries stored, processing, actions and the"
            " scheduler resumed",
            database=self.where,
            since=since,
            seconds=seconds,
            **counts,
        )

    def stop(self) -> None:
        """The store closes: no `database still unavailable` line or alert after it."""
        if self._long is not None:
            self._long.cancel()
            self._long = None

    def _count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def _lasting(self) -> None:
        self._long = None
        if self.since is None:
            return
        seconds = round(self._clock() - self._started, 1)
        log.error(
            "database still unavailable",
            database=self.where,
            since=self.since,
            seconds=seconds,
            error=self._first_error,
            **self.counts,
        )
        for callback in self.on_long:
            try:
                callback(self.since, seconds, self._first_error)
            except Exception:  # one callback's bug must not cost the others
                log.exception("outage alert failed")
