"""`ignore`: the rule set stops here for this trigger; the row says so, nothing runs."""

from __future__ import annotations

from worker.act import specs
from worker.act.kinds.base import Kind, Recording


def record(rec: Recording) -> None:
    """A done row: the rules ignored the deposit on this trigger."""
    rec.add(params={}, status="done", outcome="ignored by rule")


KIND = Kind(specs.IGNORE, record)
