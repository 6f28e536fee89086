"""Time: epoch milliseconds (the provider's) and ISO 8601 UTC strings (the store's and output's).

Every clock read and every conversion between the two lives here.
"""

from __future__ import annotations

import functools
import time
from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_second: tuple[int, str] = (-1, "")  # the last whole second formatted: utc_now runs per request


def utc_now() -> str:
    """Now as ISO 8601 UTC with milliseconds and a Z."""
    global _second
    now = time.time()
    whole = int(now)
    cached = _second
    if cached[0] != whole:
        cached = _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{cached[1]}.{int((now - whole) * 1000):03d}Z"


def now_ms() -> int:
    """Milliseconds since the epoch, as sent in API-TIMESTAMP."""
    return time.time_ns() // 1_000_000


def iso_from_ms(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC, 'YYYY-MM-DDTHH:MM:SS.sssZ'."""
    whole, milli = divmod(ms, 1000)
    return f"{_iso_second(whole)}.{milli:03d}Z"


@functools.lru_cache(maxsize=4096)
def _iso_second(whole: int) -> str:
    """A whole second as 'YYYY-MM-DDTHH:MM:SS' (runs a few times per event: cached)."""
    moment = datetime(1970, 1, 1) + timedelta(seconds=whole)
    return moment.isoformat(timespec="seconds")


def ms_from_iso(text: str) -> int:
    """ISO 8601 (naive means UTC) as epoch milliseconds, without passing through float."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def duration_text(seconds: int) -> str:
    """A span in its two largest units, e.g. `2 d 3 h`, `4 h 12 min`, `5 min`, `40 s`."""
    seconds = max(0, int(seconds))
    parts: list[str] = []
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size} {unit}")
            seconds %= size
        if len(parts) == 2 or (parts and seconds == 0):
            break
    return " ".join(parts)


# No deposit can be older than the first block of the first chain (Bitcoin, 2009-01-03 UTC):
# `backfill --since` refuses an earlier time.
HISTORY_FLOOR = "2009-01-03T00:00:00Z"
