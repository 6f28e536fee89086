"""One `depositd serve` per database: an exclusive lock on `<database>.lock`.

A second `serve` on the same database (same unit started twice, a test run beside the service)
would run the outbox beside the first and could send an action twice; it is refused before it
opens anything. The lock goes with the process (the kernel drops it on exit, SIGKILL included),
so `status` can tell a running service from one that died without recording its stop.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from worker.errors import AlreadyServing

# `status` takes the lock shared for an instant to look: a serve starting just then retries.
_TRIES, _PAUSE_S = 20, 0.05


def lock_path(database: Path) -> Path:
    """The lock file of a database."""
    return database.with_name(database.name + ".lock")


@contextmanager
def serve_lock(database: Path) -> Iterator[None]:
    """Hold the database's serve lock for the block; `AlreadyServing` when another holds it."""
    path = lock_path(database)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Readable by all (it holds a pid): `status` run by another user looks at it.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for attempt in range(_TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == _TRIES - 1:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise AlreadyServing(
                        f"another depositd serve (pid {holder}) uses {database}"
                    ) from None
                time.sleep(_PAUSE_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def serving(database: Path) -> bool | None:
    """Does a `depositd serve` hold the database now? None when the lock cannot be looked at
    (e.g. a lock file this user may not read)."""
    try:
        fd = os.open(lock_path(database), os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
