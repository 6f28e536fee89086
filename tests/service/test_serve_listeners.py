"""`serve` binds every listener before any stage that acts: a taken port stops it (exit 2,
naming the setting and HOST:PORT) before the database is opened; a clean stop logs no warning."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import serve_config, write_config
from tests.support.ports import free_port
from tests.support.processes import Processes


def _config(
    tmp_path: Path,
    provider_url: str,
    port: int,
    storage: dict[str, Any] | None = None,
    **extra: Any,
) -> Path:
    token = tmp_path / "console_token"
    token.write_text("a-console-token\n")
    token.chmod(0o600)
    cfg = serve_config(
        storage or tmp_path / "depositd.db",
        provider_url,
        port,
        scheduler={"history_interval_s": 1, "detail_interval_s": 1},
        **extra,
    )
    return write_config(tmp_path, cfg)


def _lines(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"level": "raw", "event": line})
    return out


@pytest.mark.parametrize("setting", ["console.listen", "webhook.ops_listen"])
async def test_a_taken_port_stops_serve_before_it_acts(
    tmp_path: Path, provider_url: str, setting: str, processes: Processes
) -> None:
    """The console's (or the operational endpoints') port held by another process: serve exits
    2 with one error naming that setting and HOST:PORT, and never opened the database (no
    poll, no booking, no alert could have run)."""
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        extra: dict[str, Any] = {}
        if setting == "console.listen":
            extra["console"] = {"listen": f"127.0.0.1:{busy}", "token_file": "console_token"}
        else:
            extra["webhook"] = {"ops_listen": f"127.0.0.1:{busy}"}
        config = _config(tmp_path, provider_url, port, **extra)
        log = tmp_path / "serve.log"
        proc = await processes.serve(config, port, log).spawn()
        assert await asyncio.wait_for(proc.wait(), 30) == 2
    errors = [line for line in _lines(log) if line.get("level") == "error"]
    assert len(errors) == 1, errors
    assert errors[0]["setting"] == setting and errors[0]["listen"] == f"127.0.0.1:{busy}"
    assert f"depositd status --config {config}" in errors[0]["hint"]
    assert not (tmp_path / "depositd.db").exists()


async def test_a_second_instance_on_one_sqlite_file_is_refused(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """A second serve on the same SQLite file (other ports) exits 2 naming the first one's pid
    and ports; the first keeps serving. One told it may share (storage.several_instances)
    joins."""
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first_dir.mkdir(), second_dir.mkdir()
    storage = {"path": str(tmp_path / "depositd.db")}
    port, other = free_port(), free_port()
    first = processes.serve(
        _config(first_dir, provider_url, port, storage=storage), port, first_dir / "serve.log"
    )
    try:
        await first.start()
        second = _config(second_dir, provider_url, other, storage=storage)
        log = second_dir / "serve.log"
        proc = await processes.serve(second, other, log).spawn()
        assert await asyncio.wait_for(proc.wait(), 30) == 2
        errors = [line for line in _lines(log) if line.get("level") == "error"]
        assert len(errors) == 1, errors
        assert first.proc is not None
        assert (
            f"(pid {first.proc.pid}, webhook.listen 127.0.0.1:{port}) already serves"
            in (errors[0]["error"])
        )
        assert "storage.several_instances: true" in errors[0]["error"]
        assert first.proc.returncode is None

        shared = {**storage, "several_instances": True}  # told it may share: it joins
        joined = processes.serve(
            _config(second_dir, provider_url, other, storage=shared), other, log
        )
        try:
            await joined.start()
            assert await joined.signal(signal.SIGTERM) == 0
        finally:
            await joined.kill()
    finally:
        await first.kill()


async def test_a_clean_stop_logs_no_warning(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """Started (leading the scheduler, console open) and stopped with SIGTERM: exit 0, and no
    line at warning or above in the log."""
    port, console_port = free_port(), free_port()
    console = {"listen": f"127.0.0.1:{console_port}", "token_file": "console_token"}
    config = _config(tmp_path, provider_url, port, console=console)
    log = tmp_path / "serve.log"
    serve = processes.serve(config, port, log)
    try:
        await serve.start()
        for _ in range(200):
            if any(line.get("event") == "leading" for line in _lines(log)):
                break
            await asyncio.sleep(0.05)
        assert await serve.signal(signal.SIGTERM) == 0
    finally:
        await serve.kill()
    lines = _lines(log)
    assert any(line.get("event") == "stopped" for line in lines)
    loud = [line for line in lines if line.get("level") not in ("debug", "info")]
    assert loud == [], loud


async def test_the_start_up_steps_are_logged_at_debug_in_order(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """With `log.level: debug`, each step of the start is a `start-up step` line, in the order
    docs/operations.md ("Start-up time") lists them, the last one just before "serving"; at
    info there is none."""
    port = free_port()
    config = _config(tmp_path, provider_url, port, log={"format": "json", "level": "debug"})
    log = tmp_path / "serve.log"
    serve = processes.serve(config, port, log)
    try:
        await serve.start()
        assert await serve.signal(signal.SIGTERM) == 0
    finally:
        await serve.kill()
    lines = _lines(log)
    steps = [line["step"] for line in lines if line.get("event") == "start-up step"]
    assert steps == [
        "settings read",
        "ports and database lock held",
        "ingress process started",
        "rules, profiles and store checked: READY",
        "stages imported",
        "stages built",
        "store open and stages started",
        "ingress process listening",
    ]
    events = [line.get("event") for line in lines]
    last = max(i for i, e in enumerate(events) if e == "start-up step")
    assert events.index("serving") > last
    assert events.index("store open") < events.index("serving")

    quiet = tmp_path / "quiet"
    quiet.mkdir()
    other = free_port()
    info = processes.serve(_config(quiet, provider_url, other), other, quiet / "serve.log")
    try:
        await info.start()
        assert await info.signal(signal.SIGTERM) == 0
    finally:
        await info.kill()
    assert not [
        line for line in _lines(quiet / "serve.log") if line.get("event") == "start-up step"
    ]
