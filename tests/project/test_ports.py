"""The ports tests give the servers they start: never the same port to two processes, never one
the kernel hands out by itself, never one something else holds."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from tests.support import ports
from tests.support.paths import ROOT

TAKE = f"""
import json
from tests.support.ports import free_port
print(json.dumps([free_port() for _ in range({2 * ports.BLOCK + 10})]))
"""


def test_two_processes_at_once_are_given_different_ports_below_the_kernels_range() -> None:
    """This process and another one, each holding its blocks, take ports over several blocks:
    no port is given twice, and every one is below the range the kernel gives sockets bound to
    port 0 and outgoing connections."""
    mine = [ports.free_port() for _ in range(2 * ports.BLOCK + 10)]
    theirs = json.loads(
        subprocess.run(
            [sys.executable, "-c", TAKE],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )
    assert len(set(mine)) == len(mine) and len(set(theirs)) == len(theirs)
    assert not set(mine) & set(theirs)
    kernel_lowest = int(ports.RANGE_FILE.read_text().split()[0])
    assert all(ports.LOWEST <= port < kernel_lowest for port in mine + theirs)


def test_a_port_held_by_something_else_is_skipped() -> None:
    """A listener outside the tests on the next port of the block: that port is not given."""
    given = ports._Ports()
    try:
        given.take_block()
        held = given.next
        with socket.socket() as other:
            other.bind(("127.0.0.1", held))
            other.listen()
            assert given.port() == held + 1
    finally:
        given.release()
