"""The link between the ingress process (`worker.ingest.process`) and `depositd serve`'s own
process.

One stream socket (a socketpair made by `serve`), frames of a 4-byte length and a `marshal`-ed
tuple; only these two processes of one service ever speak on it. Frames are gathered per
event-loop turn and written together.

From the ingress process:
    ("E", id, row)                  store this accepted `EventRow`
    ("R", id) / ("M", id)           the /readyz answer / the /metrics text
    ("H", id)                       the /healthz answer (whether `serve`'s tasks run)
    ("O", id)                       the /metrics text in the OpenMetrics format
    ("C", counts, seconds)          deliveries answered since the last such frame:
                                    {(event type label, outcome): n}, [seconds to answer]
    ("F", {reason: n})              refusals since the last such frame, by reason
    ("U",)                          listening: `serve` may report ready
    ("p",)                          the answer to a ping
From `serve`:
    ("e", id, code, error)          STORED_NEW or STORED_KNOWN after the commit; NOT_STORED
                                    (and why) when the commit failed or the row was not queued,
                                    UNAVAILABLE when the database is (`serve` logs the outage)
    ("h", id, status, body)         an HTTP answer for "R" / "H" / "M" / "O"
    ("P",)                          a ping (for the watchdog): answer "p"
"""

from __future__ import annotations

import asyncio
import json
import marshal
import struct
from collections.abc import Callable
from typing import Any

from worker.errors import StorageError, StorageUnavailable
from worker.ingest.endpoint import Ingress
from worker.logs import get_logger
from worker.store.sqlitestore import EventRow

log = get_logger(__name__)

_LENGTH = struct.Struct("!I")

STORED_NEW, STORED_KNOWN, NOT_STORED, UNAVAILABLE = 1, 2, 0, 3


class LinkLost(StorageError):
    """The other process is gone: nothing more can be stored through this link."""


class _Framed(asyncio.Protocol):
    """Frame codec over a stream transport; subclasses handle the messages."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        pos, size = 0, len(buffer)
        view = memoryview(buffer)
        try:
            while size - pos >= 4:
                (length,) = _LENGTH.unpack_from(buffer, pos)
                if size - pos - 4 < length:
                    break
                message = marshal.loads(view[pos + 4 : pos + 4 + length])
                pos += 4 + length
                self.on_message(message)
        finally:
            view.release()
        del buffer[:pos]

    def send(self, message: tuple[Any, ...]) -> None:
        """Queue one frame; written with the others of this loop turn."""
        data = marshal.dumps(message)
        self._out += (_LENGTH.pack(len(data)), data)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _before_flush(self) -> None:
        """Last frames of this loop turn."""

    def _flush(self) -> None:
        self._before_flush()
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def on_message(self, message: tuple[Any, ...]) -> None:
        raise NotImplementedError


class CoreSide(_Framed):
    """`serve`'s end: stores rows through the `Ingress`, answers /readyz and /metrics."""

    def __init__(self, ingress: Ingress, on_up: Callable[[], None]) -> None:
        super().__init__()
        self.ingress = ingress
        self.on_up = on_up
        self._tasks: set[asyncio.Task[None]] = set()
        self._heard = asyncio.get_running_loop().time()  # the last frame from the ingress process

    def data_received(self, data: bytes) -> None:
        self._heard = asyncio.get_running_loop().time()
        super().data_received(data)

    def heard_within(self, seconds: float) -> bool:
        """True when the ingress process sent anything in the last `seconds`."""
        return asyncio.get_running_loop().time() - self._heard < seconds

    async def keep_pinging(self, every_s: float) -> None:
        """Ping the ingress process every `every_s` (its answers keep `heard_within` true)."""
        while not self.closed.done():
            self.send(("P",))
            await asyncio.sleep(every_s)

    def on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "E":
            self._store(message[1], message[2])
        elif kind == "C":
            self.ingress.record_counts(message[1], message[2])
        elif kind == "F":
            self.ingress.count_refusals(message[1])
        elif kind == "H":
            status, answer = self.ingress.health()
            self.send(("h", message[1], status, json.dumps(answer).encode()))
        elif kind in ("R", "M", "O"):
            task = asyncio.create_task(self._answer(kind, message[1]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif kind == "U":
            self.on_up()
        elif kind == "p":
            pass  # heard: data_received noted the time
        else:
            log.error("unknown message from the ingress process", kind=str(kind))

    def _store(self, ident: int, row: EventRow) -> None:
        # A failure travels back as text: the ingress process logs it with the delivery.
        try:
            future = self.ingress.queue_row(row)
        except StorageError as exc:
            self.send(("e", ident, NOT_STORED, str(exc)))
            return

        def stored(future: asyncio.Future[bool]) -> None:
            if future.cancelled():
                self.send(("e", ident, NOT_STORED, "cancelled"))
            elif (exc := future.exception()) is not None:
                code = UNAVAILABLE if isinstance(exc, StorageUnavailable) else NOT_STORED
                self.send(("e", ident, code, str(exc)))
            else:
                self.send(("e", ident, STORED_NEW if future.result() else STORED_KNOWN, ""))

        future.add_done_callback(stored)

    async def _answer(self, kind: str, ident: int) -> None:
        try:
            if kind == "R":
                status, answer = await self.ingress.readiness()
                body = json.dumps(answer).encode()
            else:
                status, body = 200, await self.ingress.metrics_body(kind == "O")
        except Exception as exc:  # answered all the same: the ingress process is waiting
            log.error("cannot answer the ingress process", kind=kind, error=repr(exc))
            status, body = 500, json.dumps({"error": "internal error"}).encode()
        self.send(("h", ident, status, body))


class FrontSide(_Framed):
    """The ingress process's end: hands rows over and waits for the commit."""

    def __init__(self) -> None:
        super().__init__()
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._next = 0
        self._counts: dict[tuple[str, str], int] = {}
        self._seconds: list[float] = []
        self._refusals: dict[str, int] = {}

    def _ask(self, message: tuple[Any, ...]) -> asyncio.Future[Any]:
        if self.closed.done():
            raise LinkLost("depositd is gone")
        self._next += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = future
        self.send((message[0], self._next, *message[1:]))
        return future

    async def store(self, row: EventRow) -> bool:
        """Store one accepted row: True when new; `StorageError` when not stored."""
        code, error = await self._ask(("E", row))
        if code == NOT_STORED:
            raise StorageError(error)
        if code == UNAVAILABLE:
            raise StorageUnavailable(error)
        return bool(code == STORED_NEW)

    async def http(self, kind: str) -> tuple[int, bytes]:
        """The (status, body) of /readyz ("R"), /healthz ("H") or /metrics ("M", or "O" for
        OpenMetrics)."""
        status, body = await self._ask((kind,))
        return int(status), bytes(body)

    def count(self, label: str, outcome: str, seconds: float) -> None:
        """Count one delivery in `serve`'s metrics (sent once per loop turn, with the others)."""
        key = (label, outcome)
        self._counts[key] = self._counts.get(key, 0) + 1
        self._seconds.append(seconds)
        self._schedule_flush()

    def refused(self, reason: str) -> None:
        """Count one refusal in `serve`'s figures (sent with the counts)."""
        self._refusals[reason] = self._refusals.get(reason, 0) + 1
        self._schedule_flush()

    def _before_flush(self) -> None:
        if self._refusals:
            refusals, self._refusals = self._refusals, {}
            self.send(("F", refusals))
        if self._counts:
            counts, self._counts = self._counts, {}
            seconds, self._seconds = self._seconds, []
            self.send(("C", counts, seconds))

    def on_message(self, message: tuple[Any, ...]) -> None:
        if message[0] == "P":
            self.send(("p",))
            return
        future = self._waiting.pop(message[1], None)
        if future is None or future.done():
            return
        future.set_result((message[2], message[3]))  # (code, error) or (status, body)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(LinkLost("depositd is gone"))
