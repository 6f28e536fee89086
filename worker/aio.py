"""Small asyncio helpers shared by the service's loops."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection
from typing import Any


async def first_done(*waits: Awaitable[Any], at_most_s: float | None = None) -> None:
    """Wait until the first of `waits` is done (or `at_most_s` seconds pass).

    Coroutines are wrapped in tasks and the unfinished ones cancelled on return; futures passed
    in (e.g. a protocol's `closed`) are left as they are.
    """
    futures = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(futures, timeout=at_most_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait, future in zip(waits, futures, strict=True):
            if future is not wait:
                future.cancel()


async def finish_or_cancel(
    tasks: Collection[asyncio.Future[Any]], grace_s: float | None
) -> list[Any]:
    """Wait for `tasks`; those still running after `grace_s` seconds are cancelled. Returns
    their results or exceptions (a cancelled one gives its CancelledError), never raising."""
    if grace_s is not None and tasks:
        _, late = await asyncio.wait(tasks, timeout=grace_s)
        for task in late:
            task.cancel()
    return await asyncio.gather(*tasks, return_exceptions=True)
