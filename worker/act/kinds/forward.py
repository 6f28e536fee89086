"""`forward`: post the deposit to the URL a rule names, signed with its secret (docs/rules.md).

The reactor records the deposit as of the transition (every retry posts the same body); on
order_updated the row holds the order record instead (`worker.act.recordreactor.fire_record`),
which is the body then. `Forwarder` runs the row after the commit; `forward_secret` reads a
forward rule's signing secret (also used by `depositd check`, which reports one that is missing).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from worker.act import specs
from worker.act.kinds.base import Kind, Recording, RunnerDeps
from worker.act.queue import ActionRows, alert_once
from worker.config.settings import read_secret_file
from worker.provider import jsonio, signing
from worker.track.tracker import Deposit
from worker.urls import host_port


def record(rec: Recording) -> None:
    """Queue the forward row with the deposit as of this transition: every retry posts the
    same body."""
    params = {**rec.intent.params, "deposit": rec.deposit.as_json()}
    rec.add(params=params)


MAX_FORWARD_ATTEMPTS = 8


class Forwarder:
    """Runs forward rows on its own HTTP session, recording outcomes in `ActionRows`."""

    def __init__(self, rows: ActionRows) -> None:
        self._rows = rows
        self._http: aiohttp.ClientSession | None = None

    @classmethod
    def build(cls, deps: RunnerDeps) -> Forwarder:
        """The runner the outbox uses for forward rows."""
        return cls(deps.rows)

    async def close(self) -> None:
        """Close the HTTP session, if a forward opened one."""
        http, self._http = self._http, None  # a restarted outbox opens a new one
        if http is not None:
            await http.close()

    async def run(
        self,
        action_id: int,
        row: dict[str, Any],
        deposit: Deposit | None,
        params: dict[str, Any],
        attempts: int,
    ) -> None:
        """Post the deposit (or the record, for order_updated: the order) to the rule's URL; a
        failure is retried with back-off."""
        record = params.get("record")
        if deposit is None and not record:
            await self._rows.finish(action_id, "skipped", "deposit unknown")
            return
        # A record (no deposit) is alerted about per row; a deposit once per deposit.
        once_per = None if deposit is not None else f"forward:{action_id}"
        url = str(params["url"])
        secret, problem = forward_secret(params)
        if problem is not None:
            # Forward is signed (docs/rules.md): never post unsigned; wait for the secret.
            outcome = f"not sent: forward secret missing ({problem})"
            also = alert_once(
                deposit,
                "forward_secret_missing",
                "warning",
                trigger="forward",
                detail=f"forward not sent: {problem}; depositd retries with back-off and never "
                "posts unsigned",
                once_per=once_per,
            )
            # Not counted against MAX_FORWARD_ATTEMPTS: it goes out once the secret is there
            # (the back-off is capped), alerted once meanwhile.
            await self._rows.later(action_id, attempts, f"{outcome}; retrying", also=also)
            return
        if record:
            body = jsonio.dumpb(record)
        else:
            assert deposit is not None
            body = jsonio.dumpb(params.get("deposit") or deposit.as_json())
        ok, outcome, redirected = await self._post(url, secret, body)
        if ok:
            await self._rows.finish(action_id, "done", f"forwarded to {url}: {outcome}")
            return
        # Alerted once per deposit: when a redirect is refused (the target moved, or someone
        # points it elsewhere), and when the forward gives up.
        alarm = None
        if redirected or attempts >= MAX_FORWARD_ATTEMPTS:
            alarm = alert_once(
                deposit,
                "forward_failed",
                "warning",
                trigger="forward",
                detail=f"forward to {host_port(url)} failed: {outcome}",
                once_per=once_per,
            )
        if attempts < MAX_FORWARD_ATTEMPTS:
            await self._rows.later(
                action_id, attempts, f"forward failed ({outcome}); retrying", also=alarm
            )
        else:
            await self._rows.finish(
                action_id, "failed", f"forward to {url} failed: {outcome}", also=alarm
            )

    async def _post(self, url: str, secret: str, body: bytes) -> tuple[bool, str, bool]:
        """POST the signed body once: (ok, outcome, redirected)."""
        target = url.split("://", 1)[-1]
        path = "/" + target.split("/", 1)[1] if "/" in target else "/"
        headers = {
            "Content-Type": "application/json",
            # Its own scheme, not the provider's: merchant systems verify method-path-v1
            # (docs/signatures.md, "`forward`'s own signing").
            **signing.signed_headers(
                "depositd", secret, "POST", path, body, scheme=signing.METHOD_PATH_V1
            ),
        }
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        redirected = False
        try:
            # Never followed: a redirect would re-post the deposit and its signature elsewhere.
            async with self._http.post(
                url, data=body, headers=headers, allow_redirects=False
            ) as resp:
                ok = 200 <= resp.status < 300
                outcome = f"HTTP {resp.status}"
                redirected = 300 <= resp.status < 400
                if redirected:
                    outcome += f" redirect to {_where(resp.headers.get('Location'))} (not followed)"
        except TimeoutError:
            ok, outcome = False, f"timeout ({host_port(url)})"
        except aiohttp.ClientConnectionError as exc:
            ok, outcome = False, f"connection error: {type(exc).__name__} to {host_port(url)}"
        except aiohttp.ClientError as exc:
            ok, outcome = False, f"{type(exc).__name__} from {host_port(url)}"
        return ok, outcome, redirected


def _where(location: str | None) -> str:
    """A redirect's Location without its query string or fragment (they may carry secrets)."""
    if not location:
        return "(no Location)"
    parts = urlsplit(location)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def forward_secret(params: Mapping[str, Any]) -> tuple[str, str | None]:
    """(secret, problem) of a forward rule's signing secret (secret_env/secret_file), read when
    used: a problem when it names none (a row queued before the rules required one), or one that
    is unset, empty or unreadable (docs/rules.md: forward is signed, so it is not sent)."""
    if params.get("secret_env"):
        name = str(params["secret_env"])
        value = os.environ.get(name, "")
        return (value, None) if value else ("", f"secret_env {name} is not set or empty")
    if params.get("secret_file"):
        path = Path(str(params["secret_file"]))
        try:
            value = read_secret_file(path)
        except OSError as exc:
            return "", f"secret_file {path} cannot be read ({exc.strerror})"
        except UnicodeDecodeError:  # said without the byte: it is part of a secret
            return "", f"secret_file {path} is not UTF-8 text"
        return (value, None) if value else ("", f"secret_file {path} is empty")
    return "", "no secret_env or secret_file"


def _secret_problem(params: Mapping[str, Any]) -> str | None:
    return forward_secret(params)[1]


KIND = Kind(
    specs.FORWARD,
    record,
    runner=Forwarder.build,
    secret_problem=_secret_problem,
)
