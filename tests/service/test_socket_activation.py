"""`serve` on the listening socket systemd passes (socket activation): this test holds the
socket as systemd does (fd 3, LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES), so deliveries sent while
no `serve` runs (before the first start, between a stop and the next start) wait in its queue
and are answered 200 and stored; a socket on another address than webhook.listen stops serve
(exit 2) naming both."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import HOOK_KEY, HOOK_PATH, HOOK_SECRET, serve_config, write_config
from tests.support.paths import ROOT
from tests.support.ports import free_port
from tests.support.processes import Processes
from worker.provider.jsonio import dumpb
from worker.provider.signing import signed_headers

# Runs serve with the socket as fd 3 and LISTEN_PID its own PID (exec keeps it), as systemd
# starts a service of a socket unit.
AS_SYSTEMD = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ['LISTEN_PID'] = str(os.getpid());"
    " os.execv(sys.executable, [sys.executable, '-m', 'worker', *sys.argv[2:]])"
)


def _config(tmp_path: Path, provider_url: str, port: int) -> Path:
    return write_config(tmp_path, serve_config(tmp_path / "depositd.db", provider_url, port))


def _lines(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"level": "raw", "event": line})
    return out


@pytest.fixture
def held() -> Iterator[socket.socket]:
    """A listening socket on loopback, held by the test the way systemd holds depositd.socket."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", free_port()))
    sock.listen(128)
    yield sock
    sock.close()


async def start(
    processes: Processes, config: Path, sock: socket.socket, log: Path
) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "webhook"}
    with log.open("ab") as err:
        return processes.own(
            await asyncio.create_subprocess_exec(
                *(sys.executable, "-c", AS_SYSTEMD, str(sock.fileno())),
                *("serve", "--config", str(config)),
                cwd=ROOT,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
                env=env,
                pass_fds=(sock.fileno(),),
            )
        )


async def deliver(port: int, event_id: str) -> int:
    """One signed delivery on a connection of its own; the status answered."""
    body = dumpb(
        {"eventId": event_id, "eventType": "STABLE_ORDER_UPDATED", "referenceId": event_id}
    )
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, body)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(
        f"POST {HOOK_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{head}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    try:
        status = await asyncio.wait_for(reader.readline(), 60)
    finally:
        writer.close()
    return int(status.split()[1])


def stored(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {row[0] for row in conn.execute("select event_id from events")}


async def test_deliveries_wait_for_serve_across_a_restart(
    tmp_path: Path, provider_url: str, held: socket.socket, processes: Processes
) -> None:
    """Deliveries sent before serve runs, and between its stop and the next start, are all
    answered 200 (none refused) and stored once; serve used the passed socket (it never bound
    the port: the test holds it)."""
    port = held.getsockname()[1]
    config = _config(tmp_path, provider_url, port)
    log = tmp_path / "serve.log"
    early = asyncio.gather(*(deliver(port, f"before-{n}") for n in range(5)))
    proc = await start(processes, config, held, log)
    try:
        assert await asyncio.wait_for(early, 60) == [200] * 5, log.read_text()
        assert await proc_signal(proc, signal.SIGTERM) == 0, log.read_text()
        between = asyncio.gather(*(deliver(port, f"between-{n}") for n in range(5)))
        await asyncio.sleep(0)  # the connections are made while no serve runs
        proc = await start(processes, config, held, log)
        assert await asyncio.wait_for(between, 60) == [200] * 5, log.read_text()
        assert await proc_signal(proc, signal.SIGTERM) == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    ids = stored(tmp_path / "depositd.db")
    assert {f"before-{n}" for n in range(5)} | {f"between-{n}" for n in range(5)} <= ids
    assert not any(line["level"] in ("warning", "error") for line in _lines(log)), log.read_text()


async def proc_signal(proc: asyncio.subprocess.Process, sig: int) -> int:
    proc.send_signal(sig)
    return await asyncio.wait_for(proc.wait(), 30)


async def test_a_socket_elsewhere_than_webhook_listen_stops_serve(
    tmp_path: Path, provider_url: str, held: socket.socket, processes: Processes
) -> None:
    """systemd passes a socket on another port than webhook.listen: exit 2, one error naming
    webhook.listen, both addresses and ListenStream=, before the database is opened."""
    config = _config(tmp_path, provider_url, free_port())
    log = tmp_path / "serve.log"
    proc = await start(processes, config, held, log)
    assert await asyncio.wait_for(proc.wait(), 60) == 2
    errors = [line for line in _lines(log) if line["level"] == "error"]
    assert len(errors) == 1, errors
    text = json.dumps(errors[0])
    assert "webhook.listen" in text and "ListenStream=" in text, text
    assert f"127.0.0.1:{held.getsockname()[1]}" in text, text
    assert not (tmp_path / "depositd.db").exists()
