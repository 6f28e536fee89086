"""The sd_notify wrapper against a real AF_UNIX datagram socket."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.service.systemd import SystemdNotifier, watchdog_loop


@pytest.fixture
def notify_socket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[socket.socket]:
    """A bound datagram socket standing in for systemd; NOTIFY_SOCKET points at it."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


def receive_all(sock: socket.socket) -> list[str]:
    """Every datagram waiting on the socket, without blocking."""
    messages = []
    sock.setblocking(False)
    try:
        while True:
            messages.append(sock.recv(4096).decode())
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(2)
    return messages


def test_ready_watchdog_stopping_arrive_in_order(notify_socket: socket.socket) -> None:
    """ready(), watchdog() and stopping() each send their datagram to NOTIFY_SOCKET."""
    notifier = SystemdNotifier()
    assert notifier.enabled
    notifier.ready()
    notifier.watchdog()
    notifier.stopping()
    assert [notify_socket.recv(4096) for _ in range(3)] == [
        b"READY=1",
        b"WATCHDOG=1",
        b"STOPPING=1",
    ]


def test_status_is_one_line(notify_socket: socket.socket) -> None:
    """status() sends STATUS= with newlines folded, since the protocol is line based."""
    SystemdNotifier().status("serving on 127.0.0.1:8080\n3 rule sets")
    assert notify_socket.recv(4096) == b"STATUS=serving on 127.0.0.1:8080 3 rule sets"


def test_abstract_socket_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NOTIFY_SOCKET starting with @ names an abstract-namespace socket."""
    name = f"depositd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        SystemdNotifier().ready()
        assert sock.recv(4096) == b"READY=1"


def test_no_notify_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without NOTIFY_SOCKET the notifier is disabled and every call returns quietly."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    notifier = SystemdNotifier()
    assert not notifier.enabled
    notifier.ready()
    notifier.watchdog()
    notifier.status("x")
    notifier.stopping()
    assert notifier.watchdog_interval_s() is None


def test_unreachable_socket_does_not_raise(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A NOTIFY_SOCKET nobody listens on loses the message without raising or leaking."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "missing.sock"))
    notifier = SystemdNotifier()
    notifier.ready()
    notifier.stopping()


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("30000000", None, 30.0),
        ("30000000", "self", 30.0),
        ("500000", None, 0.5),
        ("30000000", "other", None),
        ("0", None, None),
        ("soon", None, None),
        (None, None, None),
    ],
)
def test_watchdog_interval(
    notify_socket: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
    usec: str | None,
    pid: str | None,
    expected: float | None,
) -> None:
    """WATCHDOG_USEC gives the interval, unless WATCHDOG_PID names another process."""
    if usec is not None:
        monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid is not None:
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() if pid == "self" else os.getpid() + 1))
    assert SystemdNotifier().watchdog_interval_s() == expected


async def test_watchdog_loop_pings_repeatedly(notify_socket: socket.socket) -> None:
    """watchdog_loop sends WATCHDOG=1 every quarter interval until cancelled."""
    task = asyncio.create_task(watchdog_loop(SystemdNotifier(), 0.2))
    await asyncio.sleep(0.28)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    messages = receive_all(notify_socket)
    assert set(messages) == {"WATCHDOG=1"}
    # Pings at 0, 0.05, 0.10, ... 0.25 s: about six; allow for a slow machine.
    assert 3 <= len(messages) <= 7


async def test_watchdog_loop_triggers_the_watchdog_for_a_hung_part(
    notify_socket: socket.socket,
) -> None:
    """Once `alive()` says a part hangs (the ingress process), the loop sends WATCHDOG=trigger,
    which makes systemd kill and restart the service at once, and pings no more."""
    answers = iter([True, True, False])
    await asyncio.wait_for(
        watchdog_loop(SystemdNotifier(), 0.04, lambda: next(answers, False)), timeout=5
    )
    assert receive_all(notify_socket) == ["WATCHDOG=1", "WATCHDOG=1", "WATCHDOG=trigger"]


def test_ready_carries_a_status_line(notify_socket: socket.socket) -> None:
    """ready(status) sends READY=1 and STATUS= in one datagram, so that `systemctl status`
    shows a line from the first start, not only after a reload."""
    SystemdNotifier().ready("serving on 127.0.0.1:8080")
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=serving on 127.0.0.1:8080"


async def test_watchdog_loop_without_interval_returns(notify_socket: socket.socket) -> None:
    """watchdog_loop returns at once and sends nothing when no watchdog was asked for."""
    await asyncio.wait_for(watchdog_loop(SystemdNotifier(), None), timeout=1)
    assert receive_all(notify_socket) == []


async def test_watchdog_loop_stops_when_the_loop_hangs(notify_socket: socket.socket) -> None:
    """A blocked event loop sends no pings, which is what lets systemd restart a hung service."""
    task = asyncio.create_task(watchdog_loop(SystemdNotifier(), 0.1))
    await asyncio.sleep(0)  # first ping
    receive_all(notify_socket)

    time.sleep(0.3)  # noqa: ASYNC251 (the point: a stuck loop sends nothing)
    assert receive_all(notify_socket) == []
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_reloading_carries_the_monotonic_clock(notify_socket: socket.socket) -> None:
    """reloading() sends RELOADING=1 and MONOTONIC_USEC (CLOCK_MONOTONIC in µs) in one datagram,
    reloaded() READY=1 with the outcome as STATUS=."""
    notifier = SystemdNotifier()
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloaded("2 problems,\nold rules kept")
    notifier.reloaded()
    head, stamp = notify_socket.recv(4096).decode().split("\n")
    assert head == "RELOADING=1"
    assert before <= int(stamp.removeprefix("MONOTONIC_USEC=")) <= after
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=reload refused: 2 problems, old rules kept"
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=rules and profiles reloaded"
