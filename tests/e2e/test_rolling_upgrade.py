"""Two versions of depositd on one database during an upgrade: a version whose schema is newer
does not migrate the database under an older one still serving, and says what to do; once the
older one has stopped, it migrates and serves, and the older one is refused in turn.

The newer version is this code with one more migration (`NEXT`, run as a script)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.configs import HOOK_KEY, HOOK_PATH, HOOK_SECRET, serve_config, write_config
from tests.support.pgcluster import Cluster
from tests.support.ports import free_port
from tests.support.processes import Processes
from worker.config.settings import StorageSettings
from worker.provider.signing import signed_headers
from worker.store.pgstore import command_connection
from worker.store.schema import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
# depositd N+1: this code with one more migration (a table of its own).
NEXT = """
import sys

import worker.store.schema as schema
import worker.store.sqlitestore as writer


def _migrate_next(db):
    db.execute("CREATE TABLE next_version_probe (x TEXT)")


schema.MIGRATIONS.append(_migrate_next)
writer.SCHEMA_VERSION = schema.SCHEMA_VERSION = len(schema.MIGRATIONS)

from worker.commands.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The database both versions share (SQLite: several instances allowed on the file, as
    during a rolling upgrade on one machine)."""
    if request.param == "sqlite":
        yield {"path": str(tmp_path / "depositd.db"), "several_instances": True}
        return
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    url = cluster.create_database()
    yield {"url": url}
    with contextlib.suppress(Exception):
        cluster.drop_database(url)


def config(path: Path, port: int, provider: str, storage: dict[str, Any]) -> Path:
    """A serve's configuration: no scheduler, JSON log lines."""
    cfg = serve_config(
        storage,
        provider,
        port,
        scheduler={"enabled": False},
        profiles=None,
    )
    return write_config(path, cfg)


def schema_version(storage: dict[str, Any]) -> int:
    sql = "SELECT value FROM meta WHERE key = 'schema_version'"
    if "url" in storage:
        conn = command_connection(StorageSettings.model_validate(storage))
        try:
            return int(conn.execute(sql).fetchone()[0])
        finally:
            conn.close()
    import sqlite3

    with contextlib.closing(sqlite3.connect(storage["path"])) as db:
        return int(db.execute(sql).fetchone()[0])


async def deliver(port: int, event_id: str) -> int:
    body = json.dumps(
        {"eventId": event_id, "eventType": "SOMETHING_NEW", "timestamp": int(time.time() * 1000)}
    ).encode()
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", HOOK_PATH, body)
    headers["Content-Type"] = "application/json"
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{port}{HOOK_PATH}", data=body, headers=headers) as r,
    ):
        return r.status


async def run_next(processes: Processes, script: Path, cfg: Path, *command: str) -> tuple[int, str]:
    """A command of depositd N+1 (`serve` unless given) until it exits: status and stderr."""
    proc = processes.own(
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            *(command or ("serve",)),
            "--config",
            str(cfg),
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_a_newer_schema_is_not_migrated_under_an_older_instance(
    tmp_path: Path, storage: dict[str, Any], provider_url: str, processes: Processes
) -> None:
    """N serves; N+1 (one more migration) started beside it exits 1 saying to stop every
    instance, and changes nothing (nor does one of its commands that opens the store): N goes
    on storing deliveries on its schema. With N stopped,
    N+1 migrates and serves; N started again is refused (the schema is newer than it knows)."""
    script = tmp_path / "next_version.py"
    script.write_text(NEXT)
    port_n, port_next = free_port(), free_port()
    older = processes.serve(
        config(tmp_path / "n.yaml", port_n, provider_url, storage), port_n, tmp_path / "n.log"
    )
    newer_cfg = config(tmp_path / "next.yaml", port_next, provider_url, storage)
    async with older:
        assert await deliver(port_n, "before-upgrade") == 200
        status, err = await run_next(processes, script, newer_cfg)
        assert status == 1, err
        assert (
            f"database schema version {SCHEMA_VERSION} needs migrating to {SCHEMA_VERSION + 1}"
            in err
        )
        assert "stop every instance, then start this version" in err
        assert schema_version(storage) == SCHEMA_VERSION
        # A command of N+1 that opens the store (`reconcile`) is refused the same way.
        status, err = await run_next(
            processes, script, newer_cfg, "reconcile", "--date", "2026-01-01"
        )
        assert status == 1 and "needs migrating" in err, err
        assert schema_version(storage) == SCHEMA_VERSION
        assert await deliver(port_n, "during-upgrade") == 200
        assert await older.signal(signal.SIGTERM) == 0
    newer = processes.own(
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            "serve",
            "--config",
            str(newer_cfg),
            cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                if await deliver(port_next, "after-upgrade") == 200:
                    break
            assert newer.returncode is None and time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert schema_version(storage) == SCHEMA_VERSION + 1
        # The older version, started again beside it (or after it): refused.
        again = processes.serve(older.config, port_n, tmp_path / "n-again.log")
        proc = await again.spawn()
        assert await asyncio.wait_for(proc.wait(), 60) == 1
        assert "newer than this depositd supports" in again.log.read_text()
    finally:
        if newer.returncode is None:
            newer.send_signal(signal.SIGTERM)
            await asyncio.wait_for(newer.wait(), 30)
