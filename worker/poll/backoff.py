"""The polls' back-off after failures in a row (the history, detail and blocked polls, and the
abnormal-fund poll)."""

from __future__ import annotations

import random

from worker.act.queue import backoff


def poll_backoff(failures: int, base_s: float, max_s: float) -> float:
    """How long a poll waits after `failures` failures in a row: doubling from twice `base_s`,
    at most `max_s`, with jitter (half to all of it) so that several instances do not retry in
    step; the exponent is capped, so a provider down for days cannot overflow it."""
    return backoff(failures + 1, base_s, max_s) * (0.5 + random.random() / 2)
