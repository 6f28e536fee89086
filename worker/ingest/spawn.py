"""Starting the ingress process (`worker.ingest.process`): the listening socket it takes over
and the command that starts it. Kept apart from the process's own code so that `serve` starts
it before importing its own stages: the two processes then import side by side.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import sys
import time
from pathlib import Path

_BIND_WAIT_S = 3.0


async def listen_socket(host: str, port: int) -> socket.socket:
    """The webhook listener, bound by `serve` (so that it reports a taken port itself).

    A port still held is retried for a few seconds: the ingress process of a service killed
    just before may still be exiting. No SO_REUSEPORT: a second `serve` on the same port must
    fail, not share the deliveries.
    """
    # The first address of the host (a name such as "localhost" gives its first address).
    family, _, _, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    deadline = time.monotonic() + _BIND_WAIT_S
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(1024)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


async def spawn(
    config: Path, listener: socket.socket, link: socket.socket
) -> asyncio.subprocess.Process:
    """Start the ingress process on `listener`, speaking to this process over `link`."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.ingest.process",
        "--config",
        str(config),
        "--listen-fd",
        str(listener.fileno()),
        "--link-fd",
        str(link.fileno()),
        "--parent",
        str(os.getpid()),
        pass_fds=(listener.fileno(), link.fileno()),
    )
