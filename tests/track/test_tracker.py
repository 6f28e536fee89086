"""The pure deposit tracker: readings of events and polls, triggers, ordering, persistence."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.facts import (
    T0,
    TX,
    credited,
    event,
    failed,
    notification,
    order_data,
    poll,
    required,
    run,
    submitted,
)
from worker.clock import iso_from_ms, ms_from_iso
from worker.provider import jsonio
from worker.provider.models import (
    CreditStatus,
    DepositOrder,
    OrderStatus,
    WebhookEnvelope,
    WhiteListStatus,
)
from worker.track.facts import fact_from_event, fact_from_order
from worker.track.tracker import (
    UNKNOWN,
    Deposit,
    Fact,
    State,
    Transition,
    Trigger,
    derive_state,
    observe,
)


def keys(transitions: Sequence[Transition]) -> list[str]:
    """The emitted keys, in order."""
    return [t.key for t in transitions]


# --- readings of events and polls --------------------------------------------------------------


def test_required_reads_init_and_credit_pending() -> None:
    """DEPOSIT_WHITELIST_REQUIRED means whiteListStatus init and creditStatus PENDING."""
    fact = required(T0)
    assert fact.white_list_status is WhiteListStatus.INIT
    assert fact.credit_status is CreditStatus.PENDING
    assert fact.status is OrderStatus.PROCESSING
    assert (fact.source, fact.event_id, fact.observed_at) == (
        "webhook",
        f"ev-{fact.event_type}-{T0}",
        T0,
    )
    assert fact.amount == Decimal("1234.5678") and fact.wallet_id == 1001


def test_failed_reads_rejected_with_message() -> None:
    """DEPOSIT_WHITELIST_FAILED means rejected and carries failMessage, even if data says less."""
    env = WebhookEnvelope(
        eventId="e1",
        eventType="DEPOSIT_WHITELIST_FAILED",
        timestamp=T0,
        data=order_data(whiteListStatus="pending", failMessage="bad name"),
    )
    fact = fact_from_event(env)
    assert fact is not None
    assert fact.white_list_status is WhiteListStatus.REJECTED
    assert fact.fail_message == "bad name"
    assert fact.credit_status is UNKNOWN


def test_credited_event_reads_approved_and_credited() -> None:
    """DEPOSIT_WHITELIST_CREDITED means approved and creditStatus CREDITED."""
    fact = credited(T0)
    assert fact.white_list_status is WhiteListStatus.APPROVED
    assert fact.credit_status is CreditStatus.CREDITED
    assert fact.status is OrderStatus.PROCESSING


@pytest.mark.parametrize(
    ("status", "white", "want_white", "want_credit"),
    [
        ("SUCCESS", "approved", WhiteListStatus.APPROVED, CreditStatus.CREDITED),
        ("SUCCESS", None, None, CreditStatus.CREDITED),
        ("FAIL", None, None, UNKNOWN),
        ("PROCESSING", "init", WhiteListStatus.INIT, UNKNOWN),
        ("PROCESSING", "rejected", WhiteListStatus.REJECTED, UNKNOWN),
    ],
)
def test_notification_reading(
    status: str, white: str | None, want_white: object, want_credit: object
) -> None:
    """DEPOSIT_ORDER_NOTIFICATION: SUCCESS means CREDITED; whiteListStatus is what data says."""
    fact = notification(T0, status, white)
    assert fact.status is OrderStatus(status)
    assert fact.white_list_status is want_white
    assert fact.credit_status is want_credit


def test_notification_without_whitelist_key_says_nothing_about_it() -> None:
    """A notification whose data lacks whiteListStatus leaves that field UNKNOWN, not null."""
    data = order_data(status="SUCCESS")
    del data["whiteListStatus"]
    fact = fact_from_event(
        WebhookEnvelope(
            eventId="e", eventType="DEPOSIT_ORDER_NOTIFICATION", data=data, timestamp=T0
        )
    )
    assert fact is not None and fact.white_list_status is UNKNOWN


@pytest.mark.parametrize(
    "kind", ["WALLET_ADDRESS_UPDATED", "Collect Order Updated", "STABLE_ORDER_UPDATED", "NEW_THING"]
)
def test_non_deposit_events_give_no_fact(kind: str) -> None:
    """Events that are not about deposits yield no fact."""
    env = WebhookEnvelope(eventId="e", eventType=kind, timestamp=T0, data={"id": "a1"})
    assert fact_from_event(env) is None


def test_event_falls_back_to_reference_id_and_data_timestamp() -> None:
    """Without data.transactionId the referenceId names the deposit; data.timestamp dates it."""
    data = order_data(timestamp=T0 + 5)
    del data["transactionId"]
    env = WebhookEnvelope(
        eventId="e", eventType="DEPOSIT_WHITELIST_REQUIRED", referenceId="tx-ref", data=data
    )
    fact = fact_from_event(env)
    assert fact is not None
    assert (fact.transaction_id, fact.observed_at) == ("tx-ref", T0 + 5)
    dated = fact_from_event(env.model_copy(update={"timestamp": T0 + 9}))
    assert dated is not None and dated.observed_at == T0 + 9


def test_event_without_any_time_uses_received_at() -> None:
    """A deposit event with no timestamp at all is dated by the given receive time."""
    env = WebhookEnvelope(eventId="e", eventType="DEPOSIT_WHITELIST_REQUIRED", data=order_data())
    fact = fact_from_event(env, received_at=T0 + 77)
    assert fact is not None and fact.observed_at == T0 + 77


def test_malformed_deposit_event_raises() -> None:
    """A deposit event whose data cannot be read raises (the processor marks it failed)."""
    env = WebhookEnvelope(eventId="e", eventType="DEPOSIT_WHITELIST_REQUIRED", data={"x": 1})
    with pytest.raises(ValueError):
        fact_from_event(env)


def test_detail_poll_says_what_it_says() -> None:
    """A transaction detail carries creditStatus; observed time is its updateTime."""
    fact = poll(T0 + 3, "PROCESSING", "pending", "BLOCKED")
    assert fact.source == "poll" and fact.observed_at == T0 + 3
    assert fact.credit_status is CreditStatus.BLOCKED
    assert fact.white_list_status is WhiteListStatus.PENDING
    assert fact.to_address == "TWalletReceiving111111111111111111"


def test_history_record_without_credit_status_says_nothing_about_it() -> None:
    """A history record without creditStatus leaves it UNKNOWN; it is dated when its request
    was sent."""
    order = DepositOrder.model_validate(order_data(whiteListStatus="rejected", failMessage="m"))
    fact = fact_from_order(order, sent_at=T0 + 42)
    assert fact.credit_status is UNKNOWN
    assert fact.white_list_status is WhiteListStatus.REJECTED
    assert (fact.observed_at, fact.fail_message) == (T0 + 42, "m")
    no_key = order_data()
    del no_key["whiteListStatus"]
    assert (
        fact_from_order(DepositOrder.model_validate(no_key), sent_at=T0).white_list_status
        is UNKNOWN
    )


def test_fact_json_omits_unknown_and_round_trips() -> None:
    """Fact.to_json leaves out UNKNOWN, keeps a null whiteListStatus, and from_json inverts it."""
    fact = notification(T0, "SUCCESS", None)
    data = fact.to_json()
    assert data["white_list_status"] is None and data["status"] == "SUCCESS"
    assert data["amount"] == "1234.5678"
    assert data["credit_status"] == "CREDITED"
    assert required(T0).to_json()["credit_status"] == "PENDING"
    assert "credit_status" not in failed(T0).to_json()
    assert "status" not in submitted(T0).to_json()
    assert jsonio.loads(jsonio.dumps(data)) == data
    assert Fact.from_json(data) == fact
    assert Fact.from_json(submitted(T0).to_json()) == submitted(T0)


def test_fact_rejects_unknown_source() -> None:
    """A fact's source is webhook, poll or submit."""
    with pytest.raises(ValueError):
        Fact(TX, "guess", T0)


# --- triggers --------------------------------------------------------------------------------


def test_whitelist_happy_path_emits_each_trigger_once() -> None:
    """init -> pending -> CREDITED -> SUCCESS emits each trigger once, redeliveries nothing."""
    facts = [
        required(T0),
        submitted(T0 + 10),
        credited(T0 + 20),
        notification(T0 + 30, "SUCCESS", "approved"),
    ]
    deposit: Deposit | None = None
    seen: list[tuple[str, State]] = []
    for fact in facts:
        deposit, transitions = observe(deposit, fact)
        seen.extend((t.key, deposit.state) for t in transitions)
        again, repeat = observe(deposit, fact)
        assert repeat == [] and again is deposit
    assert seen == [
        ("needs_details", State.NEEDS_DETAILS),
        ("submitted", State.SUBMITTED),
        ("credited", State.CREDITED),
        ("completed", State.COMPLETED),
    ]
    assert deposit is not None
    assert deposit.emitted == {"needs_details", "submitted", "credited", "completed"}
    assert (deposit.white_list_status, deposit.credit_status) == (
        WhiteListStatus.APPROVED,
        CreditStatus.CREDITED,
    )
    assert deposit.whitelisted is True and deposit.first_source == "webhook"
    assert (deposit.created_at, deposit.updated_at) == (T0, T0 + 30)


def test_credited_event_with_success_emits_credited_then_completed() -> None:
    """CREDITED with order SUCCESS (no auto-collection) emits credited then completed."""
    _, transitions = run([required(T0), submitted(T0 + 1), credited(T0 + 2, status="SUCCESS")])
    assert keys(transitions) == ["needs_details", "submitted", "credited", "completed"]


def test_ordinary_deposit_emits_credited_and_completed() -> None:
    """An ACTIVE-address deposit (PROCESSING null -> SUCCESS null) emits credited then completed."""
    first, early = observe(None, notification(T0, "PROCESSING", None))
    assert early == [] and first.state is State.PROCESSING and first.whitelisted is False
    final, transitions = observe(first, notification(T0 + 5, "SUCCESS", None))
    assert keys(transitions) == ["credited", "completed"]
    assert final.credit_status is CreditStatus.CREDITED and final.white_list_status is None
    assert final.state is State.COMPLETED


def test_history_success_without_credit_status_means_credited() -> None:
    """A SUCCESS record without creditStatus still reads CREDITED (Combined reading, last row)."""
    deposit, transitions = observe(None, poll(T0, "SUCCESS", None))
    assert keys(transitions) == ["credited", "completed"]
    assert deposit.credit_status is CreditStatus.CREDITED and deposit.whitelisted is False


def test_same_millisecond_rejection_beats_submission() -> None:
    """A rejection and a submission seen at the same millisecond read rejected, in either order."""
    for pair in ([submitted(T0 + 5), failed(T0 + 5)], [failed(T0 + 5), submitted(T0 + 5)]):
        deposit, _ = run([required(T0), *pair])
        assert deposit.white_list_status is WhiteListStatus.REJECTED


def test_stored_emitted_key_is_never_emitted_again() -> None:
    """A key already in the stored emitted set is not emitted again, whatever the fields say."""
    deposit, _ = observe(None, required(T0))
    row = deposit.to_row() | {"emitted": '["credited", "needs_details"]'}
    again, transitions = observe(Deposit.from_row(row), credited(T0 + 1))
    assert transitions == [] and again.state is State.CREDITED


def test_blocked_from_detail_poll_after_pending() -> None:
    """creditStatus BLOCKED from a detail poll after submission emits blocked once."""
    deposit, _ = run([required(T0), submitted(T0 + 1)])
    deposit, transitions = observe(deposit, poll(T0 + 9, "PROCESSING", "pending", "BLOCKED"))
    assert transitions == [Transition(Trigger.BLOCKED, "blocked")]
    assert deposit.state is State.BLOCKED
    deposit, later = run([poll(T0 + 20, "PROCESSING", "pending", "BLOCKED")], deposit)
    assert later == []
    assert deposit.credit_status is CreditStatus.BLOCKED and deposit.state is State.BLOCKED


def test_order_fail_emits_failed() -> None:
    """Order status FAIL emits failed and wins the state over everything else."""
    deposit, transitions = run([required(T0), notification(T0 + 5, "FAIL", "init")])
    assert keys(transitions) == ["needs_details", "failed"]
    assert deposit.state is State.FAILED
    deposit, late = observe(deposit, notification(T0 + 9, "SUCCESS", "approved"))
    assert deposit.status is OrderStatus.FAIL and keys(late) == ["credited"]


def test_first_seen_approved_skips_needs_details() -> None:
    """A deposit first found already approved and SUCCESS emits credited and completed only."""
    deposit, transitions = observe(None, poll(T0, "SUCCESS", "approved", "CREDITED"))
    assert keys(transitions) == ["credited", "completed"]
    assert deposit.first_source == "poll"


def test_rejection_round_emits_rejected_twice_with_distinct_keys() -> None:
    """Reject, resubmit, reject emits 'rejected' then 'rejected#2', each with its message."""
    facts = [
        required(T0),
        submitted(T0 + 10),
        failed(T0 + 20, "name mismatch"),
        submitted(T0 + 30),
        failed(T0 + 40, "address mismatch"),
        failed(T0 + 40, "address mismatch"),
        submitted(T0 + 50),
    ]
    deposit, transitions = run(facts)
    assert keys(transitions) == [
        "needs_details",
        "submitted",
        "rejected",
        "submitted#2",
        "rejected#2",
        "submitted#3",
    ]
    rejections = [t for t in transitions if t.trigger is Trigger.REJECTED]
    assert [t.fail_message for t in rejections] == ["name mismatch", "address mismatch"]
    assert deposit.state is State.SUBMITTED and deposit.fail_message == "address mismatch"


# --- out of order ------------------------------------------------------------------------------


def test_credited_before_required_changes_nothing_backwards() -> None:
    """CREDITED arriving before REQUIRED: the late REQUIRED is recorded but changes nothing."""
    deposit, transitions = observe(None, credited(T0 + 20))
    assert keys(transitions) == ["credited"]
    again, late = observe(deposit, required(T0))
    assert late == [] and again is deposit
    assert again.white_list_status is WhiteListStatus.APPROVED and again.state is State.CREDITED


def test_failed_redelivered_after_resubmission_changes_nothing() -> None:
    """A FAILED redelivered after our resubmission neither reverts to rejected nor re-emits."""
    deposit, _ = run([required(T0), submitted(T0 + 10), failed(T0 + 20), submitted(T0 + 30)])
    assert deposit.state is State.SUBMITTED
    again, late = observe(deposit, failed(T0 + 20))
    assert late == [] and again is deposit
    stale_poll, late_poll = observe(
        deposit, poll(T0 + 20, "PROCESSING", "rejected", failMessage="x")
    )
    assert late_poll == [] and stale_poll.white_list_status is WhiteListStatus.PENDING


def test_old_required_after_failed_changes_nothing() -> None:
    """An old REQUIRED (or init history record) after FAILED changes nothing."""
    deposit, transitions = run([failed(T0 + 20)])
    assert keys(transitions) == ["rejected"] and deposit.state is State.REJECTED
    for late_fact in (required(T0), poll(T0, "PROCESSING", "init")):
        again, late = observe(deposit, late_fact)
        assert (
            late == []
            and again.state is State.REJECTED
            and again.white_list_status is WhiteListStatus.REJECTED
        )


def test_terminal_statuses_first_wins() -> None:
    """SUCCESS/FAIL are terminal (the first one seen stays); CREDITED is never left for BLOCKED."""
    deposit, _ = run([notification(T0, "SUCCESS", None), notification(T0 + 1, "FAIL", None)])
    assert deposit.status is OrderStatus.SUCCESS
    deposit, _ = run([credited(T0 + 5), poll(T0 + 9, "PROCESSING", "pending", "BLOCKED")])
    assert deposit.credit_status is CreditStatus.CREDITED
    deposit, _ = run(
        [notification(T0 + 5, "SUCCESS", "approved"), notification(T0 + 1, "PROCESSING", "init")]
    )
    assert (
        deposit.status is OrderStatus.SUCCESS
        and deposit.white_list_status is WhiteListStatus.APPROVED
    )


def test_null_white_list_never_overrides_known_status() -> None:
    """A null whiteListStatus marks an ordinary deposit but never overrides a known status."""
    deposit, _ = run([required(T0), notification(T0 + 5, "PROCESSING", None)])
    assert deposit.white_list_status is WhiteListStatus.INIT and deposit.whitelisted is True
    deposit, _ = run([notification(T0 + 5, "PROCESSING", None), required(T0)])
    assert deposit.white_list_status is WhiteListStatus.INIT and deposit.whitelisted is True


def test_success_behind_whitelist_implies_approved() -> None:
    """A whitelisted deposit at SUCCESS reads approved even when the notification data lags."""
    deposit, transitions = run(
        [required(T0), submitted(T0 + 1), notification(T0 + 9, "SUCCESS", "pending")]
    )
    assert deposit.white_list_status is WhiteListStatus.APPROVED
    assert keys(transitions)[-2:] == ["credited", "completed"]


def test_attributes_come_from_first_carrier_and_survive_none() -> None:
    """Attributes fill from the first fact carrying them; facts without them change nothing."""
    deposit, _ = run([submitted(T0), required(T0 + 1)])
    assert deposit.first_source == "submit" and deposit.amount == Decimal("1234.5678")
    later = event(
        "DEPOSIT_WHITELIST_FAILED", T0 + 5, amount="9", failMessage="m", whiteListStatus="rejected"
    )
    deposit, _ = observe(deposit, later)
    assert deposit.amount == Decimal("1234.5678") and deposit.currency == "USDT"


def test_fact_for_another_deposit_is_refused() -> None:
    """Folding a fact about another transaction into a deposit is a bug and raises."""
    deposit, _ = observe(None, required(T0))
    with pytest.raises(ValueError):
        observe(deposit, Fact("other", "poll", T0))


@pytest.mark.parametrize(
    ("status", "white", "credit", "want"),
    [
        (OrderStatus.FAIL, WhiteListStatus.APPROVED, CreditStatus.BLOCKED, State.FAILED),
        (OrderStatus.SUCCESS, WhiteListStatus.APPROVED, CreditStatus.BLOCKED, State.BLOCKED),
        (OrderStatus.SUCCESS, WhiteListStatus.APPROVED, CreditStatus.CREDITED, State.COMPLETED),
        (OrderStatus.PROCESSING, WhiteListStatus.APPROVED, CreditStatus.CREDITED, State.CREDITED),
        (OrderStatus.PROCESSING, WhiteListStatus.REJECTED, CreditStatus.PENDING, State.REJECTED),
        (OrderStatus.PROCESSING, WhiteListStatus.PENDING, CreditStatus.PENDING, State.SUBMITTED),
        (OrderStatus.PROCESSING, WhiteListStatus.INIT, CreditStatus.PENDING, State.NEEDS_DETAILS),
        (OrderStatus.PROCESSING, None, None, State.PROCESSING),
        (None, WhiteListStatus.APPROVED, None, State.PROCESSING),
    ],
)
def test_derive_state_priority(
    status: OrderStatus | None,
    white: WhiteListStatus | None,
    credit: CreditStatus | None,
    want: State,
) -> None:
    """State derivation follows the priority failed, blocked, completed, credited, whitelist."""
    assert derive_state(status, white, credit) is want


# --- persistence and exact amounts ------------------------------------------------------------

DEPOSITS_DDL = """CREATE TABLE deposits (transaction_id TEXT PRIMARY KEY, wallet_id INTEGER,
 wallet_name TEXT, currency TEXT, network TEXT, amount TEXT, from_address TEXT, to_address TEXT,
 tx_hash TEXT, status TEXT, white_list_status TEXT, credit_status TEXT, fail_message TEXT,
 state TEXT, emitted TEXT, whitelisted INTEGER, fact_time INTEGER, source TEXT,
 created_at TEXT, updated_at TEXT)"""


def through_sqlite(path: Path, deposit: Deposit) -> Deposit:
    """Write the deposit's row to a real SQLite file and read it back."""
    row = deposit.to_row()
    with sqlite3.connect(path) as conn:
        conn.execute(DEPOSITS_DDL)
        cols = ", ".join(row)
        conn.execute(
            f"INSERT INTO deposits ({cols}) VALUES ({', '.join('?' * len(row))})",
            list(row.values()),
        )
        conn.row_factory = sqlite3.Row
        stored = conn.execute("SELECT * FROM deposits").fetchone()
    conn.close()
    return Deposit.from_row(stored)


def test_row_round_trip_through_sqlite(tmp_path: Path) -> None:
    """to_row -> SQLite -> from_row gives back an equal deposit."""
    deposit, _ = run(
        [required(T0 + 1), submitted(T0 + 10), failed(T0 + 20, "m"), submitted(T0 + 31)]
    )
    back = through_sqlite(tmp_path / "d.db", deposit)
    assert back == deposit
    assert back.emitted == {"needs_details", "submitted", "rejected", "submitted#2"}
    row = deposit.to_row()
    assert row["created_at"] == iso_from_ms(T0 + 1) and row["created_at"].endswith("Z")
    assert row["whitelisted"] == 1 and jsonio.loads(row["emitted"]) == sorted(deposit.emitted)
    assert jsonio.loads(row["fact_time"])["white_list_status"] == T0 + 31
    ordinary, _ = run([notification(T0, "PROCESSING", None)])
    assert through_sqlite(tmp_path / "o.db", ordinary) == ordinary
    assert ordinary.to_row()["whitelisted"] == 0 and ordinary.to_row()["credit_status"] is None


@pytest.mark.parametrize(
    "amount", ["123456789012345678.123456789", "0.000000000000000001", "1000000", "0.1"]
)
def test_amounts_stay_exact(tmp_path: Path, amount: str) -> None:
    """Amounts from a JSON number or string come out as the same exact decimal string."""
    for raw in (f'"{amount}"', amount):
        body = jsonio.loads(
            '{"eventId":"e","eventType":"DEPOSIT_WHITELIST_REQUIRED","timestamp":1,"data":'
            + jsonio.dumps(order_data())[:-1]
            + f',"amount":{raw}}}}}'
        )
        fact = fact_from_event(WebhookEnvelope.model_validate(body))
        assert fact is not None and fact.amount == Decimal(amount)
        deposit, _ = observe(None, fact)
        assert deposit.to_row()["amount"] == amount
        assert deposit.as_json()["amount"] == amount
        assert fact.to_json()["amount"] == amount
        assert through_sqlite(tmp_path / f"{len(raw)}.db", deposit).amount == Decimal(amount)


def test_as_json_shape() -> None:
    """as_json carries the `deposits --json` fields with provider spellings and ISO times."""
    deposit, _ = run([required(T0), credited(T0 + 1500)])
    data = deposit.as_json()
    for key in (
        "transactionId",
        "walletId",
        "walletName",
        "currency",
        "network",
        "amount",
        "fromAddress",
        "txHash",
        "status",
        "whiteListStatus",
        "creditStatus",
        "failMessage",
        "state",
        "updatedAt",
    ):
        assert key in data
    assert data["state"] == "credited" and data["whiteListStatus"] == "approved"
    assert data["updatedAt"] == iso_from_ms(T0 + 1500)
    assert jsonio.loads(jsonio.dumps(data)) == data


def test_iso_helpers_round_trip_milliseconds() -> None:
    """ISO 8601 UTC with milliseconds converts back to the same epoch milliseconds."""
    assert iso_from_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_from_ms(T0 + 7) == "2026-09-21T14:13:20.007Z"
    for ms in (0, 1, T0 + 999, 4_102_444_800_123):
        assert ms_from_iso(iso_from_ms(ms)) == ms
    assert ms_from_iso("2026-09-21T14:13:20.007") == T0 + 7


# --- any order, any duplicates ---------------------------------------------------------------


@st.composite
def lifecycles(draw: st.DrawFn) -> list[Fact]:
    """The facts of one realistic deposit history, in the order they happened (some lost)."""
    kind = draw(st.sampled_from(["approved", "blocked", "released", "failed", "ordinary"]))
    t = T0
    steps: list[list[Fact]] = []

    def tick() -> int:
        nonlocal t
        t += draw(st.integers(0, 5_000))
        return t

    if kind == "ordinary":
        at = tick()
        steps.append(
            [notification(at, "PROCESSING", None), poll(at, "PROCESSING", None, "PENDING")]
        )
        at = tick()
        steps.append(
            [
                notification(at, "SUCCESS", None),
                poll(at, "SUCCESS", None, "CREDITED"),
                poll(at, "SUCCESS", None),
            ]
        )
    else:
        at = tick()
        steps.append([required(at), poll(at, "PROCESSING", "init")])
        for n in range(draw(st.integers(0, 2)) + 1):
            if n:
                at = tick()
                reason = f"reason {n}"
                steps.append(
                    [
                        failed(at, reason),
                        poll(at, "PROCESSING", "rejected", failMessage=reason),
                    ]
                )
            at = tick()
            steps.append([submitted(at), poll(at, "PROCESSING", "pending", "PENDING")])
        at = tick()
        if kind == "approved":
            steps.append([credited(at), poll(at, "PROCESSING", "approved", "CREDITED")])
            at = tick()
            steps.append(
                [
                    notification(at, "SUCCESS", "approved"),
                    poll(at, "SUCCESS", "approved", "CREDITED"),
                ]
            )
        elif kind in ("blocked", "released"):
            steps.append([poll(at, "PROCESSING", "pending", "BLOCKED")])
            if kind == "released":  # support released it: CREDITED, then the order completes
                at = tick()
                steps.append([credited(at), poll(at, "PROCESSING", "approved", "CREDITED")])
                at = tick()
                steps.append(
                    [
                        notification(at, "SUCCESS", "approved"),
                        poll(at, "SUCCESS", "approved", "CREDITED"),
                    ]
                )
        else:
            steps.append(
                [notification(at, "FAIL", "pending"), poll(at, "FAIL", "pending", "PENDING")]
            )
    facts = [f for step in steps for f in step if draw(st.booleans()) or f is step[0]]
    return facts


def outcome(deposit: Deposit) -> tuple[Any, ...]:
    """What must not depend on arrival order."""
    return (
        deposit.state,
        deposit.status,
        deposit.white_list_status,
        deposit.credit_status,
        deposit.whitelisted,
        deposit.fail_message,
        deposit.amount,
        deposit.currency,
        deposit.to_address,
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_order_with_duplicates_ends_in_the_same_state(data: st.DataObject) -> None:
    """Any permutation of a lifecycle's facts, duplicates included, ends in the same state."""
    history = data.draw(lifecycles())
    in_order, _ = run(history)
    copies = [f for f in history for _ in range(data.draw(st.integers(1, 3)))]
    shuffled = data.draw(st.permutations(copies))
    final, transitions = run(shuffled)
    assert outcome(final) == outcome(in_order)
    emitted = keys(transitions)
    assert len(emitted) == len(set(emitted))
    assert set(emitted) == final.emitted
    # A BLOCKED read only acts when it comes before the release: blocked fired means the deposit
    # is still blocked or was released since (then released fired with credited).
    released = "released" in final.emitted
    assert not released or final.credit_status is CreditStatus.CREDITED
    for trigger, expected in (
        ("credited", final.credit_status is CreditStatus.CREDITED),
        ("blocked", final.credit_status is CreditStatus.BLOCKED or released),
        ("completed", final.status is OrderStatus.SUCCESS),
        ("failed", final.status is OrderStatus.FAIL),
    ):
        assert (trigger in final.emitted) is expected


def test_lifecycle_in_order_emits_every_round() -> None:
    """In arrival order, two rejection rounds emit every round's rejected and submitted."""
    history = [
        required(T0),
        submitted(T0 + 1),
        failed(T0 + 2, "a"),
        submitted(T0 + 3),
        failed(T0 + 4, "b"),
        submitted(T0 + 5),
        credited(T0 + 6),
        notification(T0 + 7, "SUCCESS", "approved"),
    ]
    _, transitions = run(history + history[::-1])
    assert keys(transitions) == [
        "needs_details",
        "submitted",
        "rejected",
        "submitted#2",
        "rejected#2",
        "submitted#3",
        "credited",
        "completed",
    ]
