"""Alert channels built from settings, retries with back-off, and fan-out to several channels.

`send_all` retries with back-off inside the call (for one-shot commands); `send_once` makes one
attempt per channel and reports the error, for the outbox, which schedules the next attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from worker.config.settings import NotifySettings
from worker.errors import NotifyError
from worker.logs import get_logger
from worker.notify.email import EmailNotifier
from worker.notify.message import Alert
from worker.notify.slack import SlackNotifier

log = get_logger(__name__)


class Notifier(Protocol):
    """An alert channel."""

    name: str

    async def send(self, alert: Alert) -> None:
        """Deliver one alert or raise `NotifyError`."""


def notifiers_from_settings(notify: NotifySettings) -> dict[str, Notifier]:
    """The configured channels by name; empty when `notify` configures none."""
    notifiers: dict[str, Notifier] = {}
    if notify.slack is not None:
        notifiers["slack"] = SlackNotifier(notify.slack.webhook_url.get_secret_value())
    if notify.email is not None:
        cfg = notify.email
        notifiers["email"] = EmailNotifier(
            cfg.host,
            cfg.port,
            starttls=cfg.starttls,
            username=cfg.username,
            password=cfg.password.get_secret_value() if cfg.password is not None else None,
            sender=cfg.from_,
            to=cfg.to,
        )
    return notifiers


async def send_with_retry(
    notifier: Notifier,
    alert: Alert,
    *,
    attempts: int = 5,
    backoff_s: float = 1.0,
    backoff_max_s: float = 60,
) -> None:
    """Send, retrying retryable failures with exponential back-off; `NotifyError` at the end."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    for attempt in range(1, attempts + 1):
        try:
            await notifier.send(alert)
        except NotifyError as exc:
            exc.attempts = attempt
            if not exc.retryable or attempt == attempts:
                raise
            delay = backoff_s * 2 ** (attempt - 1)
            if exc.retry_after is not None:
                delay = max(delay, exc.retry_after)
            delay = min(delay, backoff_max_s)
            log.warning(
                "alert_send_retry",
                channel=notifier.name,
                condition=alert.condition,
                transactionId=alert.transaction_id,
                attempt=attempt,
                delay_s=delay,
                error=exc.msg,
            )
            await asyncio.sleep(delay)
        else:
            return


async def _outcome(
    name: str, notifier: Notifier | None, alert: Alert, retry_kw: Mapping[str, Any]
) -> str | None:
    if notifier is None:
        return "channel not configured"
    try:
        await send_with_retry(notifier, alert, **retry_kw)
    except NotifyError as exc:
        tries = f" (gave up after {exc.attempts} attempts)" if exc.attempts > 1 else ""
        outcome = f"{exc.msg}{tries}"
    # One channel's bug must not cost the others their alert.
    except Exception as exc:
        outcome = f"unexpected {type(exc).__name__}: {exc}"
    else:
        log.info("alert_sent", **_about(name, alert))
        return None
    log.error("alert_failed", error=outcome, **_about(name, alert))
    return outcome


def _about(name: str, alert: Alert) -> dict[str, Any]:
    """The fields of an alert's log lines: channel, condition, deposit (never its contents)."""
    return {"channel": name, "condition": alert.condition, "transactionId": alert.transaction_id}


async def send_once(
    notifiers: Mapping[str, Notifier], alert: Alert, channels: Sequence[str]
) -> dict[str, NotifyError | None]:
    """One attempt per channel, in parallel, never sleeping: channel -> None or its error.

    For a caller that schedules the next attempt itself (the outbox requeues an alert after the
    error's `retry_after` or its back-off) rather than hold its worker in `asyncio.sleep`.
    """
    names = list(dict.fromkeys(channels))
    results = await asyncio.gather(*(_once(name, notifiers.get(name), alert) for name in names))
    return dict(zip(names, results, strict=True))


async def _once(name: str, notifier: Notifier | None, alert: Alert) -> NotifyError | None:
    if notifier is None:
        return NotifyError(name, "channel not configured", retryable=False)
    try:
        await notifier.send(alert)
    except NotifyError as exc:
        error = exc
    # One channel's bug must not cost the others their alert.
    except Exception as exc:
        error = NotifyError(name, f"unexpected {type(exc).__name__}: {exc}", retryable=False)
    else:
        log.info("alert_sent", **_about(name, alert))
        return None
    log.warning(
        "alert_not_sent",
        error=error.msg,
        retryable=error.retryable,
        retry_after_s=error.retry_after,
        **_about(name, alert),
    )
    return error


async def send_all(
    notifiers: Mapping[str, Notifier],
    alert: Alert,
    channels: Sequence[str] | None = None,
    **retry_kw: Any,
) -> dict[str, str | None]:
    """Send to `channels` (None: every configured one) in parallel; channel -> None or error."""
    names = list(notifiers) if channels is None else list(dict.fromkeys(channels))
    results = await asyncio.gather(
        *(_outcome(name, notifiers.get(name), alert, retry_kw) for name in names)
    )
    return dict(zip(names, results, strict=True))
