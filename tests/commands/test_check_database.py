"""What an acknowledged webhook survives, as `check --online` and `status` say it: read from
the PostgreSQL server's settings, or SQLite's `storage.synchronous`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import make_config, write_config
from tests.support.paths import RULES
from tests.support.pgcluster import Cluster
from tests.support.ports import free_port
from worker.commands.cli import main
from worker.store.durability import MACHINE_CRASH, PROCESS_CRASH, SERVER_CRASH
from worker.store.pgstore import PgStore


def online_config(tmp_path: Path, provider_url: str, storage: dict[str, Any]) -> Path:
    """A configuration on `storage` for the sandbox at `provider_url`, with the shipped rules."""
    cfg = make_config(
        storage,
        provider_url,
        port=free_port(),
        scheduler={"enabled": False},
        rules=str(RULES),
    )
    return write_config(tmp_path, cfg)


async def test_check_online_and_status_say_what_a_postgres_commit_survives(
    tmp_path: Path, provider_url: str, pg_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """One server with PostgreSQL's defaults: the server's crash, not its loss; the settings
    that say so are named."""
    url = pg_cluster.create_database()
    try:
        config = online_config(tmp_path, provider_url, {"url": url})
        code = await asyncio.to_thread(main, ["check", "--online", "--config", str(config)])
        out = capsys.readouterr()
        assert code == 0, out.err
        assert (
            f"database: {url}: an acknowledged webhook survives {SERVER_CRASH} (fsync=on,"
            " synchronousCommit=on, synchronousStandbyNames=)"
        ) in out.out.splitlines()
        store = PgStore(url)  # the schema `status` reads, as a first serve leaves it
        await store.open()
        await store.close()
        assert await asyncio.to_thread(main, ["status", "--config", str(config)]) == 0
        durability = json.loads(capsys.readouterr().out)["durability"]
        assert durability == {
            "survives": SERVER_CRASH,
            "fsync": "on",
            "synchronousCommit": "on",
            "synchronousStandbyNames": "",
        }
    finally:
        pg_cluster.drop_database(url)


async def test_check_online_fails_naming_an_unreachable_database_without_its_password(
    tmp_path: Path, provider_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No server on either host of a multi-host URL: exit 1, both hosts named, no password."""
    url = "postgresql://depositd:s3cret@127.0.0.1:1,127.0.0.1:2/depositd?connect_timeout=2"
    config = online_config(tmp_path, provider_url, {"url": url})
    code = await asyncio.to_thread(main, ["check", "--online", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 1
    assert "database: cannot connect to postgresql://depositd:***@127.0.0.1:1,127.0.0.1:2/" in err
    assert "s3cret" not in err


@pytest.mark.parametrize(
    ("synchronous", "survives"), [("FULL", MACHINE_CRASH), ("NORMAL", PROCESS_CRASH)]
)
async def test_check_online_says_what_a_sqlite_commit_survives(
    tmp_path: Path,
    provider_url: str,
    capsys: pytest.CaptureFixture[str],
    synchronous: str,
    survives: str,
) -> None:
    """SQLite: what `storage.synchronous` makes a commit survive."""
    path = tmp_path / "depositd.db"
    config = online_config(tmp_path, provider_url, {"path": str(path), "synchronous": synchronous})
    code = await asyncio.to_thread(main, ["check", "--online", "--config", str(config)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert (
        f"database: {path}: an acknowledged webhook survives {survives} (synchronous={synchronous})"
    ) in out.out.splitlines()
