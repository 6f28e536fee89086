"""The times a deposit keeps beside its fields: the provider's credit time that dates a booking
for the daily report, the time a replayed poll fact takes from its row, and a deposit that
changed only in those times (not stored as a change).

If these slipped, a credit would be reconciled on the wrong day, or a replayed poll would be
dated as never seen and lose to an older fact.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from worker.provider.models import CreditStatus, OrderStatus, WhiteListStatus
from worker.store.deposits import CREDIT_DAY_TIME
from worker.track.tracker import Fact, observe

TX = "tx-times"
T0 = 1_760_000_000_000
PROVIDER_T = 1_759_999_000_000  # the provider's clock: never compared with ours


def fact(at: int, **fields: object) -> Fact:
    return Fact(TX, "poll", at, **fields)  # type: ignore[arg-type]


def test_a_credit_keeps_the_providers_time_of_it() -> None:
    start, _ = observe(None, fact(T0, status=OrderStatus.PROCESSING, amount=Decimal("5")))
    done, _ = observe(
        start, fact(T0 + 10, credit_status=CreditStatus.CREDITED, provider_time=PROVIDER_T)
    )
    assert done.field_times[CREDIT_DAY_TIME] == PROVIDER_T
    assert done.field_times["credit_status"] == T0 + 10


def test_a_credit_without_the_providers_time_dates_nothing() -> None:
    start, _ = observe(None, fact(T0, status=OrderStatus.PROCESSING))
    done, _ = observe(start, fact(T0 + 10, credit_status=CreditStatus.CREDITED))
    assert done.credit_status is CreditStatus.CREDITED
    assert CREDIT_DAY_TIME not in done.field_times


def test_a_credit_status_short_of_credited_dates_no_credit() -> None:
    start, _ = observe(None, fact(T0, status=OrderStatus.PROCESSING))
    for credit in (CreditStatus.PENDING, CreditStatus.BLOCKED):
        held, _ = observe(start, fact(T0 + 10, credit_status=credit, provider_time=PROVIDER_T))
        assert held.credit_status is credit
        assert CREDIT_DAY_TIME not in held.field_times, credit


def test_an_order_read_as_success_dates_its_credit_by_the_providers_time() -> None:
    """A history record says SUCCESS without a creditStatus: the deposit reads CREDITED, dated
    by the record's own time."""
    start, _ = observe(None, fact(T0, status=OrderStatus.PROCESSING))
    done, _ = observe(start, fact(T0 + 10, status=OrderStatus.SUCCESS, provider_time=PROVIDER_T))
    assert done.credit_status is CreditStatus.CREDITED
    assert done.field_times[CREDIT_DAY_TIME] == PROVIDER_T
    undated, _ = observe(start, fact(T0 + 10, status=OrderStatus.SUCCESS))
    assert undated.credit_status is CreditStatus.CREDITED
    assert CREDIT_DAY_TIME not in undated.field_times


def test_a_replayed_poll_fact_takes_its_rows_time_unless_it_states_one() -> None:
    text = fact(T0, white_list_status=WhiteListStatus.INIT).to_json()
    without_time = {k: v for k, v in text.items() if k != "observed_at"}
    assert Fact.from_json(without_time, observed_at=T0 + 5).observed_at == T0 + 5
    # A fact whose text holds its time keeps it, whatever the row says.
    assert Fact.from_json(text, observed_at=T0 + 5).observed_at == T0
    assert Fact.from_json(text).observed_at == T0


def test_a_deposit_changed_only_in_its_times_is_the_same() -> None:
    deposit, _ = observe(None, fact(T0, status=OrderStatus.PROCESSING, amount=Decimal("5")))
    later = replace(
        deposit, field_times={**deposit.field_times, "status": T0 + 99}, updated_at=T0 + 99
    )
    assert deposit.same_but_times(later) and later.same_but_times(deposit)
    assert deposit.same_but_times(deposit)
    assert not deposit.same_but_times(replace(deposit, amount=Decimal("6")))
    assert not deposit.same_but_times(replace(deposit, status=OrderStatus.SUCCESS))
