"""A throwaway PostgreSQL cluster for the tests and the bench, from the installed server binaries.

`initdb` and `pg_ctl` run in a temporary folder as an unprivileged user (PostgreSQL refuses to
run as root: as root, the system user `depositd-test` is created when absent), listening on
127.0.0.1 on a free port, with fsync on. `DEPOSITD_TEST_PG_URL` names an existing server instead
(a role allowed to create databases). Each user of the cluster gets a fresh database.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg

INSTALL = "apt-get install -y postgresql"
TEST_USER = "depositd-test"
ENV_URL = "DEPOSITD_TEST_PG_URL"


class MissingPostgres(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def server_bin() -> Path:
    """The folder of initdb/pg_ctl: on PATH, else the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(folder) / "initdb").exists():
            return Path(folder)
    raise MissingPostgres(f"PostgreSQL server binaries (initdb, pg_ctl) not found: {INSTALL}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> list[str]:
    """The command prefix that runs a server command as an unprivileged user."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        # Two test workers may both find the user missing: the one that loses the race fails
        # with "already exists", which is as good.
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
            check=False,
            capture_output=True,
        )
        pwd.getpwnam(TEST_USER)  # KeyError here: the user could not be created
    return ["runuser", "-u", TEST_USER, "--"]


class Cluster:
    """A running server; `url(name)` is a database on it."""

    def __init__(self, base_url: str, stop: list[str] | None, start: list[str] | None) -> None:
        self.base_url = base_url
        self._stop = stop
        self._start = start

    def url(self, database: str) -> str:
        """The URL of `database` on this server."""
        head, _, _ = self.base_url.rpartition("/")
        return f"{head}/{database}"

    def create_database(self, prefix: str = "t") -> str:
        """A fresh empty database; its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.base_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop a database `create_database` made (its connections are ended first)."""
        name = url.rpartition("/")[2]
        with psycopg.connect(self.base_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        """Stop the server (fast: open connections are ended); a test of an outage."""
        if self._stop is None:
            raise RuntimeError(f"{ENV_URL} names a server these tests do not control")
        subprocess.run(self._stop, check=True, capture_output=True)

    def start(self) -> None:
        """Start it again after `stop`."""
        if self._start is None:
            raise RuntimeError(f"{ENV_URL} names a server these tests do not control")
        subprocess.run(self._start, check=True, capture_output=True)


@contextlib.contextmanager
def running_cluster() -> Iterator[Cluster]:
    """`DEPOSITD_TEST_PG_URL`'s server, else a throwaway cluster stopped and removed after."""
    given = os.environ.get(ENV_URL)
    if given:
        yield Cluster(given, None, None)
        return
    bindir = server_bin()
    prefix = _as_user()
    folder = Path(tempfile.mkdtemp(prefix="depositd-pg-"))
    if prefix:
        shutil.chown(folder, TEST_USER, TEST_USER)
    data = folder / "data"
    port = _free_port()
    subprocess.run(
        [*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"],
        check=True,
        capture_output=True,
    )
    options = f"-h 127.0.0.1 -p {port} -k {folder} -c max_connections=200"
    pg_ctl = [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l", str(folder / "log")]
    start = [*pg_ctl, "-o", options, "start"]
    stop = [*pg_ctl, "-m", "fast", "stop"]
    subprocess.run(start, check=True, capture_output=True)
    try:
        yield Cluster(f"postgresql://postgres@127.0.0.1:{port}/postgres", stop, start)
    finally:
        subprocess.run(stop, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
