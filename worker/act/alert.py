"""The alert rows: send an alert to its channels, each channel at most once.

`AlertSender` runs one alert row for `worker.act.outbox.Outbox`: it claims the alert's channels in
the `alerts` table (so a channel that took it is not sent it again), sends once per pass, and
requeues the row after a back-off while a channel fails, a bounded number of times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sqlite_utils

from worker.act.rows import ActionRows, backoff
from worker.clock import utc_now
from worker.logs import get_logger
from worker.notify.channels import Notifier, send_once
from worker.notify.message import build_alert
from worker.store.writer import Store
from worker.track.tracker import Deposit

log = get_logger(__name__)

# An alert row is sent once per pass: up to MAX_ALERT_ROUNDS x notify_retry["attempts"] (5)
# sends while its channels fail in a retryable way, MAX_ALERT_ROUNDS when they refuse it.
MAX_ALERT_ROUNDS = 3
MAX_RETRY_AFTER_S = 3600.0  # a channel's Retry-After is honoured up to this


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

    async def run(
        self, action_id: int, deposit: Deposit | None, params: dict[str, Any], attempts: int
    ) -> None:
        """Send the alert to the channels that have not taken it yet; requeue or fail the rest."""
        condition = str(params["condition"])
        tx = deposit.transaction_id if deposit else "-"
        # Deposit alerts: once per (deposit, condition, channel), or per (deposit, condition,
        # once_per, channel) when the caller names what one alert is about (a submission). An
        # alert about no deposit (poll failing, reload refused) is once per queued alert: its
        # callers decide how often.
        scope = tx if deposit else f"system#{action_id}"
        if params.get("once_per"):
            scope += f"#{params['once_per']}"
        wanted = params.get("channels") or list(self._notifiers)
        channels = [c for c in wanted if c in self._notifiers]
        alert = build_alert(
            condition,
            str(params.get("severity", "warning")),
            deposit,
            detail=params.get("detail"),
            profile=params.get("profile"),
        )
        if not channels:
            log.warning("alert", condition=condition, transactionId=tx, title=alert.title)
            await self._rows.finish(action_id, "done", "logged (no alert channel configured)")
            if self._on_alert is not None:  # counted too: an alert only logged is still one
                self._on_alert("log", "logged")
            return

        def dedupe(channel: str) -> str:
            return f"{scope}:{condition}:{channel}"

        def claim(db: sqlite_utils.Database) -> list[str]:
            todo = []
            for channel in channels:
                key = dedupe(channel)
                db.execute(
                    "INSERT OR IGNORE INTO alerts (dedupe_key, transaction_id, condition, severity,"
                    " channel, status, attempts, created_at) VALUES (?,?,?,?,?, 'pending', 0, ?)",
                    [key, tx, condition, alert.severity, channel, utc_now()],
                )
                status = db.execute(
                    "SELECT status FROM alerts WHERE dedupe_key=?", [key]
                ).fetchone()[0]
                if status != "sent":
                    todo.append(channel)
            return todo

        todo = await self._store.write(claim)
        if not todo:
            await self._rows.finish(action_id, "done", "already sent")
            return
        # One attempt per pass: a channel that answers 429 (Retry-After) or is down must not
        # hold the pass (and its lock) in a sleep while submissions wait and SIGTERM cannot end
        # it; the row is requeued for when the channel may take it.
        results = await send_once(self._notifiers, alert, todo)
        failed = {c: e for c, e in results.items() if e is not None}
        errors = "; ".join(e.msg for e in failed.values())
        # Retrying cannot help a refused URL or login: those get the old three rounds only.
        retryable = any(e.retryable for e in failed.values())
        limit = self._alert_attempts if retryable else MAX_ALERT_ROUNDS
        retry = bool(failed) and attempts < limit

        def record(db: sqlite_utils.Database) -> None:
            for channel, error in results.items():
                status = "sent" if error is None else "pending" if retry else "failed"
                db.execute(
                    "UPDATE alerts SET status=?, attempts=attempts+1, last_error=?, sent_at=?"
                    " WHERE dedupe_key=?",
                    [
                        status,
                        None if error is None else error.msg,
                        None if error else utc_now(),
                        dedupe(channel),
                    ],
                )

        for channel, error in results.items():
            if self._on_alert is not None:
                self._on_alert(channel, "failed" if error else "sent")
        if not failed:
            await self._rows.finish(action_id, "done", f"sent to {', '.join(todo)}", also=record)
        elif retry:
            hint = max((e.retry_after or 0.0 for e in failed.values()), default=0.0)
            await self._rows.finish(
                action_id,
                "pending",
                f"not sent to {', '.join(failed)}: {errors}",
                retry_in=max(self._alert_delay(attempts), min(hint, MAX_RETRY_AFTER_S)),
                also=record,
            )
        else:
            await self._rows.finish(
                action_id,
                "failed",
                f"could not send to {', '.join(failed)}: {errors}",
                also=record,
            )

    def _alert_delay(self, attempts: int) -> float:
        """Back-off between sends of one alert (notify_retry's backoff_s, backoff_max_s)."""
        return backoff(
            attempts,
            float(self._notify_retry.get("backoff_s", 1.0)),
            float(self._notify_retry.get("backoff_max_s", 60.0)),
        )
