"""Memory of the catch-up and backfill window generator over a ten-year span, against building
every window first (what the reader did before), in the same run.

Not a test. Prints the tracemalloc peak of taking the first window of each, for window sizes
of a minute, ten minutes and an hour (the shipped `scheduler.catchup_window_s` is in between).

    .venv/bin/python bench/windows.py
"""

from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import Callable
from typing import Any

from worker.poll.catchup import windows

TEN_YEARS_MS = 3653 * 86_400_000
START_MS = 1_480_000_000_000


def all_first(start: int, end: int, size: int) -> Any:
    """Every window built before the first is read (the former reader)."""
    bounds = [*range(start, end, max(1, size)), end]
    return list(itertools.pairwise(bounds))[::-1][-1]


def lazy_first(start: int, end: int, size: int) -> Any:
    """The generator: the first window only."""
    return next(windows(start, end, size))


def peak(fn: Callable[[int, int, int], Any], size: int) -> int:
    tracemalloc.start()
    try:
        fn(START_MS, START_MS + TEN_YEARS_MS, size)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    print(f"{'window':>8} {'windows':>10} {'all first':>12} {'generator':>10} {'ratio':>8}")
    for size_s in (60, 600, 3600):
        size = size_s * 1000
        count = -(-TEN_YEARS_MS // size)
        before, after = peak(all_first, size), peak(lazy_first, size)
        ratio = before / max(after, 1)
        print(f"{size_s:>7}s {count:>10} {before:>11,}B {after:>9,}B {ratio:>7.0f}x")


if __name__ == "__main__":
    main()
