"""A webhook secret or API key that differs from the provider's: every delivery refused.

The provider signs each delivery with the webhook secret and names the API key; when either
differs from `webhook.secret` / `webhook.api_key`, every delivery is refused (`401`), while the
polls still find the deposits seconds later, so nothing else looks wrong until the provider
disables the endpoint. After `REFUSALS_IN_A_ROW` deliveries refused for their signature or API
key with none accepted in between, one critical alert names the two settings, and the meta row
`webhook_auth_refused` (shown by `depositd status` and the console's overview) holds the streak
until a delivery is accepted again (docs/operator.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

from worker.clock import utc_now
from worker.logs import get_logger
from worker.store.actions import queue_alert
from worker.store.db import Db
from worker.store.meta import WEBHOOK_AUTH_REFUSED, get_meta, set_meta
from worker.store.sqlitestore import Store

log = get_logger(__name__)

REFUSALS_IN_A_ROW = 5
META_KEY = WEBHOOK_AUTH_REFUSED
CONDITION = "webhook_auth_refused"
# Refusals that say the sender does not hold our secret or key (not a clock, size or body fault).
AUTH_REASONS = ("bad_signature", "unknown_api_key")


def alert_detail(refused: int, since: str) -> str:
    """The alert's text: what happened and the settings to compare; never a secret."""
    return (
        f"{refused} webhook deliveries in a row refused for their signature or API key, none"
        f" accepted since {since}: compare webhook.secret and webhook.api_key with the"
        " provider's dashboard. Deposits are still found by the polls, but the provider may"
        " disable the endpoint."
    )


def _record(db: Db, refused: int, since: str) -> bool:
    """Store the streak; queue the alert unless this streak alerted already. True: alerted."""
    stored = get_meta(db, META_KEY)
    streak = json.loads(stored) if stored else None
    first = streak is None
    if first:
        streak = {"since": since, "alertedAt": utc_now()}
        queue_alert(
            db,
            transaction_id=None,
            condition=CONDITION,
            severity="critical",
            trigger="system",
            detail=alert_detail(refused, since),
        )
    assert streak is not None
    streak["refused"] = max(refused, int(streak.get("refused", 0)))
    set_meta(db, META_KEY, json.dumps(streak, sort_keys=True))
    return first


def _clear(db: Db) -> None:
    if get_meta(db, META_KEY):
        set_meta(db, META_KEY, "")


class SecretWatch:
    """Counts the refusals of `AUTH_REASONS` since the last accepted delivery."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.wake: Callable[[], None] = lambda: None  # the outbox, once it runs
        self._refused = 0
        self._since: str | None = None
        self._recorded = 0  # refusals of this streak written to the store
        self._clear_needed = True  # a streak may be stored from before this process
        self._tasks: set[asyncio.Future[None]] = set()

    def refused(self, counts: Mapping[str, int]) -> None:
        """Deliveries refused, by reason."""
        n = sum(counts.get(reason, 0) for reason in AUTH_REASONS)
        if n == 0:
            return
        if self._since is None:
            self._since = utc_now()
        self._refused += n
        # Written at the threshold, then at each further threshold's worth (not every refusal).
        if self._refused >= self._recorded + REFUSALS_IN_A_ROW:
            self._recorded = self._refused
            self._start(self._write(self._refused, self._since))

    def accepted(self) -> None:
        """A delivery passed its signature: the streak ends."""
        stored = self._recorded > 0 or self._clear_needed
        self._refused, self._since, self._recorded = 0, None, 0
        if stored and self.store.is_open:
            self._clear_needed = False
            self._start(self.store.write(_clear))

    async def _write(self, refused: int, since: str) -> None:
        if not self.store.is_open:
            return
        if await self.store.write(lambda db: _record(db, refused, since)):
            log.error(
                "webhook deliveries refused in a row; compare webhook.secret and"
                " webhook.api_key with the provider's dashboard",
                refused=refused,
                since=since,
            )
            self.wake()

    def _start(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("webhook refusal streak not recorded", error=str(task.exception()))
