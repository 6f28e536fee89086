"""One request budget for everything that polls the provider (docs/polling.md).

The provider publishes no rate limit. Every read a poll makes (history, detail, blocked,
abnormal funds, catch-up, sweep, reconciliation) takes a token from one bucket refilled at
`provider.max_requests_per_s`, one second's worth deep, and waits for one when it is empty;
the polls wait in turn (first come, first served). Submissions and operator reads are not held:
they take their token at once, even into debt, so they go first and the polls after them wait
for what they used; the debt is capped at `MAX_DEBT_S` seconds' worth of tokens, so a burst of
submissions holds the polls that long at most.

A rate-limit answer (`ProviderRateLimited`: 429, or a 5xx naming a rate limit) backs off every
poll provider-wide: for its Retry-After when it gives one (at most `MAX_BACKOFF_S`), else for
`DEFAULT_BACKOFF_S`, doubling while such answers follow one another.

Which calls are polls is said by the client they are made through: the polls are given the
provider client's polls' view (`Transport.for_polls()`), which shares the session and this
budget with the client everything else uses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

__all__ = ["MAX_DEBT_S", "RequestBudget", "parse_retry_after"]

# A Retry-After above this is taken as this (a wrong header must not stop the polls for days).
MAX_BACKOFF_S = 3600.0
# A rate-limit answer without Retry-After: back off this long, doubling while they follow.
DEFAULT_BACKOFF_S = 5.0
# The debt calls that are not held may leave: at most this many seconds of refill. Beyond it a
# burst of submissions no longer delays the polls (the provider's own 429 still backs them off).
MAX_DEBT_S = 10.0


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After in seconds (delta-seconds or an HTTP date); None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        # ASCII digits only: str.isdigit also takes "²", which float() refuses.
        return float(text) if text.isascii() else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class RequestBudget:
    """A token bucket with a provider-wide back-off, shared by every poll of one process."""

    def __init__(
        self,
        rate_per_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_wait: Callable[[str, float], None] | None = None,
    ) -> None:
        if rate_per_s <= 0:
            raise ValueError("rate_per_s must be above 0")
        self.rate = rate_per_s
        self.burst = max(1.0, rate_per_s)
        self._clock = clock
        self._sleep = sleep
        self._on_wait = on_wait
        self._tokens = self.burst
        self._at = clock()
        self._until = 0.0
        self._limited = 0  # rate-limit answers without Retry-After in a row
        self._lock = asyncio.Lock()
        self.waited_s = 0.0
        self._waiting: set[asyncio.Task[Any]] = set()  # the polls in `acquire`
        self._stopped = False

    def _refill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def spend(self) -> None:
        """A call that is not held (a submission, an operator read) takes its token now, the
        debt it leaves capped at `MAX_DEBT_S` seconds of refill."""
        self._refill(self._clock())
        self._tokens = max(-MAX_DEBT_S * self.rate, self._tokens - 1)

    def stop_polls(self) -> None:
        """The service stops: each poll waiting here is cancelled at once, and so is a poll
        that asks for a token from now on. Nothing of theirs is in flight (they wait before
        sending), and a poll cancelled is read again after the restart; a stop no longer
        waits for the debt the submissions left (up to `MAX_DEBT_S`) or for a back-off."""
        self._stopped = True
        for task in list(self._waiting):
            task.cancel()

    async def acquire(self, endpoint: str) -> float:
        """Wait for a token (and for the back-off to end); returns the seconds waited, the
        polls ahead of this one in the queue included. Cancelled once `stop_polls` is called."""
        task = asyncio.current_task()
        if self._stopped and task is not None:
            task.cancel()
            await asyncio.sleep(0)  # raises CancelledError here
        start = self._clock()
        if task is not None:
            self._waiting.add(task)
        try:
            async with self._lock:
                while True:
                    now = self._clock()
                    self._refill(now)
                    wait = self._until - now
                    if wait <= 0:
                        if self._tokens >= 1:
                            self._tokens -= 1
                            break
                        wait = (1 - self._tokens) / self.rate
                    await self._sleep(wait)
                waited = self._clock() - start
        finally:
            self._waiting.discard(task)
        if waited > 0:
            self.waited_s += waited
            if self._on_wait is not None:
                self._on_wait(endpoint, waited)
        return waited

    def back_off(self, retry_after_s: float | None) -> float:
        """A rate-limit answer: hold every poll this long (see the module); returns it."""
        if retry_after_s is None:
            self._limited += 1
            delay = DEFAULT_BACKOFF_S * 2.0 ** min(self._limited - 1, 20)
        else:
            delay = retry_after_s
        delay = min(MAX_BACKOFF_S, max(0.0, delay))
        self._until = max(self._until, self._clock() + delay)
        return delay

    def answered(self) -> None:
        """An answer that was no rate limit: the doubling starts again from the default."""
        self._limited = 0

    def backoff_remaining(self) -> float:
        """Seconds left of the provider-wide back-off (0: none)."""
        return max(0.0, self._until - self._clock())
