"""`depositd selftest --url URL`: one signed event through the public webhook URL.

The check after a proxy or TLS change: the event (eventType `DEPOSITD_SELFTEST`, which the
rules do not know, so it is stored as ignored and acts on nothing) is signed with this config's
webhook key and secret for the URL's own path, sent, and then looked up in this config's
database by its eventId. The answer and, when it was not stored, what to check are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re
import uuid
from contextlib import closing
from dataclasses import dataclass

from yarl import URL

from worker.clock import now_ms
from worker.config.settings import Settings, load_settings
from worker.provider.jsonio import dumpb
from worker.provider.signing import signed_headers
from worker.store.errors import StoreError
from worker.store.events import status_of
from worker.store.pgstore import command_connection
from worker.store.sqlite import connect

EVENT_TYPE = "DEPOSITD_SELFTEST"
_TIMEOUT_S = 20.0
_CHECKED = re.compile(r"checked over (\S+) (\S*), (\d+) body bytes, sha256 ([0-9a-f]+)")


@dataclass(frozen=True)
class Sent:
    """What was sent and what came back (status None: no answer)."""

    url: str
    path: str  # the path (and query) the signature covers
    body: bytes
    event_id: str
    status: int | None
    answer: str
    location: str | None = None
    covers_path: bool = False  # the webhook scheme signs the path (method-path-v1)


async def send(url: str, settings: Settings) -> Sent:
    """POST one signed selftest event to `url`."""
    import aiohttp  # the HTTP client: imported by the one command that sends

    path = URL(url).raw_path_qs
    event_id = f"selftest-{uuid.uuid4().hex}"
    ts = now_ms()
    body = dumpb(
        {
            "eventId": event_id,
            "eventType": EVENT_TYPE,
            "referenceId": None,
            "status": "SELFTEST",
            "timestamp": ts,
            "data": {},
        }
    )
    hook = settings.webhook
    headers = signed_headers(
        hook.api_key.get_secret_value(),
        hook.secret[0].get_secret_value(),
        "POST",
        path,
        body,
        scheme=hook.scheme,
        timestamp_ms=ts,
    )
    headers["Content-Type"] = "application/json"
    covers = hook.scheme.covers_path
    timeout = aiohttp.ClientTimeout(total=_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, data=body, headers=headers, allow_redirects=False) as resp,
        ):
            text = (await resp.content.read(4096)).decode("utf-8", "replace")
            location = resp.headers.get("Location")
            return Sent(url, path, body, event_id, resp.status, text, location, covers)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return Sent(url, path, body, event_id, None, f"{type(exc).__name__}: {exc}", None, covers)


def stored_status(settings: Settings, event_id: str) -> str | None:
    """The stored status of the event (`ignored`, `pending`), or None when not stored."""
    try:
        if settings.storage.url is not None:
            with closing(command_connection(settings.storage)) as pg:
                return status_of(pg, event_id)
        with closing(connect(settings.storage.file, readonly=True)) as conn:
            return status_of(conn, event_id)
    except StoreError:
        return None


def _unauthorized_hint(sent: Sent, answer: str) -> str:
    checked = _CHECKED.search(answer)
    if checked and sent.covers_path and "a proxy rewrote the path" in answer:
        return (
            f"path rewritten: signed for {sent.path.partition('?')[0]}, arrived as"
            f" {checked.group(2)} (the proxy says so). The signature covers the path: make the"
            " proxy pass it unchanged (webhook.path is then the public path)"
        )
    if checked:
        _, arrived, size, digest = checked.groups()
        signed = sent.path.partition("?")[0]
        if sent.covers_path and arrived != signed:
            return (
                f"path rewritten: signed for {signed}, arrived as {arrived}. The signature covers"
                " the path: make the proxy pass it unchanged (webhook.path is then the public"
                " path)"
            )
        ours = hashlib.sha256(sent.body).hexdigest()
        if int(size) != len(sent.body) or not ours.startswith(digest):
            return (
                f"body changed by the proxy: sent {len(sent.body)} bytes, {size} arrived (or"
                " other bytes): the proxy must pass the body as it is"
            )
        intact = "path and body arrived intact" if sent.covers_path else "the body arrived intact"
        return (
            f"wrong secret or scheme: {intact}, so the service at this URL verifies with"
            " another webhook secret, or another webhook.signature scheme, than this config's"
        )
    if "unknown API-KEY" in answer:
        return "wrong API key: the service at this URL expects another webhook.api_key"
    if "too old" in answer or "in the future" in answer:
        return (
            "clock skew: API-TIMESTAMP is outside webhook.tolerance_s at the service; check"
            " the clocks (NTP) of this machine and the service's"
        )
    if "missing header" in answer:
        return "the proxy drops a header: API-KEY, API-TIMESTAMP and API-SIGNATURE must pass"
    return "authentication failed: see the answer above"


def hint(sent: Sent, db: str) -> str:
    """What to check, given the answer and whether the event was stored."""
    status = sent.status
    if status is None:
        return f"no answer from {sent.url}: check the URL, DNS, TLS and that the proxy runs"
    if status == 200:
        return (
            f"answered 200 but the event is not in {db}: the URL reaches another service (or"
            " one with another database)"
        )
    if status == 401:
        return _unauthorized_hint(sent, sent.answer)
    if status in (404, 405):
        return (
            "404: nothing answers that path; the proxy forwards to a path depositd does not"
            " serve (webhook.path) or rewrites it: check the proxy's location and upstream"
        )
    if 300 <= status < 400:
        return f"redirected to {sent.location}: give the provider the final URL (https?)"
    if status == 413:
        return "body too large at the proxy: raise its body size limit above webhook.max_body_bytes"
    if status == 415:
        return "the proxy compresses the body (Content-Encoding): turn that off for this path"
    if status in (502, 504):
        return "the proxy cannot reach depositd: is serve running, and the proxy's upstream right?"
    if status == 503:
        return "depositd (or the proxy) is unavailable: see depositd status and its log"
    return "unexpected answer: see the answer above and the service's log"


def run(args: argparse.Namespace) -> int:
    """`depositd selftest --url URL`: exit 0 only when the event was stored."""
    settings = load_settings(args.config)
    sent = asyncio.run(send(args.url, settings))
    stored = stored_status(settings, sent.event_id) if sent.status is not None else None
    print(f"POST {sent.url} ({EVENT_TYPE}, eventId {sent.event_id})")
    if sent.status is None:
        print(f"answer: none ({sent.answer})")
    else:
        print(f"answer: HTTP {sent.status} {sent.answer.strip()[:500]}")
    print(f"stored: {'yes (' + stored + ')' if stored else 'no'}")
    if stored:
        print("ok: the public URL reaches depositd with the path and body intact")
        # Signed with this configuration's own secret: it cannot show the provider's differs.
        print(
            "note: signed with this configuration's webhook.secret and webhook.api_key, so it"
            " cannot tell whether the provider signs with the same ones; its deliveries refused"
            " show in `depositd status` (webhookRefusals, webhookAuthRefused)"
        )
        return 0
    print(f"check: {hint(sent, settings.storage.where)}")
    return 1
