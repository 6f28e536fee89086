"""Ports for the servers a test starts that must be told their port before they bind it.

A port read back from a socket bound to port 0 and closed again is free only until someone
else binds it: another test running beside (pytest-xdist's other workers, a second suite on
the machine) or the kernel itself, which hands out ports of the same range to every socket
bound to port 0 and to every outgoing connection. A `serve` told such a port then cannot bind
it, and a test asking it for /healthz talks to whoever holds the port instead (a listener that
never answers keeps the test waiting for minutes).

So the ports come from below the kernel's ephemeral range (which the kernel never hands out by
itself), in blocks of `BLOCK` ports that one process holds for its whole life with a lock on a
file (`PORTS_DIR/block-N`): no two processes of any test run on this machine are given the same
port. Each port is still checked to be free now (something outside the tests may hold it).
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path
from typing import IO

BLOCK = 100
LOWEST = 10_000  # well above the ports of common services
PORTS_DIR = Path(tempfile.gettempdir()) / "depositd-test-ports"
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _highest() -> int:
    """The last port below the kernel's ephemeral range."""
    try:
        return int(RANGE_FILE.read_text().split()[0]) - 1
    except (OSError, ValueError, IndexError):
        return 32_767  # Linux's default range starts at 32768


class _Ports:
    """This process's blocks, and the next port of the last one."""

    def __init__(self) -> None:
        self.held: list[IO[bytes]] = []  # the locks, open until the process ends
        self.next = 0
        self.end = 0  # past the last port of the block in hand

    def take_block(self) -> None:
        blocks = max(0, (_highest() + 1 - LOWEST) // BLOCK)
        if blocks == 0:
            raise RuntimeError(f"no port below the ephemeral range ({RANGE_FILE}) to give out")
        PORTS_DIR.mkdir(exist_ok=True)
        start = random.randrange(blocks)
        for step in range(blocks):
            block = (start + step) % blocks
            lock = (PORTS_DIR / f"block-{block}").open("ab")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            self.held.append(lock)
            self.next = LOWEST + block * BLOCK
            self.end = self.next + BLOCK
            return
        raise RuntimeError(f"every block of test ports is held ({PORTS_DIR})")

    def release(self) -> None:
        """Give the blocks back (a process's own are given back when it ends)."""
        for lock in self.held:
            lock.close()
        self.held.clear()

    def port(self) -> int:
        while True:
            if self.next >= self.end:
                self.take_block()
            port, self.next = self.next, self.next + 1
            if _bindable(port):
                return port


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# One per process id: a forked child takes blocks of its own (the parent's stay open, unused).
_by_pid: dict[int, _Ports] = {}


def free_port() -> int:
    """A TCP port free on loopback that no other process of any test run is given."""
    return _by_pid.setdefault(os.getpid(), _Ports()).port()
