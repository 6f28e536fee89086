"""`status` with several `serve` on one database: running while any instance holds it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.processes import Processes, cli
from tests.support.service import Service
from tests.support.stores import StoreMaker


async def test_status_says_running_while_another_instance_serves(
    tmp_path: Path, provider_url: str, make_store: StoreMaker, processes: Processes
) -> None:
    """Two serve on one database (SQLite: the shared lock on `<db>.lock`; PostgreSQL: the
    shared advisory lock); the first stops cleanly (recording its stop): status still says
    running (the second holds the database), not an unclean stop; once the second stops too,
    not running."""
    shared: dict[str, Any] = {**make_store.storage("shared.db")}
    if "path" in shared:
        shared["several_instances"] = True  # SQLite: each instance says it may share
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    first = processes.own(Service(tmp_path / "a", provider_url, storage=shared))
    second = processes.own(Service(tmp_path / "b", provider_url, storage=shared))
    try:
        await first.start()
        await second.start()
        assert await first.stop() == 0
        rc, out, err = await cli(second.config, "status")
        assert rc == 0, err
        report = json.loads(out)
        assert report["stoppedAt"] is not None  # the first recorded its stop ...
        assert (report["running"], report["uncleanStop"]) == (True, False)  # ... yet one serves
        assert await second.stop() == 0
        rc, out, err = await cli(first.config, "status")
        report = json.loads(out)
        assert (report["running"], report["uncleanStop"]) == (False, False)
    finally:
        await first.kill()
        await second.kill()
