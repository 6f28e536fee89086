"""Bounded waits on a condition: a test waits for what it needs, never for a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

STEP_S = 0.02
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
    """`until` for a check that awaits (a read of the store, an HTTP request)."""
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out after {within_s}s waiting for {what}"
        await asyncio.sleep(STEP_S)
