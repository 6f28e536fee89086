"""Signed webhook delivery with retries, in order per referenceId.

Each referenceId (a transactionId or a source address id) has its own queue and its own task:
a later event of one deposit waits until every earlier one was accepted (HTTP 200), while other
deposits' events are not held up. A failed attempt (non-200, timeout, connection error) is
retried with exponential back-off, without limit. `drop(n)` makes the next n events vanish
(simulated loss: never delivered), which is how tests show that the poller finds them anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import aiohttp
from yarl import URL

from worker.clock import now_ms
from worker.dev.sandbox.config import SandboxConfig
from worker.dev.sandbox.records import Event
from worker.logs import get_logger
from worker.provider import jsonio
from worker.provider.signing import signed_headers

log = get_logger(__name__)

HISTORY_LIMIT = 1000


@dataclass
class Delivery:
    """One webhook and what happened to it: pending, delivered, dropped or unsent (no URL)."""

    envelope: dict[str, Any]
    state: str = "pending"
    attempts: int = 0
    last_error: str | None = None

    @property
    def reference_id(self) -> str:
        """The envelope's referenceId (the ordering key)."""
        return str(self.envelope["referenceId"])

    def doc(self) -> dict[str, Any]:
        """A JSON-ready summary (with the envelope) for the state view and persistence."""
        return {
            "eventId": self.envelope["eventId"],
            "eventType": self.envelope["eventType"],
            "referenceId": self.reference_id,
            "state": self.state,
            "attempts": self.attempts,
            "lastError": self.last_error,
            "envelope": self.envelope,
        }


def envelope(event: Event, now: int | None = None) -> dict[str, Any]:
    """The webhook envelope of an event, with a fresh eventId."""
    return {
        "eventId": str(uuid.uuid4()),
        "eventType": event.event_type,
        "referenceId": event.reference_id,
        "status": event.status,
        "timestamp": now_ms() if now is None else now,
        "data": event.data,
    }


def _amount_back(env: dict[str, Any]) -> dict[str, Any]:
    """A stored envelope as it was queued: the state file keeps decimals as strings, while the
    webhook carries `data.amount` as a number."""
    data = env.get("data")
    if isinstance(data, dict) and isinstance(data.get("amount"), str):
        return {**env, "data": {**data, "amount": Decimal(data["amount"])}}
    return env


class Deliverer:
    """Delivers envelopes to the configured webhook URL; `on_change` runs after each outcome."""

    def __init__(
        self,
        cfg: SandboxConfig,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.cfg = cfg
        self.on_change = on_change
        self._clock = clock
        self.history: deque[Delivery] = deque(maxlen=HISTORY_LIMIT)
        self._queues: dict[str, deque[Delivery]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._drop = 0
        self._session: aiohttp.ClientSession | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    # --- queueing -----------------------------------------------------------------------------

    def enqueue(self, env: dict[str, Any]) -> Delivery:
        """Queue one envelope (or drop it when a drop is owed, or keep it unsent without a URL)."""
        delivery = Delivery(env)
        self.history.append(delivery)
        if self._drop > 0:
            self._drop -= 1
            delivery.state = "dropped"
            log.info("webhook dropped", event_id=env["eventId"], event_type=env["eventType"])
            return delivery
        if not self.cfg.webhook_url:
            delivery.state = "unsent"
            return delivery
        self._queues.setdefault(delivery.reference_id, deque()).append(delivery)
        self._idle.clear()
        self._kick(delivery.reference_id)
        return delivery

    def drop(self, count: int) -> None:
        """Drop the next `count` events silently."""
        self._drop += max(0, count)

    @property
    def drops_owed(self) -> int:
        """How many upcoming events will still be dropped."""
        return self._drop

    def pending(self) -> list[Delivery]:
        """Deliveries not yet accepted, per referenceId in order."""
        return [d for queue in self._queues.values() for d in queue]

    def restore(self, docs: list[dict[str, Any]], drops_owed: int = 0) -> None:
        """Put back what `pending()` held before a restart (delivery starts with `start`)."""
        self._drop = drops_owed
        for doc in docs:
            delivery = Delivery(_amount_back(doc["envelope"]), attempts=int(doc.get("attempts", 0)))
            self.history.append(delivery)
            self._queues.setdefault(delivery.reference_id, deque()).append(delivery)
            self._idle.clear()

    async def idle(self) -> None:
        """Wait until nothing is pending."""
        await self._idle.wait()

    # --- running ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the HTTP session and deliver whatever is already queued."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.cfg.delivery_timeout_s)
        )
        for reference_id in list(self._queues):
            self._kick(reference_id)

    async def stop(self) -> None:
        """Cancel delivery tasks (pending deliveries stay queued) and close the session."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _kick(self, reference_id: str) -> None:
        if self._session is None or reference_id in self._tasks:
            return
        self._tasks[reference_id] = asyncio.create_task(self._drain(reference_id))

    def backoff(self, attempts: int) -> float:
        """Seconds to wait after the `attempts`-th failed attempt."""
        delay = self.cfg.delivery_retry_base_s * 2 ** max(0, attempts - 1)
        return float(min(delay, self.cfg.delivery_retry_max_s))

    async def _drain(self, reference_id: str) -> None:
        queue = self._queues[reference_id]
        try:
            while queue:
                delivery = queue[0]
                if await self._attempt(delivery):
                    delivery.state = "delivered"
                    queue.popleft()
                    self.on_change()
                else:
                    await asyncio.sleep(self.backoff(delivery.attempts))
        finally:
            self._tasks.pop(reference_id, None)
        del self._queues[reference_id]
        if not self._queues:
            self._idle.set()

    async def _attempt(self, delivery: Delivery) -> bool:
        assert self._session is not None and self.cfg.webhook_url
        url = URL(self.cfg.webhook_url)
        body = jsonio.dumpb(delivery.envelope, decimals_as_numbers=True)
        headers = signed_headers(
            self.cfg.webhook_api_key,
            self.cfg.webhook_secret,
            "POST",
            url.raw_path_qs,
            body,
            scheme=self.cfg.webhook_signature,
            # Signed by the provider's own clock, as a provider's delivery is.
            timestamp_ms=self._clock(),
        )
        headers["Content-Type"] = "application/json"
        delivery.attempts += 1
        try:
            async with self._session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                ok = resp.status == 200
                delivery.last_error = None if ok else f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            ok = False
            delivery.last_error = type(exc).__name__
        log.info(
            "webhook delivered" if ok else "webhook delivery failed",
            event_id=delivery.envelope["eventId"],
            event_type=delivery.envelope["eventType"],
            attempt=delivery.attempts,
            error=delivery.last_error,
        )
        return ok
