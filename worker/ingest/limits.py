"""Limits of the webhook listener: head timeout, a cap on open connections, a budget for the
bodies being read, and sampled log lines (refusals, requests for paths not served).

aiohttp closes a connection idle for `keepalive_timeout` (also one that never sends a byte),
but a request head that trickles in a byte at a time, and any number of open connections, are
its caller's business. `GuardedSite` serves an `AppRunner` on a bound socket like
`web.SockSite`, each connection wrapped in a `_Guarded` protocol that:

- closes the connection when a request head is not complete `head_timeout_s` after its first
  byte (the head is complete when the application's handler starts: `track_requests`);
- at `max_connections`, makes room for a new connection by closing the one that has waited
  longest without a request in progress (an idle or trickling one), so that a flood of such
  connections cannot keep real deliveries out; when every connection has a request in progress,
  the new one is answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from worker.logs import get_logger

log = get_logger(__name__)

# Count one refusal by its reason.
CountRefusal = Callable[[str], None]

_BUSY_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nContent-Length: 34\r\nConnection: close\r\n\r\n"
    b'{"error": "too many connections"}\n'
)


class Sampled:
    """Log lines of one kind at most `per_interval` times per `interval_s` for each key; the
    lines left out are counted and logged as one summary line at the end of the interval."""

    def __init__(self, per_interval: int = 5, interval_s: float = 60.0) -> None:
        self.per_interval = per_interval
        self.interval_s = interval_s
        self._windows: dict[str, tuple[float, int]] = {}  # key -> (window start, lines in it)
        self._suppressed: dict[str, int] = {}

    def allow(self, key: str) -> bool:
        """True when a line for `key` may be written now; else it is counted."""
        now = time.monotonic()
        start, n = self._windows.get(key, (now, 0))
        if now - start >= self.interval_s:
            self._flush(key)
            start, n = now, 0
        if n < self.per_interval:
            self._windows[key] = (start, n + 1)
            return True
        if key not in self._suppressed:
            self._suppressed[key] = 0
            remaining = self.interval_s - (now - start)
            # No loop (a synchronous caller): the next line of that key flushes the count.
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_later(remaining, self._flush, key)
        self._suppressed[key] += 1
        return False

    def _flush(self, key: str) -> None:
        count = self._suppressed.pop(key, 0)
        self._windows.pop(key, None)
        if count:
            log.warning(
                "log lines left out", kind=key, count=count, intervalSeconds=self.interval_s
            )


def arrived_path(request: web.BaseRequest) -> str:
    """The path of a request as it arrived (no query), cut to 200 characters, for logs."""
    return request.raw_path.partition("?")[0][:200]


class BodyBudget:
    """The bytes of request bodies being read at once, across all requests of this process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        """Reserve `n` bytes: False when that would exceed the budget."""
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        """Return `n` reserved bytes."""
        self.used -= n


def not_found_log(refused: CountRefusal) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware: a request for a path (or method) not served is logged, sampled, and counted
    as refusal `not_found` (a proxy forwarding to the wrong path shows here)."""
    sampled = Sampled(per_interval=5, interval_s=60.0)

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
            refused("not_found")
            if sampled.allow("no such path"):
                log.warning(
                    "no such path on the webhook port",
                    status=exc.status,
                    method=request.method[:16],
                    path=arrived_path(request),
                    remote=request.remote,
                )
            raise

    return middleware


class Limits:
    """The open connections of one listener and the limits they are held to."""

    def __init__(self, max_connections: int, head_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.head_timeout_s = head_timeout_s
        self.open: dict[_Guarded, None] = {}
        self.by_handler: dict[Any, _Guarded] = {}
        self.sampled = Sampled(per_interval=1, interval_s=60.0)
        self.evicted = 0
        self.refused = 0
        self.head_timeouts = 0

    def admit(self, conn: _Guarded) -> bool:
        """Room for `conn`: True once there is (an idle connection closed if need be)."""
        if len(self.open) >= self.max_connections:
            # The longest idle: a connection answered a moment ago (whose answer may still be
            # on its way out) is the last to go.
            idle = min((c for c in self.open if not c.busy), key=_idle_since, default=None)
            if idle is None:
                self.refused += 1
                self._log_cap("refused")
                return False
            self.evicted += 1
            self._log_cap("closed the oldest connection without a request")
            idle.close()
        self.open[conn] = None
        return True

    def _log_cap(self, what: str) -> None:
        if self.sampled.allow("connection cap"):
            log.warning(
                "connection cap reached",
                maxConnections=self.max_connections,
                action=what,
                closedIdle=self.evicted,
                refused=self.refused,
            )

    def forget(self, conn: _Guarded) -> None:
        """`conn` is closed."""
        self.open.pop(conn, None)
        self.by_handler.pop(conn.inner, None)


class _Guarded(asyncio.Protocol):
    """An aiohttp connection protocol with a head timeout and a place under the cap."""

    def __init__(self, inner: Any, limits: Limits) -> None:
        self.inner = inner
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.idle_since = time.monotonic()
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.limits.admit(self):
            transport.write(_BUSY_503)
            transport.close()
            self.inner = None
            return
        self.limits.by_handler[self.inner] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if not self.busy and self._head_timer is None:
            loop = asyncio.get_running_loop()
            self._head_timer = loop.call_later(self.limits.head_timeout_s, self._head_late)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.inner is None else self.inner.eof_received()

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.inner is not None:
            self.limits.forget(self)
            self.inner.connection_lost(exc)

    def request_started(self) -> None:
        """The head is complete: the handler runs."""
        self.busy = True
        self._cancel_timer()

    def request_done(self) -> None:
        """The handler is done; the next head's first byte starts the head timer again."""
        self.busy = False
        self.idle_since = time.monotonic()

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.busy:
            self.limits.head_timeouts += 1
            self.close()

    def _cancel_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def close(self) -> None:
        """Close at once (what is unanswered is dropped: no request is in progress)."""
        self.limits.open.pop(self, None)
        if self.transport is not None:
            self.transport.abort()


def _idle_since(conn: _Guarded) -> float:
    return conn.idle_since


def track_requests(limits: Limits) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware telling each connection's guard when a request is in progress."""

    @web.middleware
    async def track(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        conn = limits.by_handler.get(request.protocol)
        if conn is None:
            return await handler(request)
        conn.request_started()
        try:
            return await handler(request)
        finally:
            conn.request_done()

    return track


class GuardedSite(web.SockSite):
    """`web.SockSite` whose connections are held to `limits`."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, limits: Limits) -> None:
        super().__init__(runner, sock, backlog=1024)
        self.limits = limits

    async def start(self) -> None:
        """Listen; every connection is wrapped in its guard."""
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        limits = self.limits
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Guarded(server(), limits), sock=self._sock, backlog=self._backlog
        )
