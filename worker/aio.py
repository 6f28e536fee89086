"""Small asyncio helpers shared by the service's loops."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
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
