"""The actions table's rows as depositd writes them: queued actions and recorded outcomes.

`add_action` queues one row (inside the caller's transaction); `enqueue_alert`,
`add_submission` and the per-deposit alerts of the polls and submissions (`alert_gone`,
`alert_mismatch`, `alert_detail_failing`) queue the rows that code outside the rules queues too
(the poller, the reload, the submitter). `ActionRows` records a running row's outcome (done, failed,
skipped, or pending again after a back-off) for `worker.act.outbox.Outbox` and the action kinds
(`worker.act.kinds`), so those modules do not import the runner. `alert_once` queues an alert
from a running row (unless the same one is queued already), in the write that records its
outcome. The statements themselves are in `worker.store.actions`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from worker import clock
from worker.clock import iso_from_ms
from worker.logs import get_logger
from worker.rules import Intent
from worker.store import actions as stored
from worker.store.actions import alert_with_trigger_queued
from worker.store.db import Database, Db
from worker.store.deposits import get_deposit_row
from worker.store.sqlitestore import Store
from worker.track.tracker import Deposit

log = get_logger(__name__)

# json.dumps(..., sort_keys=True) builds a new encoder at every call: this one is built once.
_SORTED_JSON = json.JSONEncoder(sort_keys=True)


def add_action(
    db: Db,
    *,
    deposit: Deposit | None,
    action: str,
    params: dict[str, Any],
    trigger: str,
    event_id: str | None = None,
    intent: Intent | None = None,
    status: str = "pending",
    outcome: str | None = None,
    idempotency_key: str | None = None,
    want_id: bool = True,
) -> int:
    """Insert one action (outbox) row; returns its id (0 unless `want_id`)."""
    return stored.insert_action(
        db,
        transaction_id=deposit.transaction_id if deposit else None,
        event_id=event_id,
        trigger=trigger,
        rule_set=intent.rule_set if intent else None,
        rule_set_version=intent.version if intent else None,
        rule=intent.rule if intent else None,
        action=action,
        params=_SORTED_JSON.encode(params),
        idempotency_key=idempotency_key,
        status=status,
        outcome=outcome,
        want_id=want_id,
    )


def submit_key(transaction_id: str, content_hash: str) -> str:
    """Idempotency-Key of a submission: stable for one profile content, new after a change."""
    return hashlib.sha256(f"{transaction_id}:{content_hash}".encode()).hexdigest()[:40]


def submit_params(profile: str, content_hash: str, *, named: bool) -> dict[str, Any]:
    """The params of a submit_profile action. Once the provider accepts it, the tracker
    takes "pending" as observed when the acceptance arrived (`worker.track.facts`)."""
    return {"profile": profile, "content_hash": content_hash, "named": named}


def key_used(db: Db, transaction_id: str, key: str) -> bool:
    """Was a submission with this Idempotency-Key (this exact payload) already queued?"""
    return stored.submission_key_used(db, transaction_id, key)


def add_submission(
    db: Db,
    deposit: Deposit,
    profile: str,
    content_hash: str,
    *,
    named: bool,
    trigger: str,
    event_id: str | None = None,
    intent: Intent | None = None,
) -> int:
    """Queue one submit_profile row for `profile`'s content, under that content's
    Idempotency-Key; returns its id."""
    return add_action(
        db,
        deposit=deposit,
        action="submit_profile",
        params=submit_params(profile, content_hash, named=named),
        trigger=trigger,
        event_id=event_id,
        intent=intent,
        idempotency_key=submit_key(deposit.transaction_id, content_hash),
    )


def enqueue_alert(
    db: Db,
    deposit: Deposit | None,
    condition: str,
    severity: str,
    *,
    trigger: str,
    detail: str | None = None,
    channels: Sequence[str] | None = None,
    intent: Intent | None = None,
    profile: str | None = None,
    once_per: str | None = None,
    event_id: str | None = None,
) -> int:
    """Queue an alert; the runner sends it once per (deposit, condition, channel), or per
    (deposit, condition, once_per, channel) when `once_per` names what one alert is about (one
    submission, one rule)."""
    return stored.queue_alert(
        db,
        transaction_id=deposit.transaction_id if deposit else None,
        condition=condition,
        severity=severity,
        trigger=trigger,
        detail=detail,
        channels=channels,
        profile=profile,
        once_per=once_per,
        event_id=event_id,
        rule_set=intent.rule_set if intent else None,
        rule_set_version=intent.version if intent else None,
        rule=intent.rule if intent else None,
    )


def _alert_once_per_trigger(
    db: Db,
    transaction_id: str,
    condition: str,
    severity: str,
    *,
    trigger: str,
    detail: str,
) -> None:
    """Queue an alert about a tracked deposit unless one with this trigger was ever queued."""
    queued = alert_with_trigger_queued(db, transaction_id, trigger)
    row = get_deposit_row(db, transaction_id)
    if not queued and row is not None:
        enqueue_alert(
            db, Deposit.from_row(row), condition, severity, trigger=trigger, detail=detail
        )


def alert_gone(db: Db, transaction_id: str) -> None:
    """Queue one critical alert for a tracked deposit the provider no longer knows (10000100)."""
    _alert_once_per_trigger(
        db,
        transaction_id,
        "deposit_gone",
        "critical",
        trigger="gone",
        detail="10000100: transaction not found, or not owned by the caller (detail poll)",
    )


def alert_mismatch(db: Db, transaction_id: str, detail: str) -> None:
    """Queue one critical alert for a tracked deposit whose detail answered about another
    transactionId (a protocol error: the answer is not recorded)."""
    _alert_once_per_trigger(
        db, transaction_id, "detail_mismatch", "critical", trigger="detail_mismatch", detail=detail
    )


def alert_detail_failing(db: Db, transaction_id: str, detail: str) -> None:
    """Queue one warning alert for a tracked deposit whose detail keeps failing to be read."""
    _alert_once_per_trigger(
        db, transaction_id, "detail_failing", "warning", trigger="detail_failing", detail=detail
    )


def backoff(attempts: int, base_s: float, max_s: float) -> float:
    """The back-off after `attempts` tries: doubling from `base_s`, at most `max_s`. The
    exponent is capped: a row retried without end (an unknown outcome) must not overflow a
    float after ~1000 attempts."""
    return min(max_s, base_s * 2.0 ** min(max(0, attempts - 1), 40))


def _iso_in(seconds: float) -> str:
    return iso_from_ms(clock.now_ms() + round(seconds * 1000))


class ActionRows:
    """Records action rows' outcomes; a retried row is due again after an exponential back-off."""

    def __init__(
        self,
        store: Store,
        *,
        backoff_s: float,
        backoff_max_s: float,
        instance: str | None = None,
        lease_s: float = 60.0,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._on_lost = on_lost
        # Outcomes are recorded only while this instance holds the row's claim; an alert's
        # channels are claimed for as long as an action row.
        self.instance = instance
        self.lease_s = lease_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        # The alert channels each running row has claimed (dedupe keys): the outbox renews
        # them with the row's own claim while the send is in flight.
        self._alert_claims: dict[int, list[str]] = {}

    def lost(self, stage: str) -> None:
        """Count a claim this instance found taken over: at a `renewal` (the action stopped),
        at its `outcome` or at an `alert_send` (nothing recorded)."""
        if self._on_lost is not None:
            self._on_lost(stage)

    def hold_alerts(self, action_id: int, dedupe_keys: list[str]) -> None:
        """The row's alert channels are claimed: renew them with the row's claim."""
        self._alert_claims[action_id] = list(dedupe_keys)

    def alert_claims(self, action_id: int) -> list[str]:
        """The alert channels the row holds (renewed with it)."""
        return self._alert_claims.get(action_id, [])

    def drop_alerts(self, action_id: int) -> None:
        """The row is over: its channels are renewed no more."""
        self._alert_claims.pop(action_id, None)

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
        also: Callable[[Database], object] | None = None,
        key: str | None = None,
    ) -> None:
        """Record the row's status and outcome; `also` runs in the same write. A row another
        instance took over meanwhile (this one's claim lapsed) keeps the other's record."""

        def fn(db: Database) -> bool:
            mine = stored.finish_action(
                db,
                action_id,
                status=status,
                outcome=outcome,
                next_attempt_at=_iso_in(retry_in or 0),
                key=key,
                instance=self.instance,
            )
            if mine and also is not None:
                also(db)
            return mine

        if await self._store.write(fn):
            log.info("action", actionId=action_id, status=status, outcome=outcome)
        else:
            log.warning(
                "action taken over by another instance; outcome not recorded",
                actionId=action_id,
                status=status,
                outcome=outcome,
            )
            self.lost("outcome")

    async def write(self, fn: Callable[[Database], object]) -> None:
        """Run `fn` in a write of its own (an alert about the row's deposit)."""
        await self._store.write(fn)

    async def later(
        self,
        action_id: int,
        attempts: int,
        outcome: str,
        *,
        key: str | None = None,
        also: Callable[[Database], object] | None = None,
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
) -> Callable[[Database], object]:
    """Queue the alert unless one of the same (deposit, condition, once_per) is queued already:
    a condition that lasts over many attempts queues one alert row, not one per attempt."""

    def fn(db: Db) -> None:
        tx = deposit.transaction_id if deposit else None
        if not stored.alert_queued(db, tx, condition, once_per):
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
