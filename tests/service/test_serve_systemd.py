"""`depositd serve` under a stand-in systemd: READY=1, WATCHDOG=1, STOPPING=1 on a real socket."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.configs import serve_config, write_config
from tests.support.paths import RULES
from tests.support.ports import free_port
from tests.support.processes import Processes, children

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    """A bound, non-blocking AF_UNIX datagram socket standing in for systemd's notify socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.setblocking(False)
    yield sock
    sock.close()


def systemd_config(tmp_path: Path, provider_url: str, port: int, rules: Path | None = None) -> Path:
    """A serve config with the shipped rules (or `rules`) and profiles and a loopback listener."""
    cfg = serve_config(
        tmp_path / "depositd.db",
        provider_url,
        port,
        scheduler={"enabled": False},
        rules=str(rules or RULES),
    )
    return write_config(tmp_path, cfg)


async def start_serve(
    processes: Processes, config: Path, notify: socket.socket, log: Path
) -> asyncio.subprocess.Process:
    """`python -m worker serve` with NOTIFY_SOCKET and a two-second watchdog."""
    env = {k: v for k, v in os.environ.items() if k != "WATCHDOG_PID"}
    env.update(
        NOTIFY_SOCKET=str(notify.getsockname()),
        WATCHDOG_USEC="2000000",
        PYTHONPATH=str(ROOT),
    )
    with log.open("wb") as err:
        return processes.own(
            await asyncio.create_subprocess_exec(
                *[sys.executable, "-m", "worker", "serve", "--config", str(config)],
                cwd=ROOT,
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
            )
        )


async def serve_at_ready(
    tmp_path: Path, provider_url: str, notify: socket.socket, processes: Processes
) -> tuple[asyncio.subprocess.Process, int, Path]:
    """`start_serve` on a free port, returned once READY=1 comes: the process, port and log."""
    port = free_port()
    log = tmp_path / "serve.log"
    proc = await start_serve(processes, systemd_config(tmp_path, provider_url, port), notify, log)
    await messages_until(notify, "READY=1")
    return proc, port, log


async def next_message(sock: socket.socket, within: float) -> str:
    """The next datagram on the notify socket."""
    loop = asyncio.get_running_loop()
    data = await asyncio.wait_for(loop.sock_recv(sock, 4096), within)
    return data.decode()


async def messages_until(sock: socket.socket, prefix: str, within: float = 15) -> list[str]:
    """The datagrams up to the first that starts with `prefix` (included)."""
    got: list[str] = []
    deadline = time.monotonic() + within
    while not (got and got[-1].startswith(prefix)):
        got.append(await next_message(sock, max(0.01, deadline - time.monotonic())))
    return got


async def messages_for(sock: socket.socket, seconds: float) -> list[str]:
    """Every datagram that arrives within `seconds`."""
    got: list[str] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            got.append(await next_message(sock, left))
        except TimeoutError:
            break
    return got


async def test_ready_after_port_bound_watchdog_then_stopping(
    tmp_path: Path, provider_url: str, notify_socket: socket.socket, processes: Processes
) -> None:
    """READY=1 comes once the rules, profiles and store are checked, before the stages start:
    a request sent then is answered (the socket holds it meanwhile), STATUS= says when it
    serves, WATCHDOG=1 repeats, SIGTERM sends STOPPING=1, exit 0."""
    port = free_port()
    log = tmp_path / "serve.log"
    proc = await start_serve(
        processes, systemd_config(tmp_path, provider_url, port), notify_socket, log
    )
    try:
        before_ready: list[str] = []
        while not (message := await next_message(notify_socket, 15)).startswith("READY=1"):
            before_ready.append(message)
        # The first start already says where it is (`systemctl status` shows it).
        assert message == "READY=1\nSTATUS=starting: deliveries queue until serving", message
        assert before_ready == [], before_ready
        # No retry: by the time systemd hears READY=1 a request must be answered.
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/healthz") as resp,
        ):
            assert resp.status == 200
        until_serving = await messages_until(notify_socket, "STATUS=serving")
        assert until_serving[-1] == f"STATUS=serving on 127.0.0.1:{port}", until_serving
        assert set(until_serving[:-1]) <= {"WATCHDOG=1"}, until_serving

        after_ready = await messages_for(notify_socket, 1.6)
        # WATCHDOG_USEC=2s: a ping every half second, so about three in 1.6 s.
        assert after_ready.count("WATCHDOG=1") >= 2, after_ready
        assert set(after_ready) == {"WATCHDOG=1"}, after_ready

        proc.send_signal(signal.SIGTERM)
        while (message := await next_message(notify_socket, 10)) != "STOPPING=1":
            assert message == "WATCHDOG=1", message
        assert await asyncio.wait_for(proc.wait(), 20) == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # sent exactly once
    assert not [m for m in before_ready + until_serving + after_ready if m.startswith("READY=1")]


async def test_a_stop_or_a_reload_asked_during_the_start_is_made_once_serving(
    tmp_path: Path, provider_url: str, notify_socket: socket.socket, processes: Processes
) -> None:
    """SIGHUP then SIGTERM as soon as READY=1 comes (the stages not started yet): neither
    ends the process before it serves (a SIGHUP's default would kill it); the reload is made
    once the rules can be reloaded, then the stop is a clean one (STOPPING=1, exit 0)."""
    proc, port, log = await serve_at_ready(tmp_path, provider_url, notify_socket, processes)
    try:
        proc.send_signal(signal.SIGHUP)
        await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        got = await messages_until(notify_socket, "STOPPING=1")
        assert await asyncio.wait_for(proc.wait(), 20) == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert f"STATUS=serving on 127.0.0.1:{port}" in got, got
    assert any(m.startswith("RELOADING=1") for m in got), got
    events = log.read_text()
    assert '"stopped"' in events and "rules and profiles reloaded" in events, events


async def test_no_ready_when_the_port_is_taken(
    tmp_path: Path, provider_url: str, notify_socket: socket.socket, processes: Processes
) -> None:
    """serve that cannot bind its port never sends READY=1 and exits 2 naming the setting."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "serve.log"
        proc = await start_serve(
            processes, systemd_config(tmp_path, provider_url, port), notify_socket, log
        )
        try:
            assert await asyncio.wait_for(proc.wait(), 20) == 2, log.read_text()
            assert "webhook.listen" in log.read_text() and f"127.0.0.1:{port}" in log.read_text()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    messages: list[str] = []
    with pytest.raises(BlockingIOError):
        while True:
            messages.append(notify_socket.recv(4096).decode())
    assert not [m for m in messages if m.startswith("READY=1")]


async def test_a_stop_at_ready_sent_to_both_processes_is_a_clean_one(
    tmp_path: Path, provider_url: str, notify_socket: socket.socket, processes: Processes
) -> None:
    """systemd's stop signals every process of the unit: SIGTERM to serve and its ingress
    process as soon as READY=1 comes (the ingress process may end before it listens) stops
    serve with 0, STOPPING=1 and no error, not exit 1 "ingress process did not start"."""
    proc, _, log = await serve_at_ready(tmp_path, provider_url, notify_socket, processes)
    try:
        (ingress,) = children(proc.pid)
        os.kill(ingress, signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        await messages_until(notify_socket, "STOPPING=1")
        assert await asyncio.wait_for(proc.wait(), 20) == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = log.read_text()
    assert "cannot serve" not in text and '"level": "error"' not in text, text


async def test_watchdog_stops_while_the_ingress_process_does_not_answer(
    tmp_path: Path, provider_url: str, notify_socket: socket.socket, processes: Processes
) -> None:
    """A stopped (hung) ingress process makes serve send WATCHDOG=trigger within the watchdog
    interval (two seconds here) and ping no more, so systemd kills and restarts it at once."""
    port = free_port()
    log = tmp_path / "serve.log"
    proc = await start_serve(
        processes, systemd_config(tmp_path, provider_url, port), notify_socket, log
    )
    try:
        await messages_until(notify_socket, "STATUS=serving")
        (ingress,) = children(proc.pid)
        os.kill(ingress, signal.SIGSTOP)
        got = await messages_for(notify_socket, 2.5)
        assert "WATCHDOG=trigger" in got, got
        assert got[got.index("WATCHDOG=trigger") + 1 :] == [], got
        os.kill(ingress, signal.SIGCONT)
        assert await messages_for(notify_socket, 1.0) == []
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_sighup_reloading_then_ready_or_refused_status(
    tmp_path: Path, provider_url: str, notify_socket: socket.socket, processes: Processes
) -> None:
    """SIGHUP sends RELOADING=1 with MONOTONIC_USEC, then READY=1 once the new rules are in
    force; a broken rule file gives READY=1 with a STATUS= saying the old rules are kept."""
    rules = tmp_path / "rules"
    rules.mkdir()
    rule_file = rules / "default.yaml"
    original = (ROOT / "rules" / "default.yaml").read_text()
    rule_file.write_text(original)
    port = free_port()
    log = tmp_path / "serve.log"
    proc = await start_serve(
        processes, systemd_config(tmp_path, provider_url, port, rules), notify_socket, log
    )

    async def reload() -> tuple[int, int, list[str]]:
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        proc.send_signal(signal.SIGHUP)
        while (message := await next_message(notify_socket, 10)) == "WATCHDOG=1":
            pass
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        first, stamp = message.split("\n")
        assert first == "RELOADING=1", message
        assert stamp.startswith("MONOTONIC_USEC="), message
        usec = int(stamp.removeprefix("MONOTONIC_USEC="))
        while (done := await next_message(notify_socket, 10)) == "WATCHDOG=1":
            pass
        assert before <= usec <= after
        return before, usec, done.split("\n")

    try:
        await messages_until(notify_socket, "STATUS=serving")
        _, _, done = await reload()
        assert done == ["READY=1", "STATUS=rules and profiles reloaded"]

        rule_file.write_text(original.replace("then: [book]", "then: [book_twice]"))
        _, _, done = await reload()
        assert done[0] == "READY=1"
        assert done[1].startswith("STATUS=reload refused: "), done
        assert "old rules kept" in done[1]
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/healthz") as resp,
        ):
            assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
