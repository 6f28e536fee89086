"""Whose transaction detail a detail run reads (worker.poll.detailplan, docs/polling.md)."""

from __future__ import annotations

from worker.config.settings import SchedulerSettings
from worker.poll.detailplan import DetailPlan, Listing, detail_wait_ms

MIN = 60_000
HOUR = 60 * MIN
T0 = 1_800_000_000_000
SETTINGS = SchedulerSettings.model_validate({"history_interval_s": 60, "detail_interval_s": 120})


def test_the_wait_doubles_with_age_up_to_the_cap() -> None:
    """Every 2 min while young (under an hour without news), then 4, 8, 16, 32 min, then hourly."""
    ages = (0, 59 * MIN, HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR, 16 * HOUR, 30 * 24 * HOUR)
    waits = [detail_wait_ms(age, SETTINGS) // 1000 for age in ages]
    assert waits == [120, 120, 240, 480, 960, 1920, 3600, 3600]


def reads_over(plan: DetailPlan, rows: list[tuple[str, str, int]], start: int, hours: int) -> int:
    """How many detail reads the runs every 120 s make over `hours` from `start`."""
    reads = 0
    for now in range(start, start + hours * HOUR, 2 * MIN):
        for tx in plan.due(rows, now):
            plan.read(tx, now)
            reads += 1
    return reads


def test_a_deposit_in_motion_is_read_every_run_while_young_and_less_as_it_ages() -> None:
    """A submitted deposit: 30 reads in its first hour, 15 in its second, 1 an hour after a
    day; a new fact makes it young again."""
    plan = DetailPlan(SETTINGS, T0)
    rows = [("tx", "submitted", T0)]
    assert reads_over(plan, rows, T0, 1) == 30
    assert reads_over(plan, rows, T0 + HOUR, 1) == 15
    assert reads_over(plan, rows, T0 + 30 * HOUR, 3) == 3
    news = T0 + 33 * HOUR
    assert reads_over(plan, [("tx", "submitted", news)], news, 1) == 30


def test_a_queued_deposit_is_left_to_the_queue_read_until_it_leaves_it() -> None:
    """Listed by the queue read: never read; no longer listed: read at the next run, then on
    the schedule of its age; a queue read too old to trust: read on that schedule too."""
    plan = DetailPlan(SETTINGS, T0)
    rows = [("queued", "needs_details", T0 - 48 * HOUR), ("gone", "rejected", T0 - 48 * HOUR)]
    assert plan.due(rows, T0) == [], "before the first queue read, waiting deposits wait"
    plan.listed(Listing(T0, T0 + 1000, frozenset({"queued", "gone"})))
    assert plan.due(rows, T0 + 2 * MIN) == []
    plan.listed(Listing(T0 + 2 * MIN, T0 + 2 * MIN + 1000, frozenset({"queued"})))
    assert plan.due(rows, T0 + 3 * MIN) == ["gone"]
    plan.read("gone", T0 + 3 * MIN)
    assert plan.due(rows, T0 + 4 * MIN) == [], "read once; an old deposit waits an hour"
    # No queue read for three history intervals: the listing is no longer trusted.
    assert plan.due(rows, T0 + 2 * MIN + 1000 + 3 * MIN + 1) == ["queued"]
    later = T0 + 3 * MIN + HOUR
    plan.listed(Listing(later - 1000, later, frozenset({"queued"})))
    assert plan.due(rows, later) == ["gone"]


def test_a_deposit_announced_after_the_queue_read_began_waits_for_the_next_one() -> None:
    """A webhook tracked it after the queue read started: the next queue read lists it."""
    plan = DetailPlan(SETTINGS, T0)
    plan.listed(Listing(T0, T0 + 1000, frozenset()))
    assert plan.due([("new", "needs_details", T0 + 500)], T0 + MIN) == []
    assert plan.due([("old", "needs_details", T0 - 500)], T0 + MIN) == ["old"]
