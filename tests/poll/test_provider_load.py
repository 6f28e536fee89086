"""What depositd asks of the provider: it grows with the pages of the work queues, not with the
deposits waiting on a person (docs/polling.md). The polls run on a virtual clock against the
real sandbox, store, tracker and rules (worker.dev.polldriver), so minutes of polling take
seconds and nothing here depends on the machine's speed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from worker.config.settings import SchedulerSettings
from worker.dev.polldriver import PollDriver

DETAIL_S = 20.0


@pytest.fixture
async def driver(tmp_path: Path) -> AsyncIterator[PollDriver]:
    """A sandbox and one serve's polls: history every 10 s, detail every 20 s."""
    settings = SchedulerSettings.model_validate(
        {"history_interval_s": 10, "detail_interval_s": DETAIL_S}
    )
    polls = PollDriver(tmp_path, settings)
    await polls.start()
    try:
        yield polls
    finally:
        await polls.stop()


async def test_1000_waiting_cost_under_300_calls_in_two_minutes_and_lost_approvals_book_in_time(
    driver: PollDriver,
) -> None:
    """1,000 deposits wait on a person and 20 are under review, every webhook lost: two minutes
    of polling cost at most 300 provider calls (one detail read per waiting deposit every run
    cost 6,000 before), and each approval is booked within 3 x detail_interval_s."""
    driver.inject(1000, "Waiting")
    moving = driver.submitted(20, "Moving")
    approved = moving[:10]
    assert driver.sandbox is not None
    approve_at = 35.0
    booked_at: dict[str, float] = {}

    async def note_booked(job: str, elapsed_s: float) -> None:
        for tx in await driver.booked():
            booked_at.setdefault(tx, elapsed_s)

    def approve() -> None:
        assert driver.sandbox is not None
        for tx in approved:
            driver.sandbox.approve_review(tx)

    await driver.run(120, at={approve_at: approve}, after_run=note_booked)

    calls = driver.calls.by_endpoint()
    print(f"provider calls in two minutes: {driver.calls.total()} {calls}")
    assert driver.calls.total() <= 300, calls
    assert set(booked_at) == set(approved)
    late = {tx: t - approve_at for tx, t in booked_at.items() if t - approve_at > 3 * DETAIL_S}
    assert late == {}, "booked later than 3 x detail_interval_s after the approval"
    # No waiting deposit's detail is read while the queue lists it: the detail reads are
    # those of the 20 in motion.
    assert calls["transaction_detail"] <= 20 * (120 / DETAIL_S + 1)


async def test_a_deposit_that_leaves_the_queue_is_read_by_the_next_detail_run(
    driver: PollDriver,
) -> None:
    """Details sent on the provider's hosted page and approved, webhooks lost: the deposit
    leaves the init queue, and the next detail run after the queue read reads and books it."""
    (tx,) = driver.inject(1, "Hosted")
    assert driver.sandbox is not None
    await driver.run(30)
    before = driver.calls.by_endpoint().get("transaction_detail", 0)
    assert before == 0, "a listed waiting deposit needs no detail read"

    def hosted_page() -> None:
        assert driver.sandbox is not None
        driver.sandbox.submit(tx, {"correspondentType": "ENTITY", **_ENTITY})
        driver.sandbox.approve_review(tx)

    booked_at: list[float] = []

    async def note(job: str, elapsed_s: float) -> None:
        if not booked_at and tx in await driver.booked():
            booked_at.append(elapsed_s)

    await driver.run(60, at={1.0: hosted_page}, after_run=note)
    assert booked_at, "never booked"
    # Found by the next queue read (<= 10 s), read by the next detail run (<= 20 s).
    assert booked_at[0] - 1.0 <= 10 + DETAIL_S


_ENTITY = {
    "fullName": "Acme Trading Ltd",
    "countryCode": "SG",
    "companyAddress": "1 Raffles Place, Singapore",
    "walletType": "VASP",
    "provider": "Binance",
}


async def test_first_start_reads_an_empty_lookback_in_one_request(driver: PollDriver) -> None:
    """No mark yet: the three days of lookback are one window (hourly windows cost 72 requests
    for an empty history), and the mark is set to its end."""
    assert driver.catchup is not None
    stats = await driver.catchup.catch_up()
    assert stats is not None and stats.complete and stats.windows == 1
    assert driver.calls.by_endpoint() == {"history": 1}


async def test_first_start_splits_only_a_full_window(tmp_path: Path) -> None:
    """A lookback with more pages than the cap is split in halves until each fits: 1,200
    deposits of the last three hours at 500 a page and 2 pages a window cost a few requests,
    not one window an hour (72)."""
    settings = SchedulerSettings.model_validate({"max_pages": 2})
    polls = PollDriver(tmp_path, settings)
    await polls.start()
    try:
        for hour in range(3):
            polls.inject(400, f"Full{hour}")
            polls.clock.ms += 3_600_000
        assert polls.catchup is not None
        stats = await polls.catchup.catch_up()
        assert stats is not None and stats.complete and stats.new_deposits == 1200
        print(f"first start over 1,200 deposits: {polls.calls.by_endpoint()} {stats}")
        # One first page of each window too full (halving 72 h down to the last hours), then
        # the pages of the windows that fit.
        assert polls.calls.by_endpoint()["history"] <= 15, polls.calls.by_endpoint()
    finally:
        await polls.stop()
