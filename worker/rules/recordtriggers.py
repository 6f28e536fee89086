"""Record triggers: facts about money that belongs to no wallet's deposit.

A record trigger fires on one of depositd's own records (an abnormal fund, a reconciliation finding,
a stable, collection or wallet transfer order), not on a deposit's transition. Only the `"*"` rule
set sees it, and a rule on it may name only the record's own fields as conditions: this table says
which.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

_ABNORMAL_FIELDS = ("currency", "network", "amount", "status", "addressRiskStatus")

# A stable, collection or wallet transfer order changed (its webhook, then its detail read).
ORDER_TRIGGER = "order_updated"
# The order record's own wire names a rule on order_updated may name.
ORDER_CONDITIONS: tuple[str, ...] = (
    "orderStatus",
    "businessType",
    "kind",
    "currency",
    "network",
    "amount",
)

# trigger -> the condition fields a rule on it may name (the record's own fields).
RECORD_TRIGGERS: dict[str, tuple[str, ...]] = {
    "abnormal_fund": _ABNORMAL_FIELDS,
    "abnormal_expiring": _ABNORMAL_FIELDS,
    "reconcile_finding": ("kind", "currency", "network", "amount"),
    ORDER_TRIGGER: ORDER_CONDITIONS,
}

# Every record field a condition can name, beyond the deposit conditions.
RECORD_CONDITIONS: tuple[str, ...] = (
    "status",
    "addressRiskStatus",
    "kind",
    "orderStatus",
    "businessType",
)


def is_record_trigger(trigger: str) -> bool:
    """True for a trigger about a record that belongs to no wallet."""
    return trigger in RECORD_TRIGGERS


class RecordView:
    """The fields of one record as conditions read them (a mapping of wire names)."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self._fields = dict(fields)

    def text(self, name: str) -> str | None:
        """A string field, or None when absent."""
        value = self._fields.get(name)
        return None if value is None else str(value)

    def amount(self) -> Decimal | None:
        """The record's amount as an exact decimal, or None."""
        value = self._fields.get("amount")
        if value is None or isinstance(value, float | bool):
            return None
        return value if isinstance(value, Decimal) else Decimal(str(value))
