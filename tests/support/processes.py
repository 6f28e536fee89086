"""`python -m worker serve` as a subprocess, for the tests that kill or signal it; free ports;
`Processes`, which owns what a test starts (the `processes` fixture); a command run as a
process (`cli`); the children of a process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self, TypeVar

import aiohttp

from tests.support.paths import ROOT


class ServeProcess:
    """`python -m worker serve --config CFG`, its stderr appended to `log`."""

    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.config, self.port, self.log = config, port, log
        self.proc: asyncio.subprocess.Process | None = None

    async def spawn(self) -> asyncio.subprocess.Process:
        """Start the process without waiting for it to answer."""
        with self.log.open("ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *[sys.executable, "-m", "worker", "serve", "--config", str(self.config)],
                cwd=ROOT,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        return self.proc

    async def start(self, timeout_s: float = 20) -> None:
        """Start and wait until /healthz answers."""
        await self.spawn()
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                assert self.proc.returncode is None, self.log.read_text()
                try:
                    async with session.get(f"http://127.0.0.1:{self.port}/healthz") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise AssertionError("serve did not start: " + self.log.read_text())

    async def signal(self, sig: int, timeout_s: float = 30) -> int:
        """Send a signal and wait for the exit status."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), timeout_s)

    async def kill(self) -> None:
        """Make sure the process is gone (test teardown)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.kill()  # one that never answered is not left running
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kill()


Owned = TypeVar("Owned", bound=asyncio.subprocess.Process | subprocess.Popen[Any] | ServeProcess)


class Processes:
    """The processes a test starts: every one still running is killed (SIGKILL) and reaped when
    the test ends, whether it passed or failed, so that none outlives it."""

    def __init__(self) -> None:
        self._serves: list[ServeProcess] = []
        self._started: list[asyncio.subprocess.Process | subprocess.Popen[Any]] = []

    def serve(self, config: Path, port: int, log: Path) -> ServeProcess:
        """A `ServeProcess` (not started yet) owned by the test."""
        return self.own(ServeProcess(config, port, log))

    def own(self, proc: Owned) -> Owned:
        """Own a process started by the test (`asyncio.create_subprocess_exec`, `Popen`), or a
        `ServeProcess` (a `Service`) it made."""
        if isinstance(proc, ServeProcess):
            self._serves.append(proc)
        else:
            self._started.append(proc)
        return proc

    async def kill_all(self) -> None:
        """Kill and reap every owned process still running; close the pipes of a `Popen`."""
        for serve in self._serves:
            await serve.kill()
        for proc in self._started:
            if isinstance(proc, subprocess.Popen):
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGKILL)
                    await asyncio.get_running_loop().run_in_executor(None, proc.wait)
                for pipe in (proc.stdin, proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
            elif proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                await proc.wait()


async def cli(config: Path, *args: str, within: float = 30) -> tuple[int, str, str]:
    """Run `python -m worker ARGS --config CONFIG` (at most `within` s); status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "worker", *args, "--config", str(config)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within)
    finally:
        if proc.returncode is None:  # out of time, or the test cancelled: none left running
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces: the fields after ") " are fixed.
        if int(stat.rpartition(") ")[2].split()[1]) == pid:
            found.append(int(entry))
    return found
