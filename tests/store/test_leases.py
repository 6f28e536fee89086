"""Leases and claims shared by several instances: one winner, taken over once lapsed."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlite_utils

from tests.support.stores import StoreMaker
from worker.store import actions, alerts, leases
from worker.store.pg import PgDatabase, connect
from worker.store.sqlitestore import Store

T0, T1, T2, T3 = (f"2026-01-01T00:00:0{n}.000Z" for n in range(4))


async def test_a_lease_has_one_holder_until_it_lapses(store: Store) -> None:
    """The first instance holds the lease; another gets it only once it lapsed; renewing keeps
    the time it was taken; a release frees it at once."""

    async def take(holder: str, now: str, until: str) -> leases.Lease:
        return await store.write(
            lambda db: leases.acquire(db, "scheduler", holder, now=now, until=until)
        )

    async def release(holder: str) -> bool:
        return await store.write(lambda db: leases.release(db, "scheduler", holder))

    t4, t5, t6, t7 = (f"2026-01-01T00:00:0{n}.000Z" for n in range(4, 8))
    assert (await take("a", T0, T2)).holder == "a"
    assert (await take("b", T1, T3)).holder == "a"  # a's lease runs until T2
    renewed = await take("a", T1, T3)
    assert (renewed.holder, renewed.acquired_at, renewed.expires_at) == ("a", T0, T3)
    over = await take("b", t4, t6)
    assert (over.holder, over.acquired_at) == ("b", t4)
    assert (await take("a", t5, t7)).holder == "b"
    assert await release("a") is False
    assert await release("b") is True
    assert (await take("a", t5, t7)).holder == "a"


def _action(db: sqlite_utils.Database) -> int:
    return actions.insert_action(
        db,
        transaction_id="tx-1",
        event_id="e-1",
        trigger="needs_details",
        rule_set=None,
        rule_set_version=None,
        rule=None,
        action="submit_profile",
        params=json.dumps({}),
        idempotency_key="key-1",
        status="pending",
        outcome=None,
    )


async def test_an_action_is_claimed_once_and_taken_over_with_its_key_once_lapsed(
    store: Store,
) -> None:
    """One instance claims a due row; the other cannot until the claim lapses, then runs it as
    the same row (same Idempotency-Key, one more attempt); the first can no longer record."""
    action_id = await store.write(_action)
    now = "9000-01-01T00:00:00.000Z"  # the row is due
    later = "9000-01-01T00:01:00.000Z"

    def claim(db: sqlite_utils.Database, who: str, at: str, until: str) -> bool:
        return actions.claim_action(db, action_id, instance=who, now=at, until=until)

    assert await store.write(lambda db: claim(db, "a", now, later))
    assert not await store.write(lambda db: claim(db, "b", now, later))
    assert [r["id"] for r in await store.read(lambda db: actions.due_actions(db, now, "b"))] == []
    assert await store.read(lambda db: actions.next_due_at(db, "b")) == later
    after = "9000-01-01T00:01:00.001Z"
    assert await store.write(lambda db: claim(db, "b", after, "9000-01-01T00:02:00.000Z"))
    row = (await store.read(lambda db: actions.actions_of(db, "tx-1")))[0]
    assert (row["claimed_by"], row["attempts"], row["idempotency_key"]) == ("b", 2, "key-1")

    def finish(db: sqlite_utils.Database, who: str) -> bool:
        return actions.finish_action(
            db, action_id, status="done", outcome="ok", next_attempt_at=after, instance=who
        )

    assert not await store.write(lambda db: finish(db, "a"))
    assert await store.write(lambda db: finish(db, "b"))
    assert not await store.write(lambda db: claim(db, "a", "9999-01-01T00:00:00.000Z", later))


async def test_an_alert_channel_is_claimed_by_one_instance_and_sent_once(store: Store) -> None:
    """Two instances sending the same alert: one claims the channel; once sent, nobody does;
    a claim of an instance that died lapses and the other sends it."""

    def claim(db: sqlite_utils.Database, key: str, who: str, now: str, until: str) -> bool:
        return alerts.claim_alert(
            db,
            key,
            transaction_id="tx-1",
            condition="rejected",
            severity="warning",
            channel="slack",
            instance=who,
            now=now,
            until=until,
        )

    assert await store.write(lambda db: claim(db, "k1", "a", T0, T2))
    assert not await store.write(lambda db: claim(db, "k1", "b", T1, T3))
    await store.write(
        lambda db: alerts.record_send(db, "k1", status="sent", error=None, instance="a")
    )
    assert not await store.write(lambda db: claim(db, "k1", "b", T3, T3))
    assert await store.write(lambda db: claim(db, "k2", "a", T0, T1))
    assert await store.write(lambda db: claim(db, "k2", "b", T2, T3))  # a's claim lapsed


async def test_only_the_channel_claimant_records_a_send(store: Store) -> None:
    """An instance whose channel claim was taken over records nothing (the claimant's send is
    the one recorded); a renewal keeps a claim only for its holder."""

    def claim(db: sqlite_utils.Database, who: str, now: str, until: str) -> bool:
        return alerts.claim_alert(
            db,
            "k1",
            transaction_id="tx-1",
            condition="rejected",
            severity="warning",
            channel="slack",
            instance=who,
            now=now,
            until=until,
        )

    def record(db: sqlite_utils.Database, who: str, status: str) -> bool:
        return alerts.record_send(db, "k1", status=status, error=None, instance=who)

    assert await store.write(lambda db: claim(db, "a", T0, T1))
    assert await store.write(lambda db: claim(db, "b", T2, T3))  # a's claim lapsed
    assert await store.write(lambda db: alerts.renew_alert_claims(db, ["k1"], "a", T3)) == 0
    assert not await store.write(lambda db: record(db, "a", "failed"))
    [row] = await store.read(lambda db: alerts.alerts_of(db, "tx-1"))
    assert (row["status"], row["attempts"], row["lease_until"]) == ("pending", 0, T3)
    assert await store.write(lambda db: alerts.renew_alert_claims(db, ["k1"], "b", T3)) == 1
    assert await store.write(lambda db: record(db, "b", "sent"))
    [row] = await store.read(lambda db: alerts.alerts_of(db, "tx-1"))
    assert (row["status"], row["attempts"]) == ("sent", 1)


async def test_the_only_instance_starting_releases_every_claim(store: Store) -> None:
    """Claims and leases of instances gone are released at once by the sole instance."""
    action_id = await store.write(_action)
    due, far = "9000-01-01T00:00:00.000Z", "9999-01-01T00:00:00.000Z"
    assert await store.write(
        lambda db: actions.claim_action(db, action_id, instance="gone", now=due, until=far)
    )
    await store.write(lambda db: leases.acquire(db, "scheduler", "gone", now=T0, until=far))
    assert await store.write(actions.release_claims) == 1
    await store.write(leases.clear_leases)
    assert await store.write(
        lambda db: actions.claim_action(db, action_id, instance="new", now=due, until=far)
    )
    assert await store.read(lambda db: leases.get_lease(db, "scheduler")) is None


@pytest.mark.parametrize("engine", ["postgres"])
async def test_racing_instances_on_postgres_lose_a_claim_without_an_error(
    make_store: StoreMaker,
) -> None:
    """Two instances' transactions claiming the same lease, action and alert at once: the one
    that waits for the other's commit sees the row taken (a lost claim), never an error."""
    store = make_store("d.db")
    await store.open()
    action_id = await store.write(_action)
    await store.close()
    due, until = "9000-01-01T00:00:00.000Z", "9000-01-01T00:01:00.000Z"

    def claims(db: Any, who: str) -> tuple[str, bool, bool]:
        lease = leases.acquire(db, "scheduler", who, now=due, until=until)
        action = actions.claim_action(db, action_id, instance=who, now=due, until=until)
        alert = alerts.claim_alert(
            db,
            "k1",
            transaction_id="tx-1",
            condition="rejected",
            severity="warning",
            channel="slack",
            instance=who,
            now=due,
            until=until,
        )
        return lease.holder, action, alert

    first, second = (PgDatabase(connect(make_store.url("d.db"))) for _ in range(2))
    try:
        first.execute("BEGIN")  # read committed, as the store's group transaction
        assert claims(first, "a") == ("a", True, True)
        with ThreadPoolExecutor(1) as pool:
            second.execute("BEGIN")
            waiting = pool.submit(claims, second, "b")  # waits on a's uncommitted rows
            await asyncio.sleep(0.3)
            assert not waiting.done()
            first.execute("COMMIT")
            assert waiting.result(10) == ("a", False, False)
        second.execute("COMMIT")
    finally:
        first.close()
        second.close()
