"""The serve lock on PostgreSQL: an advisory lock each instance's session holds shared, so the
first instance in knows it is alone (and takes the claims of instances gone over at once)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.configs import serve_config, write_config
from tests.support.pgcluster import Cluster
from tests.support.ports import free_port
from tests.support.processes import Processes
from worker.config.settings import StorageSettings
from worker.store import pgstore
from worker.store.pg import connect
from worker.store.pgstore import PgStore, serve_lock, serving

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def storage(pg_cluster: Cluster) -> Iterator[StorageSettings]:
    """A fresh PostgreSQL database's `storage` section."""
    url = pg_cluster.create_database()
    yield StorageSettings(url=url)
    pg_cluster.drop_database(url)


def eventually(check: Callable[[], bool], within_s: float = 10) -> bool:
    """Whether `check` holds within `within_s`."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_instances_share_the_lock_and_the_first_one_in_is_alone(storage: StorageSettings) -> None:
    """The first instance is alone, a second joins (not alone), `serving` says so while either
    holds it; once both stopped the database is free and the next one is alone again."""
    assert serving(storage) is False
    with serve_lock(storage) as first:
        assert first is True
        assert serving(storage) is True
        with serve_lock(storage) as second:
            assert second is False
        assert serving(storage) is True
    assert eventually(lambda: serving(storage) is False)
    with serve_lock(storage) as again:
        assert again is True


def test_a_lost_lock_session_is_replaced(storage: StorageSettings) -> None:
    """The server ends the lock's session (a restart, a dropped connection): the instance
    opens another and holds the lock again, so a serve starting later is not alone."""
    assert storage.url is not None
    admin = connect(storage.url)
    sessions = (
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'depositd-serve'"
        " AND datname = current_database()"
    )
    try:
        with serve_lock(storage) as sole:
            assert sole is True
            [(old,)] = admin.execute(sessions).fetchall()
            admin.execute("SELECT pg_terminate_backend(?)", [old])
            assert eventually(
                lambda: [r[0] for r in admin.execute(sessions).fetchall()] not in ([], [old])
            )
            assert eventually(lambda: serving(storage) is True)
            with serve_lock(storage) as later:
                assert later is False
    finally:
        admin.close()


def test_a_killed_instances_lock_goes_with_its_connection(
    storage: StorageSettings, processes: Processes
) -> None:
    """A process holding the lock killed with SIGKILL: the server ends its session, the lock
    goes, and the next instance is alone."""
    holder = processes.own(
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, time\n"
                "from worker.config.settings import StorageSettings\n"
                "from worker.store.pgstore import serve_lock\n"
                "with serve_lock(StorageSettings(url=sys.argv[1])) as sole:\n"
                "    print(sole, flush=True)\n"
                "    time.sleep(60)\n",
                str(storage.url),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "True"
    with serve_lock(storage) as sole:
        assert sole is False  # the other process is alive
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    assert eventually(lambda: serving(storage) is False)
    with serve_lock(storage) as sole:
        assert sole is True


def _config(path: Path, port: int, provider: str, url: str) -> Path:
    cfg = serve_config(
        {"url": url},
        provider,
        port,
        scheduler={"history_interval_s": 60, "detail_interval_s": 60},
        instance={"lease_s": 60},
        profiles=None,
    )
    return write_config(path, cfg)


def _status(config: Path) -> str:
    """`depositd status` on the configuration, its output."""
    return subprocess.run(
        [sys.executable, "-m", "worker", "status", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def _leading(log: Path) -> int:
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    return sum(1 for e in lines if e["event"] == "leading")


async def test_a_serve_restarted_after_a_kill_leads_at_once(
    tmp_path: Path, storage: StorageSettings, provider_url: str, processes: Processes
) -> None:
    """A serve killed with SIGKILL while leading, started again: alone on the database, it
    releases the dead one's lease and leads at once, not a lease (60 s) later; `status` says
    when none runs (an unclean stop) and when one does."""
    port = free_port()
    assert storage.url is not None
    config = _config(tmp_path / "d.yaml", port, provider_url, storage.url)
    first = processes.serve(config, port, tmp_path / "first.log")
    again = processes.serve(config, port, tmp_path / "again.log")
    try:
        await first.start()
        assert await asyncio.to_thread(eventually, lambda: _leading(first.log) == 1)
        assert await asyncio.to_thread(serving, storage) is True
        assert await first.signal(signal.SIGKILL) == -signal.SIGKILL
        assert await asyncio.to_thread(eventually, lambda: serving(storage) is False)
        report = json.loads(await asyncio.to_thread(_status, config))
        assert (report["running"], report["uncleanStop"]) == (False, True)
        await again.start()
        assert await asyncio.to_thread(eventually, lambda: _leading(again.log) == 1, 15)
        report = json.loads(await asyncio.to_thread(_status, config))
        assert (report["running"], report["uncleanStop"]) == (True, False)
        assert report["leader"]["current"] is True
    finally:
        await first.kill()
        await again.kill()


async def test_an_instance_replacing_its_lock_session_is_not_taken_for_gone(
    storage: StorageSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a running instance replaces a lock session the server ended (it holds no lock
    for a moment), a serve starting is not alone: it would release the running instance's
    claims, and an action could run twice under one Idempotency-Key."""
    assert storage.url is not None
    # The lost session is noticed at the keeper's next look: not during this test.
    monkeypatch.setattr(pgstore, "LOCK_CHECK_S", 60.0)
    store = PgStore(storage.url)
    admin = connect(storage.url)
    try:
        with serve_lock(storage) as first:
            assert first is True
            await store.open()  # the running instance's writer and reader sessions
            keeper = [t for t in threading.enumerate() if t.name == "depositd-serve-lock"][-1]
            [(old,)] = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'depositd-serve'"
                " AND datname = current_database()"
            ).fetchall()
            admin.execute("SELECT pg_terminate_backend(?)", [old])
            assert eventually(lambda: serving(storage) is False)
            with serve_lock(storage) as starting:
                assert starting is False
            assert keeper.is_alive()
    finally:
        admin.close()
        await store.close()
