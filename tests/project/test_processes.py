"""The `processes` fixture's owner: what a test started is gone once it ended, failed or not."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest

from tests.support.processes import Processes

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


async def test_what_a_failing_test_started_is_killed_and_reaped() -> None:
    """A test that fails with a command, a Popen and a process it waits for still running:
    the teardown kills and reaps the running ones and leaves the finished one alone."""
    owned = Processes()
    command = owned.own(await asyncio.create_subprocess_exec(*SLEEPER))
    popen = owned.own(subprocess.Popen(SLEEPER))  # noqa: ASYNC220 (as tests that use one do)
    done = owned.own(await asyncio.create_subprocess_exec(sys.executable, "-c", "pass"))
    assert await done.wait() == 0
    with pytest.raises(AssertionError, match="the test fails"):
        try:
            raise AssertionError("the test fails")
        finally:
            await owned.kill_all()
    assert command.returncode == -signal.SIGKILL
    assert popen.poll() == -signal.SIGKILL
    assert done.returncode == 0
