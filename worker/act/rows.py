"""The actions table as a running row writes it: the row's outcome and the alerts it queues.

`ActionRows` records an action row's outcome (done, failed, skipped, or pending again after a
back-off) for `worker.act.outbox.Outbox` and the modules that run each kind of row
(`worker.act.submit`, `worker.act.alert`, `worker.act.forward`), so those modules do not import the
runner. `alert_once` queues an alert row from a submission or a forward (unless the same one is
queued already), in the write that records its outcome.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import sqlite_utils

from worker import clock
from worker.act.reactor import enqueue_alert
from worker.clock import iso_from_ms, utc_now
from worker.logs import get_logger
from worker.store.writer import Store
from worker.track.tracker import Deposit

log = get_logger(__name__)


def backoff(attempts: int, base_s: float, max_s: float) -> float:
    """The back-off after `attempts` tries: doubling from `base_s`, at most `max_s`. The
    exponent is capped: a row retried without end (an unknown outcome) must not overflow a
    float after ~1000 attempts."""
    return min(max_s, base_s * 2.0 ** min(max(0, attempts - 1), 40))


def _iso_in(seconds: float) -> str:
    return iso_from_ms(clock.now_ms() + round(seconds * 1000))


class ActionRows:
    """Records action rows' outcomes; a retried row is due again after an exponential back-off."""

    def __init__(self, store: Store, *, backoff_s: float, backoff_max_s: float) -> None:
        self._store = store
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s

    def _delay(self, attempts: int) -> float:
        step = backoff(attempts, self._backoff_s, self._backoff_max_s)
        return step * (0.5 + random.random() / 2)

    async def finish(
        self,
        action_id: int,
        status: str,
        outcome: str,
        *,
        retry_in: float | None = None,
        also: Callable[[sqlite_utils.Database], object] | None = None,
        key: str | None = None,
    ) -> None:
        """Record the row's status and outcome; `also` runs in the same write."""

        def fn(db: sqlite_utils.Database) -> None:
            sets = "status=?, outcome=?, updated_at=?, next_attempt_at=?"
            args: list[Any] = [status, outcome, utc_now(), _iso_in(retry_in or 0)]
            if key is not None:
                sets += ", idempotency_key=?"
                args.append(key)
            db.execute(f"UPDATE actions SET {sets} WHERE id=?", [*args, action_id])
            if also is not None:
                also(db)

        await self._store.write(fn)
        log.info("action", actionId=action_id, status=status, outcome=outcome)

    async def write(self, fn: Callable[[sqlite_utils.Database], object]) -> None:
        """Run `fn` in a write of its own (an alert about the row's deposit)."""
        await self._store.write(fn)

    async def later(
        self,
        action_id: int,
        attempts: int,
        outcome: str,
        *,
        key: str | None = None,
        also: Callable[[sqlite_utils.Database], object] | None = None,
    ) -> None:
        """Back to pending, due again after this attempt's back-off."""
        await self.finish(
            action_id, "pending", outcome, retry_in=self._delay(attempts), key=key, also=also
        )


def alert_once(
    deposit: Deposit | None,
    condition: str,
    severity: str,
    *,
    trigger: str,
    detail: str,
    profile: str | None = None,
    once_per: str | None = None,
) -> Callable[[sqlite_utils.Database], object]:
    """Queue the alert unless one of the same (deposit, condition, once_per) is queued already:
    a condition that lasts over many attempts queues one alert row, not one per attempt."""

    def fn(db: sqlite_utils.Database) -> None:
        queued = db.execute(
            "SELECT 1 FROM actions WHERE action='alert' AND transaction_id IS ?"
            " AND json_extract(params, '$.condition')=?"
            " AND json_extract(params, '$.once_per') IS ? LIMIT 1",
            [deposit.transaction_id if deposit else None, condition, once_per],
        ).fetchone()
        if queued is None:
            enqueue_alert(
                db,
                deposit,
                condition,
                severity,
                trigger=trigger,
                detail=detail,
                profile=profile,
                once_per=once_per,
            )

    return fn
