"""Slack incoming-webhook channel.

The webhook URL is a secret (anyone holding it can post): it never appears in an error message.
"""

from __future__ import annotations

import aiohttp

from worker.errors import NotifyError
from worker.notify.message import Alert, render_slack
from worker.urls import host_port

_BODY_SNIPPET = 200


class SlackNotifier:
    """Posts alerts to a Slack incoming webhook."""

    name = "slack"

    def __init__(
        self,
        webhook_url: str,
        *,
        timeout_s: float = 10,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self._url = webhook_url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session = session

    def __repr__(self) -> str:
        return "SlackNotifier(webhook_url=[redacted])"

    def _error(self, msg: str, *, retryable: bool, retry_after: float | None = None) -> NotifyError:
        safe = msg.replace(self._url, "[webhook url]")
        return NotifyError(self.name, safe, retryable=retryable, retry_after=retry_after)

    async def send(self, alert: Alert) -> None:
        """Post one alert; raises `NotifyError` (retryable or not) on failure."""
        payload = render_slack(alert)
        try:
            if self._session is not None:
                await self._post(self._session, payload)
            else:
                async with aiohttp.ClientSession() as session:
                    await self._post(session, payload)
        except NotifyError:
            raise
        except TimeoutError:
            raise self._error(f"timed out ({host_port(self._url)})", retryable=True) from None
        except (aiohttp.InvalidURL, ValueError) as exc:
            raise self._error(f"bad webhook URL ({type(exc).__name__})", retryable=False) from None
        except (aiohttp.ClientError, OSError) as exc:
            # The type and host:port only: an error's text may hold the URL (the secret) in
            # another spelling, and the URL's path is the secret.
            raise self._error(
                f"connection error: {type(exc).__name__} to {host_port(self._url)}",
                retryable=True,
            ) from None

    async def _post(self, session: aiohttp.ClientSession, payload: dict[str, object]) -> None:
        async with session.post(self._url, json=payload, timeout=self._timeout) as resp:
            if 200 <= resp.status < 300:
                return
            body = (await resp.text(errors="replace"))[:_BODY_SNIPPET].strip()
            msg = f"HTTP {resp.status}" + (f": {body}" if body else "")
            if resp.status == 429 or resp.status >= 500:
                raise self._error(
                    msg, retryable=True, retry_after=_retry_after(resp.headers.get("Retry-After"))
                )
            # Any other 4xx means a wrong or revoked URL or a payload Slack refuses: retrying
            # cannot help.
            raise self._error(msg, retryable=False)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (Slack sends an integer); None when absent or unreadable."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
