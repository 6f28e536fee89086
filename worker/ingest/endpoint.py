"""The webhook endpoint and the operational endpoints (docs/reference.md).

Thin on purpose: read at most `max_body_bytes`, verify the raw bytes, check the envelope's two
required keys (`Gate`), commit the raw event, answer. Everything else happens in the processor,
which this handler only wakes. `depositd serve` runs the webhook endpoint in a process of its
own (`worker.ingest.process`) that hands accepted rows to this process's store; tests and the
harness
run it here, on the same `Gate` and `webhook_handler`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from worker.clock import ms_from_iso, utc_now
from worker.config.settings import WebhookSettings
from worker.errors import StorageError, StorageUnavailable
from worker.ingest.limits import BodyBudget, CountRefusal, Sampled, arrived_path, not_found_log
from worker.ingest.secret_watch import SecretWatch
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
from worker.provider.signing import (
    SignatureError,
    verify_headers,
    verify_signature,
    verifying_scheme,
)
from worker.store.deposits import deposits_by_state
from worker.store.events import oldest_pending_received_at, open_depths
from worker.store.meta import probe, set_meta
from worker.store.sqlitestore import EVENT_ROW_STATUS, EventRow, Store, event_row

log = get_logger(__name__)

# A readiness check answers None when fine, else what is wrong (shown in /readyz).
ReadyCheck = Callable[[], Awaitable[str | None]]
# A health check names what of the process is down (shown in /healthz); empty when all runs.
HealthCheck = Callable[[], list[str]]

_OK = b"{}"
_CHUNK = 64 * 1024
_READ_TIMEOUT_S = 10.0  # a body still arriving after this is answered 408
_REFUSALS_WRITE_S = 5.0  # refusal counts reach the database this long after the first one
_MAX_PATH = 2048  # a proxy header naming the original path is not tried when longer
_LOG_INTERVAL_S = 60.0  # refusal lines: at most 5 per reason per interval, then a count


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
    outcome: str  # the events_received outcome: unauthorized, bad_request, too_large, unavailable
    reason: str  # finer, for the refusal counts and the sampled log: bad_signature, ...
    retry_after: int | None = None
    # Worked out only for a log line that is written (it costs an HMAC per known scheme):
    # what else the log line should say, e.g. the scheme a bad signature verifies with.
    more: Callable[[], dict[str, str]] | None = None

    def response(self) -> web.Response:
        answer = _error(self.status, self.message)
        if self.retry_after is not None:
            answer.headers["Retry-After"] = str(self.retry_after)
        return answer


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


def _header_reason(message: str) -> str:
    if message.startswith("missing header"):
        return "missing_header"
    if message.startswith("unknown API-KEY"):
        return "unknown_api_key"
    if "too old" in message or "in the future" in message:
        return "timestamp_window"
    return "bad_timestamp"


class Gate:
    """What a delivery passes before it is stored (docs/reference.md): headers (API-KEY and the
    timestamp window, before any of the body is read), size, signature, envelope.

    Shared by the in-process endpoint and the ingress process (`worker.ingest.process`).
    """

    def __init__(self, settings: WebhookSettings) -> None:
        self.settings = settings
        self._api_key = settings.api_key.get_secret_value()
        self._secrets = [s.get_secret_value() for s in settings.secret]
        self.scheme = settings.scheme
        self.budget = BodyBudget(settings.body_budget_bytes)

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.settings.max_body_bytes
        length = request.content_length
        if length is not None:
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

    def _before_body(self, request: web.Request) -> Refused | None:
        """What the head alone refuses: an encoding, the headers, a declared size."""
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            # The signature covers the bytes as sent; they are not unpacked first. The value
            # is not repeated: it is the sender's text.
            return Refused(
                415,
                "Content-Encoding is not accepted; send the body as is",
                "bad_request",
                "content_encoding",
            )
        try:
            verify_headers(
                request.headers, api_key=self._api_key, tolerance_s=self.settings.tolerance_s
            )
        except SignatureError as exc:
            return Refused(401, str(exc), "unauthorized", _header_reason(str(exc)))
        length = request.content_length
        if length is not None and length > self.settings.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> Refused:
        return Refused(
            413, f"body over {self.settings.max_body_bytes} bytes", "too_large", "too_large"
        )

    async def check(self, request: web.Request) -> Accepted | Refused:
        """Check the head, then read, verify and parse one delivery."""
        refused = self._before_body(request)
        if refused is not None:
            return refused
        length = request.content_length
        reserved = self.settings.max_body_bytes if length is None else length
        if not self.budget.take(reserved):
            return Refused(
                503, "too many request bodies in flight; retry", "unavailable", "busy", 1
            )
        try:
            body = await self._read_body(request)
        except BodyTooLarge:
            return self._too_large()
        except TimeoutError:
            return Refused(
                408, f"body not received within {_READ_TIMEOUT_S:g} s", "bad_request", "slow_body"
            )
        finally:
            self.budget.give(reserved)
        try:
            verify_signature(
                request.headers,
                request.method,
                request.raw_path,
                body,
                secrets=self._secrets,
                scheme=self.scheme,
            )
        except SignatureError:
            return self._bad_signature(request, body)
        return self._parse(body, request)

    def _bad_signature(self, request: web.Request, body: bytes) -> Refused:
        """What was checked, so that a proxy that rewrote the path or changed the body shows:
        the path and the body's size and digest as they arrived (never a secret); and the path
        that was signed when a proxy's header names one the signature verifies for."""
        digest = hashlib.sha256(body).hexdigest()[:16]
        message = (
            f"bad API-SIGNATURE (checked over {request.method} {arrived_path(request)},"
            f" {len(body)} body bytes, sha256 {digest}, as they arrived)"
        )
        signed = self._signed_path(request, body) if self.scheme.covers_path else None
        if signed is not None:
            message += f"; it verifies for the path {signed}: a proxy rewrote the path"
        headers, method, target = request.headers, request.method, request.raw_path

        def other_scheme() -> dict[str, str]:
            other = verifying_scheme(
                headers, method, target, body, secrets=self._secrets, configured=self.scheme
            )
            if other is None:
                return {}
            lines = ", ".join(f"webhook.{line}" for line in other.changes_from(self.scheme))
            return {
                "verifiesWith": lines,
                "hint": f"the provider signs with {other.describe()}, not with"
                f" {self.scheme.describe()}: set {lines} (docs/signatures.md)",
            }

        return Refused(401, message, "unauthorized", "bad_signature", more=other_scheme)

    def _signed_path(self, request: web.Request, body: bytes) -> str | None:
        """A path a proxy says the request had (X-Original-URI, X-Forwarded-Uri,
        X-Forwarded-Prefix + the path) that the signature verifies for, else None. Only a path
        the signature verifies for is named, so no unauthenticated value is repeated."""
        headers = request.headers
        prefix = headers.get("X-Forwarded-Prefix", "").rstrip("/")
        candidates = [
            headers.get("X-Original-URI"),
            headers.get("X-Forwarded-Uri"),
            prefix + request.raw_path if prefix else None,
        ]
        for path in candidates:
            if not path or len(path) > _MAX_PATH or path == request.raw_path:
                continue
            try:
                verify_signature(
                    headers,
                    request.method,
                    path,
                    body,
                    secrets=self._secrets,
                    scheme=self.scheme,
                )
            except SignatureError:
                continue
            return path.partition("?")[0]
        return None

    def _parse(self, body: bytes, request: web.Request) -> Accepted | Refused:
        try:
            envelope = jsonio.loads(body)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return Refused(400, "body is not JSON", "bad_request", "bad_envelope")
        problem = _envelope_problem(envelope)
        if problem:
            return Refused(400, problem, "bad_request", "bad_envelope")
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
                return Refused(
                    400, f"{name} holds a lone surrogate escape", "bad_request", "bad_envelope"
                )
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


# Retry-After of a delivery that could not be stored.
STORAGE_RETRY_AFTER_S = 5


def webhook_handler(
    gate: Gate, store_row: StoreRow, record: Record, refused: CountRefusal = lambda _: None
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """POST {webhook.path}: verify, store durably, answer (docs/reference.md).

    Refusals are counted by reason; their log lines are sampled (`Sampled`: a few per reason
    a minute, then one line with the count left out), so a flood cannot drown the log.
    """
    sampled = Sampled(per_interval=5, interval_s=_LOG_INTERVAL_S)

    async def webhook(request: web.Request) -> web.Response:
        started = time.perf_counter()
        verdict = await gate.check(request)
        if isinstance(verdict, Refused):
            record("none", verdict.outcome, time.perf_counter() - started)
            refused(verdict.reason)
            # The reason names what was wrong, never a header or body value of the request.
            if sampled.allow(f"webhook refused: {verdict.reason}"):
                log.warning(
                    "webhook refused",
                    status=verdict.status,
                    reason=verdict.message,
                    remote=request.remote,
                    **(verdict.more() if verdict.more is not None else {}),
                )
            return verdict.response()
        try:
            new = await store_row(verdict.row)
        except Exception as exc:  # whatever kept it from being stored: never 200, it is retried
            record(verdict.label, "unavailable", time.perf_counter() - started)
            # The database unavailable: `serve` logs the outage once, with the deliveries
            # refused counted (`worker.store.outage`), not a line per delivery.
            if not isinstance(exc, StorageUnavailable) and sampled.allow("webhook not stored"):
                log.error("webhook not stored", eventId=verdict.row[0], error=str(exc))
            answer = _error(503, "storage unavailable")
            # The database is back within seconds after a failover (docs/postgresql.md).
            answer.headers["Retry-After"] = str(STORAGE_RETRY_AFTER_S)
            return answer
        outcome = "duplicate" if not new else "new" if verdict.known else "ignored"
        record(verdict.label, outcome, time.perf_counter() - started)
        return web.Response(body=_OK, content_type="application/json")

    return webhook


class Ingress:
    """The endpoints of docs/reference.md on the store, the metrics and the ready checks."""

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
        self.health_checks: list[HealthCheck] = []
        self._counters: dict[tuple[str, str], Any] = {}
        self.refusals: dict[str, int] = {}  # since this process started, by reason
        self.started_at = utc_now()
        self._refusals_write: asyncio.TimerHandle | None = None
        self._writes: set[asyncio.Future[None]] = set()
        # Deliveries refused for their signature or API key, none accepted in between: alerted.
        self.secret_watch = SecretWatch(store)

    def add_routes(self, app: web.Application) -> None:
        """Register the webhook path and /healthz; /readyz and /metrics too unless they have a
        listener of their own (`webhook.ops_listen`)."""
        app.middlewares.append(not_found_log(self.count_refusal))
        gate = Gate(self.settings)
        app.router.add_post(
            self.settings.path,
            webhook_handler(gate, self.queue_row, self.record, self.count_refusal),
        )
        app.router.add_get("/healthz", self.healthz)
        if self.settings.ops_listen is None:
            self.add_ops_routes(app)

    def add_ops_routes(self, app: web.Application) -> None:
        """Register /readyz and /metrics."""
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_text)

    def count_refusal(self, reason: str) -> None:
        """Count one refused delivery (or request for a path not served)."""
        self.count_refusals({reason: 1})

    def count_refusals(self, counts: dict[str, int]) -> None:
        """Count refusals by reason: the metric, and (a few seconds later, in one write) the
        meta row `depositd status` shows."""
        for reason, n in counts.items():
            self.metrics.webhook_refusals.labels(reason=reason).inc(n)
            self.refusals[reason] = self.refusals.get(reason, 0) + n
        self.secret_watch.refused(counts)
        if self._refusals_write is None:
            self._refusals_write = asyncio.get_running_loop().call_later(
                _REFUSALS_WRITE_S, self._write_refusals
            )

    def _write_refusals(self) -> None:
        self._refusals_write = None
        value = json.dumps({"since": self.started_at, "counts": self.refusals}, sort_keys=True)
        if not self.store.is_open:
            return
        task = asyncio.ensure_future(
            self.store.write(lambda db: set_meta(db, "webhook_refusals", value))
        )
        self._writes.add(task)
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Future[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("refusal counts not recorded", error=str(task.exception()))

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
        if any(label != "none" and n for (label, _), n in counts.items()):
            self.secret_watch.accepted()  # a label: the delivery passed its signature
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
        # Read-only: the writer is open and the database answers a read (a probe writes nothing).
        if not self.store.is_open:
            failed.append("storage not writable: store is closed")
        else:
            try:
                await self.store.read(probe)
            except StorageError as exc:
                failed.append(f"storage not readable: {exc}")
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

    def health(self) -> tuple[int, dict[str, Any]]:
        """The process's tasks all run: (200 or 503, the JSON answer naming those down)."""
        problems = [problem for check in self.health_checks for problem in check()]
        if problems:
            return 503, {"status": "failing", "problems": problems}
        return 200, {"status": "ok"}

    async def healthz(self, request: web.Request) -> web.Response:
        """GET /healthz: 200 while the process answers and its long-running tasks run."""
        status, answer = self.health()
        return web.json_response(answer, status=status)

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
                    open_depths(db),
                )
            )
            self.metrics.set_deposit_states(states)
            lag = max(0.0, time.time() - ms_from_iso(oldest) / 1000) if oldest else 0.0
            self.metrics.processing_lag.set(lag)
            self.metrics.events_pending.set(depths.get("pending", 0))
            self.metrics.events_failed.set(depths.get("failed", 0))
        except StorageError as exc:
            if not self.store.outage.note("metricsWithoutStore"):  # counted in the outage
                log.warning("metrics without store gauges", error=str(exc))
        self.metrics.count_commits(self.store.commits)
        return self.metrics.render(openmetrics_format)

    async def metrics_text(self, request: web.Request) -> web.Response:
        """GET /metrics."""
        om = wants_openmetrics(request.headers.get("Accept"))
        return metrics_response(await self.metrics_body(om), om)


def metrics_response(body: bytes, openmetrics_format: bool = False) -> web.Response:
    """A /metrics answer, in the text format the scrape asked for."""
    kind = OPENMETRICS_CONTENT_TYPE if openmetrics_format else CONTENT_TYPE
    return web.Response(body=body, headers={"Content-Type": kind})


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
