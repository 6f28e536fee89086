"""No task of `serve` dies unnoticed: an error injected into each long-running task's loop, in a
real serve on a real store, is logged at once with the task's name, and the task runs again
(or the service exits 1); while it is down /healthz, /readyz, the metrics and `status` say so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from tests.support.configs import serve_config, write_config
from tests.support.ports import free_port
from tests.support.stores import StoreMaker
from tests.support.waits import until, until_async
from worker.act.outbox import Outbox
from worker.commands.ops import status_report
from worker.config.settings import Settings, load_settings
from worker.ingest.link import CoreSide
from worker.poll.poller import Poller
from worker.schedule.leader import Leader
from worker.service import supervise
from worker.service.runtime import Runtime
from worker.service.serve import serve
from worker.store.meta import TASKS_DOWN, get_meta
from worker.track.processor import Processor

ROOT = Path(__file__).resolve().parents[2]


def settings_for(tmp_path: Path, provider_url: str, ingress: bool = False) -> Settings:
    """One serve in this process (and its ingress process, if asked), its scheduler on, on a
    SQLite file."""
    cfg = serve_config(
        tmp_path / "depositd.db",
        provider_url,
        free_port(),
        webhook={"ingress_process": ingress},
        scheduler={"history_interval_s": 1, "detail_interval_s": 1},
        log=None,
    )
    return load_settings(write_config(tmp_path, cfg))


class Served:
    """A `serve` running in this process, and what a user would ask of it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url = f"http://{settings.webhook.listen}"
        self.task: asyncio.Task[int] | None = None

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as answer:
            return answer.status, await answer.text()

    async def answers(self, path: str, status: int | None = None) -> bool:
        """True once `path` answers (with `status`, when given)."""
        with contextlib.suppress(aiohttp.ClientError):
            return status in (None, (await self.get(path))[0])
        return False

    def status(self) -> dict[str, Any]:
        """What `depositd status` shows."""
        assert self.settings.storage.path is not None
        with contextlib.closing(sqlite3.connect(self.settings.storage.path)) as conn:
            conn.row_factory = sqlite3.Row
            return status_report(conn, True)

    async def stop(self) -> int:
        """SIGTERM, as systemd stops it; the exit status."""
        assert self.task is not None
        os.kill(os.getpid(), signal.SIGTERM)
        return await asyncio.wait_for(self.task, 30)


@pytest.fixture
async def start_serve(tmp_path: Path, provider_url: str) -> AsyncIterator[Callable[[], Any]]:
    """Start `serve` (awaited until /healthz answers, healthy or not, or serve ends); it is
    stopped at teardown, whatever the test's outcome."""
    served: list[Served] = []

    async def start(ingress: bool = False) -> Served:
        one = Served(settings_for(tmp_path, provider_url, ingress))
        one.task = asyncio.create_task(serve(one.settings))
        served.append(one)
        await until_async(
            lambda: one.answers("/healthz") if not one.task.done() else _done(),
            "serve to answer",
            30,
        )
        return one

    yield start
    for one in served:
        if one.task is not None and not one.task.done():
            await one.stop()


async def _done() -> bool:
    return True


def failing_once(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str, on_call: int = 1
) -> list[int]:
    """Make `owner.name` raise on its `on_call`-th call only; the calls so far."""
    original = getattr(owner, name)
    calls: list[int] = []

    async def patched(self: Any, *args: Any, **kw: Any) -> Any:
        calls.append(len(calls) + 1)
        if len(calls) == on_call:
            raise RuntimeError(f"injected into {name}")
        return await original(self, *args, **kw)

    monkeypatch.setattr(owner, name, patched)
    return calls


# The task, and the method its loop calls (the n-th call raising: the leader's first try is
# made before its loop starts).
TASK_LOOPS = {
    "outbox": (Outbox, "_until_next_due", 1),
    "daily": (Runtime, "check_providers", 1),
    "wallets": (Runtime, "check_wallets", 1),
    "leader": (Leader, "tick", 2),
}


@pytest.mark.parametrize("task", sorted(TASK_LOOPS))
async def test_a_task_whose_loop_fails_is_logged_at_once_and_runs_again(
    start_serve: Callable[[], Any], monkeypatch: pytest.MonkeyPatch, task: str
) -> None:
    """An error escaping the loop is logged with the task's name as it happens, and the task
    runs again after a short back-off; the service stays healthy after and stops with 0."""
    monkeypatch.setattr(supervise, "RESTART_BASE_S", 0.05)
    owner, method, on_call = TASK_LOOPS[task]
    calls = failing_once(monkeypatch, owner, method, on_call)
    with capture_logs() as logs:
        served = await start_serve()
        await until(lambda: len(calls) > on_call, f"{task} to run again")
        failed = [e for e in logs if e["event"] == "task failed"]
        assert [(e["task"], e["log_level"]) for e in failed] == [(task, "error")]
        assert f"injected into {method}" in failed[0]["error"]
        await until(
            lambda: any(e["event"] == "task running again" for e in logs), "the restart logged"
        )
        assert await served.answers("/healthz", 200)
        # Recorded for `status` by a write of its own, after the restart.
        await until(lambda: served.status()["tasksDown"] == {}, "status to list no task down")
        assert await served.stop() == 0


async def test_a_task_down_is_unhealthy_everywhere_until_it_runs_again(
    start_serve: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a task waits to restart, /healthz and /readyz answer 503 naming it, the metric
    shows it down and `status` lists it; a stop meanwhile is a clean one."""
    monkeypatch.setattr(supervise, "RESTART_BASE_S", 600.0)  # down until the stop
    calls = failing_once(monkeypatch, Runtime, "check_providers")
    served = await start_serve()
    await until(lambda: calls, "the daily check")
    await until_async(lambda: served.answers("/healthz", 503), "/healthz to fail")
    status, body = await served.get("/healthz")
    [problem] = json.loads(body)["problems"]
    assert problem.startswith("daily restarting after 1 error in a row: RuntimeError: injected")
    status, body = await served.get("/readyz")
    assert status == 503 and "daily restarting" in body
    _, metrics = await served.get("/metrics")
    assert 'depositd_task_up{task="daily"} 0.0' in metrics
    assert 'depositd_task_errors_total{task="daily"} 1.0' in metrics
    assert 'depositd_task_up{task="outbox"} 1.0' in metrics
    await until(lambda: served.status()["tasksDown"], "status to list the task")
    [(instance, [shown])] = served.status()["tasksDown"].items()
    assert shown == problem and instance
    assert await served.stop() == 0


async def test_a_task_failing_again_and_again_stops_the_service_with_1(
    start_serve: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task that fails each time it restarts is given up after a few tries: the service
    exits 1 (systemd's Restart=on-failure starts it afresh) instead of serving on without it,
    and `status` says which task and why."""
    monkeypatch.setattr(supervise, "RESTART_BASE_S", 0.01)

    async def always(self: Runtime) -> None:
        raise RuntimeError("provider check broken")

    monkeypatch.setattr(Runtime, "check_providers", always)
    with capture_logs() as logs:
        served = await start_serve()
        assert served.task is not None
        assert await asyncio.wait_for(served.task, 30) == 1
    failed = [e for e in logs if e["event"] == "task failed"]
    assert len(failed) == supervise.GIVE_UP_AFTER and {e["task"] for e in failed} == {"daily"}
    assert any(
        e["event"] == "a task of the service failed; stopping" and e["task"] == "daily"
        for e in logs
    )
    [shown] = next(iter(served.status()["tasksDown"].values()))
    assert shown.startswith(f"daily stopped after {supervise.GIVE_UP_AFTER} errors in a row")


async def test_the_processor_ending_stops_the_service_with_1(
    start_serve: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processor's loop ending with an error (nothing stored would be processed) stops
    the service with 1 at once, logged with its name."""

    async def broken(self: Processor) -> None:
        raise RuntimeError("processor broken")

    monkeypatch.setattr(Processor, "run", broken)
    with capture_logs() as logs:
        served = await start_serve()
        assert served.task is not None
        assert await asyncio.wait_for(served.task, 30) == 1
    [failed] = [e for e in logs if e["event"] == "task failed"]
    assert failed["task"] == "processor" and "processor broken" in failed["error"]


async def test_a_poll_run_that_fails_is_logged_at_once_and_the_poll_runs_on(
    start_serve: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll's run is a task of its own: an error escaping it is logged as it happens with the
    poll's name (not when the task is collected), and the next run comes at its interval."""
    calls = failing_once(monkeypatch, Poller, "poll_history")
    with capture_logs() as logs:
        served = await start_serve()
        await until(lambda: len(calls) >= 2, "the next history poll")
        [failed] = [e for e in logs if e["event"] == "job failed"]
        assert failed["job"] == "history" and "injected into poll_history" in failed["error"]
        assert await served.stop() == 0


async def test_the_ingress_links_pings_run_again_after_an_error(
    start_serve: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Under a watchdog, serve pings its ingress process over their link; the pinging loop
    ending with an error is logged and runs again, so the ingress process stays watched."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    monkeypatch.setattr(supervise, "RESTART_BASE_S", 0.05)
    calls = failing_once(monkeypatch, CoreSide, "keep_pinging")
    try:
        with capture_logs() as logs:
            served = await start_serve(ingress=True)
            await until(lambda: len(calls) >= 2, "the pings to run again")
            [failed] = [e for e in logs if e["event"] == "task failed"]
            assert failed["task"] == "ingress link"
            assert await served.answers("/healthz", 200)
            assert await served.stop() == 0
    finally:
        notify.close()


async def test_a_reload_that_fails_is_logged_at_once(
    start_serve: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGHUP's reload runs as a task of its own: an error escaping it is logged as it
    happens, with the task's name, and the service serves on."""

    async def broken(self: Runtime) -> bool:
        raise RuntimeError("reload broken")

    monkeypatch.setattr(Runtime, "reload", broken)
    with capture_logs() as logs:
        served = await start_serve()
        os.kill(os.getpid(), signal.SIGHUP)
        await until(lambda: any(e["event"] == "task failed" for e in logs), "the error logged")
        [failed] = [e for e in logs if e["event"] == "task failed"]
        assert failed["task"] == "reload" and "reload broken" in failed["error"]
        assert await served.answers("/healthz", 200)
        assert await served.stop() == 0


async def test_the_tasks_down_are_recorded_per_instance_on_either_store(
    make_store: StoreMaker,
) -> None:
    """What `status` reads: each instance's tasks down, an instance with none left out, and
    all of it forgotten when the only instance starts."""
    store = make_store()
    await store.open()
    try:
        down = ["outbox restarting after 1 error in a row: RuntimeError: x"]

        async def recorded() -> dict[str, list[str]]:
            return json.loads(await store.read(lambda db: get_meta(db, TASKS_DOWN)) or "{}")

        await store.write(partial(supervise.record_down, instance="a", problems=down))
        await store.write(partial(supervise.record_down, instance="b", problems=down))
        assert await recorded() == {"a": down, "b": down}
        await store.write(partial(supervise.record_down, instance="a", problems=[]))
        assert await recorded() == {"b": down}
        await store.write(supervise.record_gone)
        assert await recorded() == {}
    finally:
        await store.close()
