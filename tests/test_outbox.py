"""The outbox runner's loop: it outlives a failing pass."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from worker.errors import StorageError
from worker.outbox import Outbox
from worker.profiles import Profiles
from worker.provider.client import ProviderClient
from worker.store import Store
from worker.tracker import Fact


async def test_run_survives_a_storage_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that raises StorageError is logged and the next pass still runs."""
    store = Store(tmp_path / "depositd.db")
    await store.open()

    async def observe(fact: Fact) -> None:
        return None

    client = ProviderClient("http://127.0.0.1:9", "key", "secret", retries=0)
    outbox = Outbox(store, client=client, notifiers={}, profiles=Profiles.empty, observe=observe)
    passes = 0
    stop = asyncio.Event()

    async def run_once(*, include_delayed: bool = False) -> int:
        nonlocal passes
        passes += 1
        if passes == 1:
            raise StorageError("disk I/O error")
        stop.set()
        return 0

    monkeypatch.setattr(outbox, "run_once", run_once)
    try:
        await asyncio.wait_for(outbox.run(stop), timeout=5)
    finally:
        await client.close()
        await store.close()
    assert passes == 2
