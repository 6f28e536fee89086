"""The console's "read the detail now" on an instance that follows the scheduler's leader
(several instances on one database; both engines)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.support.stores import StoreMaker
from worker.dev.harness import Stack
from worker.errors import ProviderError
from worker.store.facts import facts_of

# Every test here runs on SQLite and on PostgreSQL, its stacks too.
pytestmark = pytest.mark.usefixtures("engine")

StartStack = Callable[..., Awaitable[Stack]]


async def test_a_follower_reads_a_deposit_detail_on_demand(
    start_stack: StartStack, make_store: StoreMaker
) -> None:
    """The instance that does not lead the scheduler still reads a deposit's detail when the
    operator asks, and records what it read."""
    slow: dict[str, Any] = {"history_interval_s": 60, "detail_interval_s": 60}
    storage = make_store.storage("shared.db")
    leader = await start_stack(storage=storage, **slow)
    follower = await start_stack(storage=storage, notify=False, sole=False, **slow)
    assert leader.runtime.leader is not None and leader.runtime.leader.leading
    assert follower.runtime.leader is not None and not follower.runtime.leader.leading
    follower.sandbox.drop_webhooks(10)  # only the detail read tells the database
    order = follower.sandbox.inject_deposit(1001, "USDT", "TRON", "12.5", "TFollowerDetail00001")
    tx = order["transactionId"]
    assert await follower.runtime.read_detail(tx)
    facts = await follower.store.read(lambda db: facts_of(db, tx))
    assert any(f["source"] == "poll" for f in facts)


async def test_without_the_scheduler_the_detail_read_says_so(start_stack: StartStack) -> None:
    """With `scheduler.enabled: false` the read is refused with that reason."""
    stack = await start_stack(scheduler=False, notify=False)
    with pytest.raises(ProviderError, match=r"scheduler\.enabled: false"):
        await stack.runtime.read_detail("tx-any")
