"""The webhook endpoint and the operational endpoints (SPEC section 6).

Thin on purpose: read at most `max_body_bytes`, verify the raw bytes, check the envelope's two
required keys (`Gate`), commit the raw event, answer. Everything else happens in the processor,
which this handler only wakes. `depositd serve` runs the webhook endpoint in a process of its
own (`worker.front`) that hands accepted rows to this process's store; tests and the harness
run it here, on the same `Gate` and `webhook_handler`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from worker.errors import StorageError
from worker.logs import get_logger
from worker.metrics import (
    CONTENT_TYPE,
    OPENMETRICS_CONTENT_TYPE,
    Metrics,
    event_type_label,
    wants_openmetrics,
)
from worker.provider import jsonio
from worker.provider.models import DEPOSIT_EVENT_TYPES, KNOWN_EVENT_TYPES
from worker.provider.signing import SignatureError, verify
from worker.queries import deposits_by_state, oldest_pending_received_at, set_meta, utc_now
from worker.settings import WebhookSettings
from worker.store import EVENT_ROW_STATUS, EventRow, Store, event_row
from worker.tracker import ms_from_iso

log = get_logger(__name__)

# A readiness check answers None when fine, else what is wrong (shown in /readyz).
ReadyCheck = Callable[[], Awaitable[str | None]]

_OK = b"{}"
_CHUNK = 64 * 1024
_READ_TIMEOUT_S = 10.0  # a body still arriving after this is answered 408


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


@dataclass(frozen=True)
class Refused:
    """A delivery answered with an error before anything is stored."""

    status: int
    message: str
    outcome: str  # the events_received outcome: unauthorized, bad_request, too_large

    def response(self) -> web.Response:
        return _error(self.status, self.message)


@dataclass(frozen=True)
class Accepted:
    """A verified delivery with a well-formed envelope: the row to store."""

    row: EventRow
    label: str  # the event type as a metrics label

    @property
    def known(self) -> bool:
        return self.row[EVENT_ROW_STATUS] == "pending"


# Store one accepted row: True when new, False for a known eventId; StorageError when not stored.
StoreRow = Callable[[EventRow], Awaitable[bool]]
# Count one delivery: (event type label, outcome, seconds taken to answer).
Record = Callable[[str, str, float], None]


class Gate:
    """What a delivery passes before it is stored (SPEC section 6): size, signature, envelope.

    Shared by the in-process endpoint and the ingress process (`worker.front`).
    """

    def __init__(self, settings: WebhookSettings) -> None:
        self.settings = settings
        self._api_key = settings.api_key.get_secret_value()
        self._secrets = [s.get_secret_value() for s in settings.secret]

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
                async with asyncio.timeout(_READ_TIMEOUT_S):
                    return await content.readexactly(length)
            except asyncio.IncompleteReadError as exc:
                return exc.partial  # a short body then fails its signature
        chunks: list[bytes] = []
        size = 0
        async with asyncio.timeout(_READ_TIMEOUT_S):
            async for chunk in request.content.iter_chunked(_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge
                chunks.append(chunk)
        return b"".join(chunks)

    async def check(self, request: web.Request) -> Accepted | Refused:
        """Read, verify and parse one delivery."""
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            # The signature covers the bytes as sent; they are not unpacked first.
            return Refused(
                415,
                f"Content-Encoding {encoding} is not accepted; send the body as is",
                "bad_request",
            )
        try:
            body = await self._read_body(request)
        except BodyTooLarge:
            return Refused(413, f"body over {self.settings.max_body_bytes} bytes", "too_large")
        except TimeoutError:
            return Refused(408, f"body not received within {_READ_TIMEOUT_S:g} s", "bad_request")
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
            return Refused(401, str(exc), "unauthorized")
        try:
            envelope = jsonio.loads(body)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return Refused(400, "body is not JSON", "bad_request")
        problem = _envelope_problem(envelope)
        if problem:
            return Refused(400, problem, "bad_request")
        event_type: str = envelope["eventType"]
        reference_id = envelope.get("referenceId")
        reference = reference_id if isinstance(reference_id, str) else None
        transaction_id = _transaction_id(event_type, reference_id, envelope.get("data"))
        keys = {
            "eventId": envelope["eventId"],
            "eventType": event_type,
            "referenceId": reference,
            "transactionId": transaction_id,
        }
        for name, value in keys.items():
            if value is not None and not _is_text(value):
                return Refused(400, f"{name} holds a lone surrogate escape", "bad_request")
        row = event_row(
            envelope["eventId"],
            event_type,
            reference,
            transaction_id,
            body,
            request.headers,
            utc_now(),
            "pending" if event_type in KNOWN_EVENT_TYPES else "ignored",
        )
        return Accepted(row, event_type_label(event_type))


def webhook_handler(
    gate: Gate, store_row: StoreRow, record: Record
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """POST {webhook.path}: verify, store durably, answer (SPEC section 6)."""

    async def webhook(request: web.Request) -> web.Response:
        started = time.perf_counter()
        verdict = await gate.check(request)
        if isinstance(verdict, Refused):
            record("none", verdict.outcome, time.perf_counter() - started)
            # The reason names what was wrong, never a value from the request.
            log.warning(
                "webhook refused",
                status=verdict.status,
                reason=verdict.message,
                remote=request.remote,
            )
            return verdict.response()
        try:
            new = await store_row(verdict.row)
        except Exception as exc:  # whatever kept it from being stored: never 200, it is retried
            record(verdict.label, "unavailable", time.perf_counter() - started)
            log.error("webhook not stored", eventId=verdict.row[0], error=str(exc))
            return _error(503, "storage unavailable")
        outcome = "duplicate" if not new else "new" if verdict.known else "ignored"
        record(verdict.label, outcome, time.perf_counter() - started)
        return web.Response(body=_OK, content_type="application/json")

    return webhook


class Ingress:
    """The endpoints of SPEC section 6 on the store, the metrics and the ready checks."""

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
        self._counters: dict[tuple[str, str], Any] = {}

    def add_routes(self, app: web.Application) -> None:
        """Register the webhook path, /healthz, /readyz and /metrics."""
        app.router.add_post(
            self.settings.path, webhook_handler(Gate(self.settings), self.queue_row, self.record)
        )
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_text)

    def queue_row(self, row: EventRow) -> asyncio.Future[bool]:
        """Queue an accepted row for the next commit; the processor is woken for a new one."""
        future = self.store.queue_event(row)
        if row[EVENT_ROW_STATUS] == "pending":
            future.add_done_callback(self._wake_if_new)
        return future

    def _wake_if_new(self, future: asyncio.Future[bool]) -> None:
        if not future.cancelled() and future.exception() is None and future.result():
            self.wake()

    def record(self, label: str, outcome: str, seconds: float) -> None:
        """Count one delivery."""
        self.record_counts({(label, outcome): 1}, (seconds,))

    def record_counts(self, counts: dict[tuple[str, str], int], seconds: Sequence[float]) -> None:
        """Count deliveries: n per (event type label, outcome), and each one's time to answer."""
        for key, n in counts.items():
            child = self._counters.get(key)
            if child is None:  # the labelled children are looked up once each
                child = self._counters[key] = self.metrics.events_received.labels(*key)
            child.inc(n)
        observe = self.metrics.ingest_seconds.observe
        for value in seconds:
            observe(value)

    async def readiness(self) -> tuple[int, dict[str, Any]]:
        """Storage writable and every registered check fine: (200 or 503, the JSON answer)."""
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
            return 503, {"status": "not ready", "failed": failed}
        return 200, {"status": "ready"}

    async def readyz(self, request: web.Request) -> web.Response:
        """GET /readyz: 200 when ready; 503 lists the failures."""
        status, answer = await self.readiness()
        return web.json_response(answer, status=status)

    async def metrics_body(self, openmetrics_format: bool = False) -> bytes:
        """Prometheus (or OpenMetrics) text; the store-backed gauges refreshed first."""
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
        self.metrics.count_commits(self.store.commits)
        return self.metrics.render(openmetrics_format)

    async def metrics_text(self, request: web.Request) -> web.Response:
        """GET /metrics."""
        om = wants_openmetrics(request.headers.get("Accept"))
        return metrics_response(await self.metrics_body(om), om)


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: the process answers."""
    return web.json_response({"status": "ok"})


def metrics_response(body: bytes, openmetrics_format: bool = False) -> web.Response:
    """A /metrics answer, in the text format the scrape asked for."""
    kind = OPENMETRICS_CONTENT_TYPE if openmetrics_format else CONTENT_TYPE
    return web.Response(body=body, headers={"Content-Type": kind})


def _event_depths(db: Any) -> dict[str, int]:
    return {
        str(status): int(count)
        for status, count in db.execute(
            "SELECT status, COUNT(*) FROM events WHERE status IN ('pending', 'failed')"
            " GROUP BY status"
        )
    }


def _is_text(value: str) -> bool:
    """False for a string SQLite cannot store as text (JSON's "\\ud800" escapes allow that)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


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
