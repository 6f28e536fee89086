"""The `depositd serve` processes of a database: a lock on `<database>.lock`.

Several `serve` instances may share one database (each claims the actions it runs, and one of
them at a time leads the scheduler), so each holds the lock shared. A starting instance first
tries it exclusively: when that succeeds it is the only one, and whatever claims the database
records belong to instances that are gone, which it takes over at once instead of waiting for
their leases to lapse (the restart after a crash). The lock goes with the process (the kernel
drops it on exit, SIGKILL included), so `status` can tell a running service from one that died
without recording its stop.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from worker.errors import AlreadyServing, InstanceRunning

# `status` takes the lock exclusively for an instant to look: a serve starting then retries.
_TRIES, _PAUSE_S = 20, 0.05


def lock_path(database: Path) -> Path:
    """The lock file of a database."""
    return database.with_name(database.name + ".lock")


@contextmanager
def serve_lock(database: Path, *, alone: bool = False, listening: str = "") -> Iterator[bool]:
    """Hold the database's serve lock (shared with other instances) for the block; yields
    True when no other `serve` held it at start (this instance is the only one).

    `alone`: another `serve` holding it is refused (`InstanceRunning`, naming its pid and
    `listening` as the first one wrote them into the lock file)."""
    path = lock_path(database)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Readable by all (it holds a pid): `status` run by another user looks at it.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        sole = _take(fd, database)
        if sole:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n{listening}\n".encode(), 0)
            fcntl.flock(fd, fcntl.LOCK_SH)  # others may join from now on
        elif alone:
            raise InstanceRunning(
                _running(database, os.pread(fd, 4096, 0).decode(errors="replace"))
            )
        yield sole
    finally:
        os.close(fd)  # releases the lock


def _running(database: Path, recorded: str) -> str:
    """What refuses a second instance: the first one's pid and ports, when still recorded."""
    pid, _, listening = recorded.partition("\n")
    who = "another depositd serve"
    if pid.strip().isdigit() and _alive(int(pid)):
        who += f" (pid {pid.strip()}" + (f", {listening.strip()})" if listening.strip() else ")")
    return (
        f"{who} already serves {database}: a SQLite database serves one instance. Stop that"
        " one first (`depositd status` shows it), or, to run several on this machine, set"
        " storage.several_instances: true in each one's configuration"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _take(fd: int, database: Path) -> bool:
    """The lock exclusively (True: no other serve) or shared (False)."""
    for attempt in range(_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        try:
            # Shared fails only while someone holds it exclusively for an instant (`status`
            # looking, another serve starting): try again.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            if attempt == _TRIES - 1:
                raise AlreadyServing(f"cannot take the serve lock of {database}") from None
            time.sleep(_PAUSE_S)
    raise AssertionError("unreachable")


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
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
