"""The action kinds a rule may name, registered in one place.

Adding a kind is its spec in `worker.act.specs` (what a rule may say of it: the rule loader
accepts it through `SPECS`), one module here building a `Kind` (`worker.act.kinds.base`) and
one entry in `KINDS`: the reactor records it, the outbox runs it and `depositd check` reads what
it warns about, all from that entry. The order is the order
`check` and the rule loader's messages name them in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from worker.act.kinds import alert, book, forward, ignore, orders, submit
from worker.act.kinds.base import Kind, Runner, RunnerDeps
from worker.act.specs import SPECS

KINDS: Mapping[str, Kind] = {
    kind.name: kind for kind in (submit.KIND, book.KIND, alert.KIND, forward.KIND, ignore.KIND)
}
# Rows no rule names, queued by depositd itself, and the runner the outbox runs them on.
ROW_RUNNERS: Mapping[str, Callable[[RunnerDeps], Runner]] = {
    orders.ORDER_ROW: orders.OrderReader.build,
}

__all__ = ["KINDS", "ROW_RUNNERS", "SPECS", "Kind"]
