"""The webhook endpoint and the operational endpoints (SPEC section 6).

Thin on purpose: read at most `max_body_bytes`, verify the raw bytes, check the envelope's two
required keys, commit the raw event, answer. Everything else happens in the processor, which
this handler only wakes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from worker.errors import StorageError
from worker.logs import get_logger
from worker.metrics import CONTENT_TYPE, Metrics, event_type_label
from worker.provider import jsonio
from worker.provider.models import DEPOSIT_EVENT_TYPES, KNOWN_EVENT_TYPES
from worker.provider.signing import SignatureError, verify
from worker.queries import deposits_by_state, oldest_pending_received_at, set_meta, utc_now
from worker.settings import WebhookSettings
from worker.store import Store
from worker.tracker import ms_from_iso

log = get_logger(__name__)

# A readiness check answers None when fine, else what is wrong (shown in /readyz).
ReadyCheck = Callable[[], Awaitable[str | None]]

_OK = b"{}"
_CHUNK = 64 * 1024


class BodyTooLarge(Exception):
    """The request body exceeds max_body_bytes."""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _transaction_id(event_type: str, reference_id: Any, data: Any) -> str | None:
    if isinstance(data, dict):
        tx = data.get("transactionId")
        if isinstance(tx, str) and tx:
            return tx
    if event_type in DEPOSIT_EVENT_TYPES and isinstance(reference_id, str) and reference_id:
        return reference_id
    return None


class Ingress:
    """Request handlers bound to the objects they need."""

    def __init__(
        self,
        settings: WebhookSettings,
        store: Store,
        metrics: Metrics,
        *,
        wake: Callable[[], None] = lambda: None,
        ready_checks: Sequence[ReadyCheck] = (),
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.wake = wake
        # Kept by reference: checks appended later (e.g. the scheduler's) are seen.
        self.ready_checks = ready_checks
        self._api_key = settings.api_key.get_secret_value()
        self._secrets = [s.get_secret_value() for s in settings.secret]
        self._counters: dict[tuple[str, str], Any] = {}

    def add_routes(self, app: web.Application) -> None:
        """Register the webhook path, /healthz, /readyz and /metrics."""
        app.router.add_post(self.settings.path, self.webhook)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_text)

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.settings.max_body_bytes
        length = request.content_length
        if length is not None:
            if length > limit:
                raise BodyTooLarge
            content = request.content
            if content.is_eof():  # the whole body is buffered already (the usual case)
                return content.read_nowait(-1)
            try:
                return await content.readexactly(length)
            except asyncio.IncompleteReadError as exc:
                return exc.partial  # a short body then fails its signature
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(_CHUNK):
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    async def webhook(self, request: web.Request) -> web.Response:
        """POST {webhook.path}: verify, store durably, answer (SPEC section 6)."""
        started = time.perf_counter()
        try:
            return await self._webhook(request)
        finally:
            self.metrics.ingest_seconds.observe(time.perf_counter() - started)

    def _count(self, label: str, outcome: str) -> None:
        """Count one delivery; the labelled children are looked up once each."""
        key = (label, outcome)
        child = self._counters.get(key)
        if child is None:
            child = self._counters[key] = self.metrics.events_received.labels(*key)
        child.inc()

    async def _webhook(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_body(request)
        except BodyTooLarge:
            self._count("none", "too_large")
            return _error(413, f"body over {self.settings.max_body_bytes} bytes")
        try:
            verify(
                request.headers,
                request.method,
                request.raw_path,
                body,
                api_key=self._api_key,
                secrets=self._secrets,
                tolerance_s=self.settings.tolerance_s,
                algorithm=self.settings.signature,
            )
        except SignatureError as exc:
            self._count("none", "unauthorized")
            log.warning("webhook refused", reason=str(exc), remote=request.remote)
            return _error(401, str(exc))
        try:
            envelope = jsonio.loads(body)
        except (ValueError, UnicodeDecodeError):
            self._count("none", "bad_request")
            return _error(400, "body is not JSON")
        problem = _envelope_problem(envelope)
        if problem:
            self._count("none", "bad_request")
            return _error(400, problem)
        event_id: str = envelope["eventId"]
        event_type: str = envelope["eventType"]
        reference_id = envelope.get("referenceId")
        known = event_type in KNOWN_EVENT_TYPES
        try:
            new = await self.store.insert_event(
                event_id,
                event_type,
                reference_id if isinstance(reference_id, str) else None,
                _transaction_id(event_type, reference_id, envelope.get("data")),
                body,
                request.headers,
                utc_now(),
                status="pending" if known else "ignored",
            )
        except StorageError as exc:
            self._count(event_type_label(event_type), "unavailable")
            log.error("webhook not stored", event_id=event_id, error=str(exc))
            return _error(503, "storage unavailable")
        if not new:
            outcome = "duplicate"
        elif not known:
            outcome = "ignored"
        else:
            outcome = "new"
            self.wake()
        self._count(event_type_label(event_type), outcome)
        return web.Response(body=_OK, content_type="application/json")

    async def healthz(self, request: web.Request) -> web.Response:
        """GET /healthz: the process answers."""
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        """GET /readyz: storage writable and every registered check fine; 503 lists failures."""
        failed: list[str] = []
        try:
            await self.store.write(lambda db: set_meta(db, "ready_probe_at", utc_now()))
        except StorageError as exc:
            failed.append(f"storage not writable: {exc}")
        for check in list(self.ready_checks):
            try:
                problem = await check()
            except Exception as exc:
                problem = f"{getattr(check, '__name__', 'check')} raised {exc!r}"
            if problem:
                failed.append(problem)
        if failed:
            return web.json_response({"status": "not ready", "failed": failed}, status=503)
        return web.json_response({"status": "ready"})

    async def metrics_text(self, request: web.Request) -> web.Response:
        """GET /metrics: Prometheus text; store-backed gauges refreshed first."""
        try:
            states, oldest, depths = await self.store.read(
                lambda db: (
                    deposits_by_state(db),
                    oldest_pending_received_at(db),
                    _event_depths(db),
                )
            )
            self.metrics.set_deposit_states(states)
            lag = max(0.0, time.time() - ms_from_iso(oldest) / 1000) if oldest else 0.0
            self.metrics.processing_lag.set(lag)
            self.metrics.events_pending.set(depths.get("pending", 0))
            self.metrics.events_failed.set(depths.get("failed", 0))
        except StorageError as exc:
            log.warning("metrics without store gauges", error=str(exc))
        self.metrics.commits.set(self.store.commits)
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


def _event_depths(db: Any) -> dict[str, int]:
    return {
        str(status): int(count)
        for status, count in db.execute(
            "SELECT status, COUNT(*) FROM events WHERE status IN ('pending', 'failed')"
            " GROUP BY status"
        )
    }


def _envelope_problem(envelope: Any) -> str | None:
    """Why a parsed body is not an event envelope, or None."""
    if not isinstance(envelope, dict):
        return "body is not a JSON object"
    for key in ("eventId", "eventType"):
        value = envelope.get(key)
        if value is None:
            return f"missing {key}"
        if not isinstance(value, str) or not value.strip():
            return f"{key} must be a non-empty string"
    return None
