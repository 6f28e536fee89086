"""`alert`: tell a human on the configured channels, each channel at most once.

A rule's alert (and every alert depositd queues itself, `worker.act.queue.enqueue_alert`) is an
outbox row. `AlertSender` runs it after the commit in three steps: claim the alert's channels in
the `alerts` table (a channel that took it is not sent it again), send once per pass, and record
what each channel did, requeueing the row after a back-off while a channel fails, a bounded
number of times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker import clock
from worker.act import specs
from worker.act.kinds.base import Kind, Recording, RunnerDeps
from worker.act.queue import ActionRows, backoff, enqueue_alert
from worker.errors import NotifyError
from worker.logs import get_logger
from worker.notify.channels import Notifier, send_once
from worker.notify.message import Alert, build_alert
from worker.rules import Intent
from worker.store import alerts as stored
from worker.store.db import Db
from worker.store.sqlitestore import Store
from worker.track.tracker import Deposit

log = get_logger(__name__)

# An alert row is sent once per pass: up to MAX_ALERT_ROUNDS x notify_retry["attempts"] (5)
# sends while its channels fail in a retryable way, MAX_ALERT_ROUNDS when they refuse it.
MAX_ALERT_ROUNDS = 3
MAX_RETRY_AFTER_S = 3600.0  # a channel's Retry-After is honoured up to this


def _alert_detail(intent: Intent, deposit: Deposit, trigger: str) -> str | None:
    """The rule's message, and the provider's failMessage for a rejection."""
    parts = [str(intent.params["message"])] if intent.params.get("message") else []
    if trigger.startswith("rejected") and deposit.fail_message:
        parts.append(f"failMessage: {deposit.fail_message}")
    return "; ".join(parts) or None


def record(rec: Recording) -> None:
    """Queue the rule's alert row."""
    intent, fact, trigger = rec.intent, rec.fact, rec.trigger
    # One alert per rule and trigger (every matching rule runs); a raw eventType rule
    # alerts per stored event (a second rejection is news), a replay of it does not.
    once_per = f"{intent.rule_set}:{intent.rule}"
    if trigger == fact.event_type:
        once_per += f":{fact.event_id}"
    enqueue_alert(
        rec.db,
        rec.deposit,
        trigger,
        str(intent.params.get("severity", "warning")),
        trigger=trigger,
        detail=_alert_detail(intent, rec.deposit, trigger),
        channels=intent.params.get("channels"),
        intent=intent,
        profile=rec.match.name if rec.match is not None else None,
        once_per=once_per,
        event_id=fact.event_id,
    )


@dataclass(frozen=True)
class _Claim:
    """One alert row being sent: what it says and the dedupe key of each channel."""

    alert: Alert
    condition: str
    transaction_id: str
    scope: str

    def dedupe(self, channel: str) -> str:
        return f"{self.scope}:{self.condition}:{channel}"


class AlertSender:
    """Runs alert rows on the configured notifiers, recording outcomes in `ActionRows`."""

    def __init__(
        self,
        store: Store,
        rows: ActionRows,
        *,
        notifiers: Mapping[str, Notifier],
        notify_retry: Mapping[str, Any] | None,
        on_alert: Callable[[str, str], None] | None,
    ) -> None:
        self._store = store
        self._rows = rows
        self._notifiers = notifiers
        self._notify_retry = dict(notify_retry or {})
        self._alert_attempts = MAX_ALERT_ROUNDS * int(self._notify_retry.get("attempts", 5))
        self._on_alert = on_alert

    @classmethod
    def build(cls, deps: RunnerDeps) -> AlertSender:
        """The runner the outbox uses for alert rows."""
        return cls(
            deps.store,
            deps.rows,
            notifiers=deps.notifiers,
            notify_retry=deps.notify_retry,
            on_alert=deps.on_alert,
        )

    async def close(self) -> None:
        """Nothing to release: the notifiers belong to the service."""

    async def run(
        self,
        action_id: int,
        row: dict[str, Any],
        deposit: Deposit | None,
        params: dict[str, Any],
        attempts: int,
    ) -> None:
        """Send the alert to the channels that have not taken it yet; requeue or fail the rest."""
        claim = self._describe(action_id, deposit, params)
        wanted = params.get("channels") or list(self._notifiers)
        channels = [c for c in wanted if c in self._notifiers]
        if not channels:
            log.warning(
                "alert",
                condition=claim.condition,
                transactionId=claim.transaction_id,
                title=claim.alert.title,
            )
            await self._rows.finish(action_id, "done", "logged (no alert channel configured)")
            if self._on_alert is not None:  # counted too: an alert only logged is still one
                self._on_alert("log", "logged")
            return
        todo = await self._store.write(lambda db: self._claim(db, claim, channels))
        if not todo:
            await self._rows.finish(action_id, "done", "already sent (or being sent)")
            return
        # One attempt per pass: a channel that answers 429 (Retry-After) or is down must not
        # hold the pass (and its lock) in a sleep while submissions wait and SIGTERM cannot end
        # it; the row is requeued for when the channel may take it.
        # Renewed with the row's claim (`Outbox._renew`) while the send is in flight.
        self._rows.hold_alerts(action_id, [claim.dedupe(c) for c in todo])
        results = await send_once(self._notifiers, claim.alert, todo)
        await self._record(action_id, attempts, claim, todo, results)

    def _describe(self, action_id: int, deposit: Deposit | None, params: dict[str, Any]) -> _Claim:
        """The alert of the row, and the scope its channels are deduplicated in."""
        condition = str(params["condition"])
        tx = deposit.transaction_id if deposit else "-"
        # Deposit alerts: once per (deposit, condition, channel), or per (deposit, condition,
        # once_per, channel) when the caller names what one alert is about (a submission). An
        # alert about no deposit (poll failing, reload refused) is once per queued alert: its
        # callers decide how often.
        scope = tx if deposit else f"system#{action_id}"
        if params.get("once_per"):
            scope += f"#{params['once_per']}"
        alert = build_alert(
            condition,
            str(params.get("severity", "warning")),
            deposit,
            detail=params.get("detail"),
            profile=params.get("profile"),
        )
        return _Claim(alert, condition, tx, scope)

    def _claim(self, db: Db, claim: _Claim, channels: Sequence[str]) -> list[str]:
        """The channels that have not taken the alert yet, each claimed in `alerts` for this
        instance (a channel another instance is sending to is left to it)."""
        now = clock.now_ms()
        return [
            channel
            for channel in channels
            if stored.claim_alert(
                db,
                claim.dedupe(channel),
                transaction_id=claim.transaction_id,
                condition=claim.condition,
                severity=claim.alert.severity,
                channel=channel,
                instance=self._rows.instance or "",
                now=clock.iso_from_ms(now),
                until=clock.iso_from_ms(now + round(self._rows.lease_s * 1000)),
            )
        ]

    async def _record(
        self,
        action_id: int,
        attempts: int,
        claim: _Claim,
        todo: list[str],
        results: Mapping[str, NotifyError | None],
    ) -> None:
        """Record each channel's send and the row's outcome: done, pending again, or failed."""
        failed = {c: e for c, e in results.items() if e is not None}
        errors = "; ".join(e.msg for e in failed.values())
        # Retrying cannot help a refused URL or login: those get the old three rounds only.
        retryable = any(e.retryable for e in failed.values())
        limit = self._alert_attempts if retryable else MAX_ALERT_ROUNDS
        retry = bool(failed) and attempts < limit

        lost: list[str] = []

        def sends(db: Db) -> None:
            lost.clear()  # the write may run this again (a round retried)
            for channel, error in results.items():
                status = "sent" if error is None else "pending" if retry else "failed"
                msg = None if error is None else error.msg
                if not stored.record_send(
                    db,
                    claim.dedupe(channel),
                    status=status,
                    error=msg,
                    instance=self._rows.instance or "",
                ):
                    lost.append(channel)

        for channel, error in results.items():
            if self._on_alert is not None:
                self._on_alert(channel, "failed" if error else "sent")
        if not failed:
            await self._rows.finish(action_id, "done", f"sent to {', '.join(todo)}", also=sends)
        elif retry:
            hint = max((e.retry_after or 0.0 for e in failed.values()), default=0.0)
            await self._rows.finish(
                action_id,
                "pending",
                f"not sent to {', '.join(failed)}: {errors}",
                retry_in=max(self._alert_delay(attempts), min(hint, MAX_RETRY_AFTER_S)),
                also=sends,
            )
        else:
            await self._rows.finish(
                action_id,
                "failed",
                f"could not send to {', '.join(failed)}: {errors}",
                also=sends,
            )

        if lost:
            log.warning(
                "alert channel claim lost to another instance; send not recorded",
                actionId=action_id,
                condition=claim.condition,
                transactionId=claim.transaction_id,
                channels=", ".join(lost),
            )
            for _ in lost:
                self._rows.lost("alert_send")

    def _alert_delay(self, attempts: int) -> float:
        """Back-off between sends of one alert (notify_retry's backoff_s, backoff_max_s)."""
        return backoff(
            attempts,
            float(self._notify_retry.get("backoff_s", 1.0)),
            float(self._notify_retry.get("backoff_max_s", 60.0)),
        )


KIND = Kind(specs.ALERT, record, runner=AlertSender.build)
