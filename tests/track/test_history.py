"""What each fact of a deposit changed, as `deposits TX` and the console's timeline say it."""

from __future__ import annotations

from decimal import Decimal

from worker.provider.models import CreditStatus, OrderStatus, WhiteListStatus
from worker.track.history import FactChange, fact_changes
from worker.track.tracker import Fact

TX = "T-history-1"


def fact(source: str, at: int, **fields: object) -> dict[str, object]:
    return Fact(transaction_id=TX, source=source, observed_at=at, **fields).to_json()  # type: ignore[arg-type]


def test_a_poll_that_fills_in_a_field_does_not_move_the_deposit() -> None:
    """The webhook makes the deposit known (needs_details); a poll that only adds toAddress
    changed that field and moved nothing; the same poll again changed nothing; the credit
    moved it, naming the fields that did."""
    required = fact(
        "webhook", 1, status=OrderStatus.PROCESSING, white_list_status=WhiteListStatus.INIT,
        credit_status=CreditStatus.PENDING, wallet_id=1002, currency="USDT", network="TRON",
        amount=Decimal("10.50"), from_address="TFrom", tx_hash="hash1",
    )  # fmt: skip
    poll = fact(
        "poll", 2, status=OrderStatus.PROCESSING, white_list_status=WhiteListStatus.INIT,
        to_address="TTo",
    )  # fmt: skip
    credited = fact(
        "webhook", 3, status=OrderStatus.PROCESSING, white_list_status=WhiteListStatus.APPROVED,
        credit_status=CreditStatus.CREDITED,
    )  # fmt: skip
    changes = fact_changes([required, poll, poll, credited], [True, True, False, True])
    assert changes is not None
    first, filled, again, moved = changes
    assert first.moved == (None, "needs_details") and "amount" in first.fields
    assert first.describe() == "first seen: needs_details"
    assert filled == FactChange(("toAddress",), None)
    assert filled.describe() == "changed toAddress"
    assert again.describe() == "known already"
    assert moved.moved == ("needs_details", "credited")
    assert moved.describe() == "moved needs_details -> credited (whiteListStatus, creditStatus)"


def test_a_fact_recorded_as_changing_nothing_shows_no_change() -> None:
    """A fact the tracker recorded as changing nothing (`changed` false) shows none, whatever a
    replay would make of it."""
    required = fact("webhook", 1, white_list_status=WhiteListStatus.INIT)
    later = fact("poll", 2, to_address="TTo")
    changes = fact_changes([required, later], [True, False])
    assert changes is not None and changes[1].describe() == "known already"
