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
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg

from tests.support.ports import free_port

INSTALL = "apt-get install -y postgresql"
TEST_USER = "depositd-test"
ENV_URL = "DEPOSITD_TEST_PG_URL"
# At most this long for a server command (pg_ctl -w itself gives up waiting after 60 s).
PG_CTL_S = 180


class MissingPostgres(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def server_bin() -> Path:
    """The folder of initdb, pg_ctl and pg_basebackup: on PATH, else the newest
    /usr/lib/postgresql/*/bin."""
    found = shutil.which("initdb")
    if found:
        # A link on PATH (as /usr/local/bin/initdb): the folder it points into has the rest
        # (pg_basebackup) as well.
        return Path(found).resolve().parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(folder) / "initdb").exists():
            return Path(folder)
    raise MissingPostgres(f"PostgreSQL server binaries (initdb, pg_ctl) not found: {INSTALL}")


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
            timeout=60,
        )
        pwd.getpwnam(TEST_USER)  # KeyError here: the user could not be created
    return ["runuser", "-u", TEST_USER, "--"]


class Cluster:
    """A running server; `url(name)` is a database on it."""

    def __init__(self, base_url: str, stop: list[str] | None, start: list[str] | None) -> None:
        self.base_url = base_url
        self._stop = stop
        self._start = start
        self.port = 0  # a throwaway server's port
        self.crash_command: list[str] | None = None
        self.promote_command: list[str] | None = None

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
        subprocess.run(self._stop, check=True, capture_output=True, timeout=PG_CTL_S)

    def start(self) -> None:
        """Start it again after `stop`."""
        if self._start is None:
            raise RuntimeError(f"{ENV_URL} names a server these tests do not control")
        subprocess.run(self._start, check=True, capture_output=True, timeout=PG_CTL_S)

    def crash(self) -> None:
        """Stop the server hard (`pg_ctl stop -m immediate`: as if its machine died)."""
        assert self.crash_command is not None
        subprocess.run(self.crash_command, check=True, capture_output=True, timeout=PG_CTL_S)

    def promote(self) -> None:
        """Promote a standby to primary (`pg_ctl promote`, waiting until it accepts writes)."""
        assert self.promote_command is not None
        subprocess.run(self.promote_command, check=True, capture_output=True, timeout=PG_CTL_S)


@contextlib.contextmanager
def running_cluster() -> Iterator[Cluster]:
    """`DEPOSITD_TEST_PG_URL`'s server, else a throwaway cluster stopped and removed after."""
    given = os.environ.get(ENV_URL)
    if given:
        yield Cluster(given, None, None)
        return
    with _server_folder() as (bindir, prefix, folder):
        yield _start_primary(bindir, prefix, folder, "data", "")


@contextlib.contextmanager
def _server_folder() -> Iterator[tuple[Path, list[str], Path]]:
    """The server binaries, the unprivileged prefix, and a private folder removed after (every
    server started in it stopped first)."""
    bindir = server_bin()
    prefix = _as_user()
    folder = Path(tempfile.mkdtemp(prefix="depositd-pg-"))
    if prefix:
        shutil.chown(folder, TEST_USER, TEST_USER)
    try:
        yield bindir, prefix, folder
    finally:
        for data in folder.glob("*/PG_VERSION"):
            stop = [*prefix, str(bindir / "pg_ctl"), "-D", str(data.parent), "-m", "immediate"]
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run([*stop, "stop"], capture_output=True, timeout=PG_CTL_S)
        shutil.rmtree(folder, ignore_errors=True)


def _pg_ctl(bindir: Path, prefix: list[str], folder: Path, name: str) -> list[str]:
    data = folder / name
    return [
        *prefix,
        str(bindir / "pg_ctl"),
        "-D",
        str(data),
        "-w",
        "-l",
        str(folder / f"{name}.log"),
    ]


def _start_primary(bindir: Path, prefix: list[str], folder: Path, name: str, extra: str) -> Cluster:
    """initdb and start a server in `folder / name` on a free port; `extra`: more -c options
    given on its command line (not copied by a base backup)."""
    subprocess.run(
        [
            *prefix,
            str(bindir / "initdb"),
            "-D",
            str(folder / name),
            "-U",
            "postgres",
            "-A",
            "trust",
        ],
        check=True,
        capture_output=True,
        timeout=PG_CTL_S,
    )
    return _start_server(bindir, prefix, folder, name, extra)


def _start_server(bindir: Path, prefix: list[str], folder: Path, name: str, extra: str) -> Cluster:
    port = free_port()
    options = f"-h 127.0.0.1 -p {port} -k {folder} -c max_connections=200 {extra}".strip()
    pg_ctl = _pg_ctl(bindir, prefix, folder, name)
    start = [*pg_ctl, "-o", options, "start"]
    stop = [*pg_ctl, "-m", "fast", "stop"]
    subprocess.run(start, check=True, capture_output=True, timeout=PG_CTL_S)
    cluster = Cluster(f"postgresql://postgres@127.0.0.1:{port}/postgres", stop, start)
    cluster.port = port
    cluster.crash_command = [*pg_ctl, "-m", "immediate", "stop"]
    cluster.promote_command = [*pg_ctl, "promote"]
    return cluster


@contextlib.contextmanager
def replicated_pair() -> Iterator[tuple[Cluster, Cluster]]:
    """A primary and a streaming standby (`pg_basebackup -R`), the standby synchronous: a
    commit on the primary returns once the standby has flushed it (`synchronous_standby_names`
    on the primary's command line, so that the standby, once promoted, does not wait for a
    standby of its own). Both stopped and removed after."""
    with _server_folder() as (bindir, prefix, folder):
        primary = _start_primary(
            bindir, prefix, folder, "primary", "-c synchronous_standby_names=*"
        )
        subprocess.run(
            [
                *prefix,
                str(bindir / "pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                "postgres",
                "-D",
                str(folder / "standby"),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
            check=True,
            capture_output=True,
            timeout=PG_CTL_S,
        )
        standby = _start_server(bindir, prefix, folder, "standby", "")
        _until_synchronous(primary)
        yield primary, standby


def _until_synchronous(primary: Cluster, within_s: float = 30) -> None:
    """Wait until the primary streams to a standby it counts as synchronous."""
    deadline = time.monotonic() + within_s
    with psycopg.connect(primary.base_url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT COUNT(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
            ).fetchone()
            if row is not None and row[0]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not become synchronous")
            time.sleep(0.05)
