"""Reconciliation's matching of one day (worker.reconcile.matching): report records against the
ledger rows of the day, each ending matched once or as a finding with the ids, amounts, currency,
network and detail that `reconcile --json` and the finding alerts show (docs/reconciliation.md).

The comparison is fed report records as the client reads them from the provider's answer and
ledger rows as the store gives them; nothing else takes part."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from worker.provider.resources import SettlementRecord
from worker.reconcile.matching import Booked, DayMatch, hash_key
from worker.store.findings import Finding

DAY = "2026-03-04"
HASH = "0x" + "ab" * 32


def rec(number: int, **changes: Any) -> SettlementRecord:
    """Report record `number`: 1.25 USDT on TRON of deposit TX<number>, txHash HASH, MATCHED."""
    base: dict[str, Any] = {
        "settlement_record_id": f"SR{number}",
        "settlement_date": DAY,
        "record_type": "IN",
        "platform_order_id": f"TX{number}",
        "asset": "USDT",
        "network": "TRON",
        "amount": "1.25",
        "tx_hash": HASH,
        "reconciliation_status": "MATCHED",
    }
    base.update(changes)
    return SettlementRecord.model_validate(base)


def booked(number: int, **changes: Any) -> Booked:
    """The ledger row of TX<number> as the report record `rec(number)` lists it."""
    base: dict[str, Any] = {
        "transaction_id": f"TX{number}",
        "amount": Decimal("1.25"),
        "currency": "USDT",
        "network": "TRON",
        "tx_hash": HASH,
        "credit_day": DAY,
    }
    base.update(changes)
    return Booked(**base)


def run(
    ledger: list[Booked],
    records: list[SettlementRecord],
    *,
    elsewhere: dict[str, Booked] | None = None,
    summary: tuple[int, int] = (0, 0),
) -> list[Finding]:
    """One day's comparison as a run makes it; `elsewhere` holds the ledger rows of other days
    (by transactionId, and by txHash for records without an id)."""
    other = elsewhere or {}
    cmp = DayMatch(DAY, ledger)

    def place() -> None:
        for r in cmp.elsewhere:
            key = r.platform_order_id or hash_key(r.tx_hash) or ""
            cmp.placed(r, other.get(key))
        cmp.elsewhere.clear()

    for r in records:
        cmp.record(r)
    place()
    cmp.by_tx_hash()
    place()
    cmp.summary(*summary)
    cmp.leftovers()
    return cmp.found


def common(number: int, **changes: Any) -> dict[str, Any]:
    """The fields every finding about `rec(number)` carries."""
    base: dict[str, Any] = {
        "day": DAY,
        "subject": f"TX{number}",
        "transaction_id": f"TX{number}",
        "tx_hash": HASH,
        "report_amount": "1.25",
        "currency": "USDT",
        "network": "TRON",
    }
    base.update(changes)
    return base


def test_records_matching_their_ledger_rows_find_nothing() -> None:
    """Same ids, amounts written at another scale, asset, network and txHash in another case or
    padded: a clean day."""
    ledger = [booked(1), booked(2, amount=Decimal("7.5"), tx_hash="0x" + "cd" * 32)]
    records = [
        rec(1, amount="1.250", asset=" usdt", network="tron ", tx_hash=HASH.upper()),
        rec(2, amount="7.50", tx_hash=" 0x" + "CD" * 32 + " ", reconciliation_status="matched"),
    ]
    assert run(ledger, records) == []


def test_a_ledger_row_no_record_lists_is_missing_in_report() -> None:
    """The books hold a deposit of the day the report does not list."""
    ledger = [booked(1), booked(2, amount=Decimal("3"), currency="USDC", network="ETH")]
    assert run(ledger, [rec(1)]) == [
        Finding(
            day=DAY,
            kind="missing_in_report",
            subject="TX2",
            transaction_id="TX2",
            tx_hash=HASH,
            ledger_amount="3",
            currency="USDC",
            network="ETH",
        )
    ]


def test_a_record_never_booked_is_missing_in_ledger() -> None:
    """Money the report lists that the books never booked, with and without the provider's id."""
    no_id = rec(3, platform_order_id=None, tx_hash="0xfeed", amount="42.000001")
    assert run([booked(1)], [rec(1), rec(2), no_id]) == [
        Finding(kind="missing_in_ledger", **common(2)),
        Finding(
            kind="missing_in_ledger",
            **common(
                3,
                subject="record:SR3",
                transaction_id=None,
                tx_hash="0xfeed",
                report_amount="42.000001",
            ),
        ),
    ]


def test_amount_asset_network_and_tx_hash_differences_are_each_a_finding() -> None:
    """A record matched by id is compared field by field; each difference is one finding with
    the ledger's and the report's amounts."""
    ledger = [
        booked(1),
        booked(2),
        booked(3),
        booked(4),
        booked(5, tx_hash=None),
    ]
    records = [
        rec(1, amount="1.2500001"),
        rec(2, network="ETH"),
        rec(3, asset="USDC"),
        rec(4, tx_hash="0xother"),
        rec(5, tx_hash=None),
    ]
    assert run(ledger, records) == [
        Finding(
            kind="amount_differs", ledger_amount="1.25", **common(1, report_amount="1.2500001")
        ),
        Finding(
            kind="asset_differs",
            ledger_amount="1.25",
            detail="the ledger books USDT on TRON, the report lists USDT on ETH",
            **common(2, network="ETH"),
        ),
        Finding(
            kind="asset_differs",
            ledger_amount="1.25",
            detail="the ledger books USDT on TRON, the report lists USDC on TRON",
            **common(3, currency="USDC"),
        ),
        Finding(
            kind="tx_hash_differs",
            ledger_amount="1.25",
            detail=f"the ledger books txHash {HASH}, the report lists 0xother",
            **common(4, tx_hash="0xother"),
        ),
    ]


def test_a_ledger_row_without_tx_hash_is_no_match_for_a_record_without_one() -> None:
    """Neither side names a txHash: a record without an id does not take that row (a blank
    txHash is no txHash), so both show."""
    ledger = [booked(1, tx_hash="  ")]
    record = rec(2, platform_order_id="", tx_hash="")
    assert [(f.kind, f.subject) for f in run(ledger, [record])] == [
        ("missing_in_ledger", "record:SR2"),
        ("missing_in_report", "TX1"),
    ]


def test_records_without_an_id_match_by_tx_hash_the_row_agreeing_most() -> None:
    """Three ledger rows of one txHash (a batch transfer); records without an id each take the
    unmatched row agreeing most in amount, asset and network, whatever the rows' order, and
    a fourth record finds every row taken: `duplicate_in_report` naming the row."""
    ledger = [
        booked(1, amount=Decimal("500")),
        booked(2, amount=Decimal("250"), network="ETH"),
        booked(3, amount=Decimal("250")),
    ]
    records = [
        rec(11, platform_order_id=None, amount="250", tx_hash=HASH.upper()),
        rec(12, platform_order_id=None, amount="250", network="ETH"),
        rec(13, platform_order_id=None, amount="500"),
        rec(14, platform_order_id=None, amount="500"),
    ]
    assert run(ledger, records) == [
        Finding(
            kind="duplicate_in_report",
            detail="the ledger row of TX1 is matched by another record of the report",
            **common(14, subject="record:SR14", transaction_id=None, report_amount="500"),
        )
    ]


def test_a_record_without_an_id_takes_the_row_agreeing_most_and_compares_it() -> None:
    """Two unmatched rows of its txHash: the one with the same amount and network is matched;
    the other is missing in the report. The match agreeing in all but the asset is an
    `asset_differs` of that row."""
    ledger = [
        booked(1, amount=Decimal("9"), network="ETH"),
        booked(2, amount=Decimal("250"), currency="USDC"),
    ]
    record = rec(5, platform_order_id=None, amount="250")
    found = run(ledger, [record])
    assert [(f.kind, f.transaction_id) for f in found] == [
        ("asset_differs", "TX2"),
        ("missing_in_report", "TX1"),
    ]


def test_a_record_without_an_id_never_takes_a_row_a_record_with_the_id_matches() -> None:
    """Whatever the report's order, the record with the id matches its row; the record without
    an id of the same txHash is then a duplicate, not a theft of the row."""
    no_id = rec(7, platform_order_id=None)
    assert [(f.kind, f.subject) for f in run([booked(1)], [no_id, rec(1)])] == [
        ("duplicate_in_report", "record:SR7")
    ]


def test_the_same_id_listed_twice_is_duplicate_in_report() -> None:
    """The second record of one id is a duplicate (its own record id as subject)."""
    assert run([booked(1)], [rec(1), rec(1, settlement_record_id="SR9")]) == [
        Finding(
            kind="duplicate_in_report",
            detail="the ledger row of TX1 is matched by another record of the report",
            **common(1, subject="record:SR9"),
        )
    ]


def test_a_record_booked_on_another_day_is_compared_there() -> None:
    """A record whose deposit the ledger books on another day: `settled_on_other_day` naming
    that day, and compared like any match (an amount difference is found); not
    `missing_in_ledger`. A second record of that deposit is a duplicate."""
    other = booked(2, amount=Decimal("1.2"), credit_day="2026-03-03")
    records = [rec(2), rec(2, settlement_record_id="SR8")]
    assert run([], records, elsewhere={"TX2": other}) == [
        Finding(
            kind="settled_on_other_day",
            ledger_amount="1.2",
            detail="the ledger books TX2 on 2026-03-03",
            **common(2),
        ),
        Finding(kind="amount_differs", ledger_amount="1.2", **common(2)),
        Finding(
            kind="duplicate_in_report",
            detail="the ledger row of TX2 is matched by another record of the report",
            **common(2, subject="record:SR8"),
        ),
    ]


def test_a_record_without_an_id_booked_on_another_day_is_found_by_tx_hash() -> None:
    """No id, a txHash the day's ledger does not hold but another day's does: compared there
    under that row's transactionId."""
    other = booked(4, tx_hash="0xbeef", credit_day="2026-03-05")
    record = rec(6, platform_order_id=None, tx_hash="0xBEEF", asset="USDC")
    found = run([], [record], elsewhere={"0xbeef": other})
    assert [(f.kind, f.subject, f.transaction_id) for f in found] == [
        ("settled_on_other_day", "record:SR6", "TX4"),
        ("asset_differs", "record:SR6", "TX4"),
    ]


def test_a_record_the_provider_does_not_call_matched_is_a_provider_finding() -> None:
    """reconciliation_status other than MATCHED: MANUAL_REVIEW (any case) is `provider_review`,
    anything else `provider_mismatch`; a record without a status is not a finding. The record
    is still matched (no `missing_in_report`)."""
    ledger = [booked(1), booked(2), booked(3)]
    records = [
        rec(1, reconciliation_status="manual_review"),
        rec(2, reconciliation_status="MISMATCHED"),
        rec(3, reconciliation_status=None),
    ]
    assert run(ledger, records, summary=(1, 1)) == [
        Finding(kind="provider_review", detail="reconciliation_status MANUAL_REVIEW", **common(1)),
        Finding(kind="provider_mismatch", detail="reconciliation_status MISMATCHED", **common(2)),
    ]


def test_the_report_summary_counts_alone_are_findings() -> None:
    """A report whose summary counts one record mismatched and one in review while no record
    says so: one finding each; counts of zero are none."""
    assert run([booked(1)], [rec(1)], summary=(1, 1)) == [
        Finding(
            day=DAY,
            kind="provider_mismatch",
            subject="summary",
            detail="the report's summary counts 1 record(s) mismatch",
        ),
        Finding(
            day=DAY,
            kind="provider_review",
            subject="summary",
            detail="the report's summary counts 1 record(s) review",
        ),
    ]
    assert run([booked(1)], [rec(1)], summary=(0, 0)) == []


def test_a_summary_count_with_a_record_saying_so_is_one_finding() -> None:
    """The summary's mismatched count stands for the record already found: no second finding
    of that kind; the review count still is one."""
    record = rec(1, reconciliation_status="MISMATCHED")
    found = run([booked(1)], [record], summary=(1, 2))
    assert [(f.kind, f.subject) for f in found] == [
        ("provider_mismatch", "TX1"),
        ("provider_review", "summary"),
    ]


def test_a_tx_hash_is_compared_case_blind_and_blank_is_none() -> None:
    """What the day's comparison and the ledger lookup by txHash use as the hash."""
    assert hash_key(" 0xABc ") == "0xabc"
    assert hash_key("  ") is None
    assert hash_key(None) is None


def test_the_day_and_report_order_of_findings() -> None:
    """Findings carry the day compared; a record's status finding comes before its
    comparison's."""
    cmp = DayMatch("2026-01-02", [booked(1)])
    cmp.record(rec(1, amount="2", reconciliation_status="MISMATCHED"))
    assert [(f.day, f.kind) for f in cmp.found] == [
        ("2026-01-02", "provider_mismatch"),
        ("2026-01-02", "amount_differs"),
    ]


def test_a_record_without_an_id_takes_the_row_of_its_asset_when_no_amount_agrees() -> None:
    """Two unmatched rows of its txHash, neither of its amount nor network: the one of its
    asset is the match (its differences found), the other is missing in the report."""
    ledger = [
        booked(1, amount=Decimal("9"), currency="USDC", network="ETH"),
        booked(2, amount=Decimal("8"), network="ETH"),
    ]
    record = rec(5, platform_order_id=None, amount="250")
    found = run(ledger, [record])
    assert [(f.kind, f.transaction_id) for f in found] == [
        ("amount_differs", "TX2"),
        ("asset_differs", "TX2"),
        ("missing_in_report", "TX1"),
    ]


def test_an_asset_and_network_unknown_on_both_sides_agree() -> None:
    """A ledger row without currency or network against a record without asset or network (or
    with blank ones): no `asset_differs`."""
    ledger = [booked(1, currency=None, network=None), booked(2, currency=None, network="")]
    records = [rec(1, asset=None, network=None), rec(2, asset="", network=None)]
    assert run(ledger, records) == []
