"""What each recorded fact of a deposit changed: its fields, and its state when it moved.

A fact's `changed` flag says only that the deposit's row changed. Folding the recorded facts in
order again (`observe`, as the tracker did) tells which fields changed and whether the state
moved, so a poll that only filled in `toAddress` is not shown as moving the deposit
(docs/concepts.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.track.tracker import Deposit, Fact, observe

# The deposit's fields a fact can set, by their interface names.
SHOWN = {
    "wallet_id": "walletId",
    "wallet_name": "walletName",
    "currency": "currency",
    "network": "network",
    "amount": "amount",
    "from_address": "fromAddress",
    "to_address": "toAddress",
    "tx_hash": "txHash",
    "status": "status",
    "white_list_status": "whiteListStatus",
    "credit_status": "creditStatus",
    "fail_message": "failMessage",
}


@dataclass(frozen=True)
class FactChange:
    """What one fact changed: field names, and (from, to) states when the state moved (from is
    None for the fact that made the deposit known)."""

    fields: tuple[str, ...]
    moved: tuple[str | None, str] | None

    def describe(self) -> str:
        """For a person: `moved needs_details -> submitted (whiteListStatus)`, `toAddress`."""
        fields = ", ".join(self.fields)
        if self.moved is None:
            return f"changed {fields}" if fields else "known already"
        before, after = self.moved
        moved = f"first seen: {after}" if before is None else f"moved {before} -> {after}"
        return f"{moved} ({fields})" if fields and before is not None else moved


def fact_changes(
    facts: Sequence[Mapping[str, Any]],
    applied: Sequence[bool],
    times: Sequence[int | None] | None = None,
) -> list[FactChange] | None:
    """What each of a deposit's facts (`Fact.to_json` dicts, in recorded order) changed;
    `applied`: each one's recorded `changed` flag (a fact recorded as changing nothing shows
    none); `times`: each one's row `observed_at` (a poll's stored text leaves its time to the
    row, `Fact.from_json`). None when a fact cannot be read back."""
    deposit: Deposit | None = None
    out: list[FactChange] = []
    for i, (stored, was_applied) in enumerate(zip(facts, applied, strict=True)):
        try:
            fact = Fact.from_json(stored, observed_at=None if times is None else times[i])
        except (TypeError, ValueError, KeyError):
            return None
        after, _ = observe(deposit, fact)
        if not was_applied or after is deposit:
            out.append(FactChange((), None))
            deposit = after
            continue
        if deposit is None:
            fields = tuple(v for k, v in SHOWN.items() if getattr(after, k) is not None)
            out.append(FactChange(fields, (None, after.state.value)))
        else:
            fields = tuple(v for k, v in SHOWN.items() if getattr(deposit, k) != getattr(after, k))
            moved = (deposit.state.value, after.state.value)
            out.append(FactChange(fields, moved if moved[0] != moved[1] else None))
        deposit = after
    return out
