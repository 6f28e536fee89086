"""Two instances on one PostgreSQL database applying facts about the same deposit: each change
is kept, whichever instance applies it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from decimal import Decimal

import pytest

from tests.support.pgcluster import Cluster
from worker.provider.models import CreditStatus, OrderStatus
from worker.store.deposits import get_deposit_row
from worker.store.events import pending_events
from worker.store.pg import PgDatabase, connect
from worker.store.pgstore import PgStore
from worker.store.sqlitestore import event_row
from worker.track.batch import BatchWrites
from worker.track.processor import apply_fact
from worker.track.tracker import Deposit, Fact

TX = "tx-shared"
T0 = 1_767_225_600_000


@pytest.fixture
def seeded_pg_url(pg_cluster: Cluster) -> Iterator[str]:
    """A fresh database, migrated, with one pending event about TX."""
    url = pg_cluster.create_database()

    async def seed() -> None:
        store = PgStore(url)
        await store.open()
        body = b'{"eventId": "e1"}'
        row = event_row("e1", "X", TX, TX, body, {}, "2026-01-01T00:00:00.000Z")
        assert await store.queue_event(row)  # type: ignore[arg-type]
        await store.close()

    asyncio.run(seed())
    yield url
    pg_cluster.drop_database(url)


def _event_fact() -> Fact:
    return Fact(
        TX,
        "webhook",
        T0,
        event_id="e1",
        event_type="DEPOSIT_STATUS_CHANGED",
        status=OrderStatus.PROCESSING,
        wallet_id=7,
        currency="USDT",
        network="TRON",
        amount=Decimal("10.50"),
    )


def test_a_poll_waits_for_the_batch_of_another_instance_holding_the_deposit(
    seeded_pg_url: str,
) -> None:
    """A poll's fact applied while another instance's batch holds the deposit is applied after
    that batch commits, on the row it wrote: neither the event's change nor the poll's is lost."""
    one, two = PgDatabase(connect(seeded_pg_url)), PgDatabase(connect(seeded_pg_url))
    done = threading.Event()
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            two.execute("BEGIN")
            fact = Fact(TX, "poll", T0 + 1000, credit_status=CreditStatus.CREDITED)
            apply_fact(two, fact, None)  # type: ignore[arg-type]
            two.execute("COMMIT")
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)
        finally:
            done.set()

    try:
        one.execute("BEGIN")
        events = pending_events(one, limit=10)  # type: ignore[arg-type]
        assert [e.event_id for e in events] == ["e1"]
        batch = BatchWrites.read(one, events, defer=True)  # type: ignore[arg-type]
        apply_fact(one, _event_fact(), None, batch)  # type: ignore[arg-type]
        polling = threading.Thread(target=poll)
        polling.start()
        time.sleep(0.5)
        assert not done.is_set()  # waiting for the batch's deposit
        batch.flush(one)  # type: ignore[arg-type]
        one.execute("COMMIT")
        polling.join(10)
        assert not errors
        row = get_deposit_row(one, TX)
        assert row is not None
        deposit = Deposit.from_row(row)
        assert deposit.status is OrderStatus.PROCESSING
        assert deposit.amount == Decimal("10.50")
        assert deposit.credit_status is CreditStatus.CREDITED
    finally:
        one.close()
        two.close()
