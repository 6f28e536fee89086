"""docs/concepts.md against the tracker: the state diagram's arrows and the combined reading
table say what `worker.track.tracker` does."""

from __future__ import annotations

import re
from pathlib import Path

from worker.provider.models import CreditStatus, OrderStatus, WhiteListStatus
from worker.track.tracker import UNKNOWN, Deposit, Fact, State, Trigger, derive_state, observe

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
P, S, F = OrderStatus.PROCESSING, OrderStatus.SUCCESS, OrderStatus.FAIL
INIT, PENDING, APPROVED, REJECTED = (
    WhiteListStatus.INIT,
    WhiteListStatus.PENDING,
    WhiteListStatus.APPROVED,
    WhiteListStatus.REJECTED,
)

# What a fact states to move a deposit into each state (status, whiteListStatus, creditStatus);
# UNKNOWN: the fact says nothing about that field.
INTO: dict[str, tuple[object, object, object]] = {
    "processing": (P, None, CreditStatus.PENDING),
    "needs_details": (P, INIT, CreditStatus.PENDING),
    "submitted": (UNKNOWN, PENDING, UNKNOWN),
    "rejected": (UNKNOWN, REJECTED, UNKNOWN),
    "credited": (UNKNOWN, UNKNOWN, CreditStatus.CREDITED),
    "completed": (S, UNKNOWN, UNKNOWN),
    "blocked": (UNKNOWN, UNKNOWN, CreditStatus.BLOCKED),
    "failed": (F, UNKNOWN, UNKNOWN),
}
# How a deposit reaches each state from nothing: the states it passes through, in order.
PATH = {
    "processing": ["processing"],
    "needs_details": ["needs_details"],
    "submitted": ["needs_details", "submitted"],
    "rejected": ["needs_details", "submitted", "rejected"],
    "credited": ["needs_details", "submitted", "credited"],
    "completed": ["needs_details", "submitted", "credited", "completed"],
    "blocked": ["processing", "blocked"],
    "failed": ["processing", "failed"],
}


def fact(state: str, at: int) -> Fact:
    status, white_list, credit = INTO[state]
    return Fact(
        "TX1",
        "poll",
        at,
        status=status,  # type: ignore[arg-type]
        white_list_status=white_list,  # type: ignore[arg-type]
        credit_status=credit,  # type: ignore[arg-type]
    )


def reach(state: str) -> Deposit:
    deposit = None
    for at, step in enumerate(PATH[state], 1):
        deposit, _ = observe(deposit, fact(step, at * 1000))
    assert deposit is not None and deposit.state.value == state
    return deposit


def arrows() -> list[tuple[str, str, list[str]]]:
    block = re.search(r"```mermaid\n(.*?)```", PAGE, re.S)
    assert block, "docs/concepts.md lost its state diagram"
    found = []
    for line in block.group(1).splitlines():
        m = re.fullmatch(r"\s*(\S+) --> (\S+)(?: : (.+))?", line)
        if m:
            label = m.group(3) or ""
            names = [] if label in ("", "no trigger") else label.split(", ")
            found.append((m.group(1), m.group(2), names))
    return found


def test_the_diagram_names_every_state_and_trigger() -> None:
    """Every tracked state is a node of the diagram, every trigger labels an arrow."""
    drawn = arrows()
    nodes = {n for a, b, _ in drawn for n in (a, b)} - {"[*]"}
    assert nodes == {s.value for s in State}
    assert {t for *_, names in drawn for t in names} == {t.value for t in Trigger}


def test_every_arrow_is_what_the_tracker_does() -> None:
    """Each arrow, applied to a deposit in its first state, gives its second state and fires
    exactly the triggers its label names."""
    for source, target, names in arrows():
        if target == "[*]":
            assert source in ("completed", "failed"), f"{source} is not final"
            continue
        before = None if source == "[*]" else reach(source)
        after, transitions = observe(before, fact(target, 10_000))
        assert after.state.value == target, (source, target)
        fired = sorted(t.trigger.value for t in transitions)
        assert fired == sorted(names), (source, target, fired)


def test_final_states_do_not_move() -> None:
    """completed and failed are final: a later fact of any other state leaves them."""
    for final in ("completed", "failed"):
        for other in INTO:
            after, _ = observe(reach(final), fact(other, 10_000))
            assert after.state.value == final, (final, other)


def test_combined_reading_rows_give_the_documented_state() -> None:
    """Each row of the page's combined reading table derives the state it names."""
    rows = re.findall(
        r"^\| `(\w+)` \| (.+?) \| (.+?) \| .+? \| `(\w+)` \|$", PAGE, re.M
    )  # status, whiteListStatus, creditStatus, spendable, state
    assert len(rows) == 8
    for status, white_list, credit, state in rows:
        lists = (
            [None]
            if "none" in white_list
            else list(WhiteListStatus)
            if white_list == "any"
            else [WhiteListStatus(white_list.strip("`"))]
        )
        credits = list(CreditStatus) if credit == "any" else [CreditStatus(credit.strip("`"))]
        for wl in lists:
            for cs in credits:
                assert derive_state(OrderStatus(status), wl, cs).value == state, (status, wl, cs)
