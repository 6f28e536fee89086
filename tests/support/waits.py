"""Bounded waits on a condition: a test waits for what it needs, never for a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

STEP_S = 0.02
LAST_CHECK_S = 1.0
T = TypeVar("T")


async def until(check: Callable[[], T], what: str, within_s: float = 15) -> T:
    """Poll `check` until it holds; what it returned then. Fail naming `what` after `within_s`
    seconds."""
    deadline = time.monotonic() + within_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out after {within_s}s waiting for {what}"
        await asyncio.sleep(STEP_S)
    return result


async def until_async(
    check: Callable[[], Awaitable[object]], what: str, within_s: float = 15
) -> None:
    """`until` for a check that awaits (a read of the store, an HTTP request). A check that
    does not return fails the wait at its deadline too (at least `LAST_CHECK_S` for the last
    one), instead of holding the test for as long as the check waits (an HTTP client's
    default timeout is five minutes)."""
    deadline = time.monotonic() + within_s
    while True:
        left = max(LAST_CHECK_S, deadline - time.monotonic())
        try:
            if await asyncio.wait_for(check(), left):
                return
        except TimeoutError:
            raise AssertionError(
                f"timed out after {within_s}s waiting for {what} (its last check did not return)"
            ) from None
        assert time.monotonic() < deadline, f"timed out after {within_s}s waiting for {what}"
        await asyncio.sleep(STEP_S)
