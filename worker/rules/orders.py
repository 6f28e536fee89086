"""The `order_updated` trigger: a stable, collection or wallet transfer order changed.

An order belongs to no wallet's deposit, so only the `"*"` rule set sees the trigger, and a rule
on it may name only the order record's own fields as conditions (`ORDER_CONDITIONS`) and may only
alert, forward (the body is the order record) or ignore. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from worker.provider.jsonio import decimal_str
from worker.rules.model import ANY_WALLET, Intent, Operator, Rule, RuleSet

ORDER_TRIGGER = "order_updated"
# Condition name -> the order record's field it reads (the record's own wire names).
ORDER_CONDITIONS: tuple[str, ...] = (
    "orderStatus",
    "businessType",
    "kind",
    "currency",
    "network",
    "amount",
)
ORDER_ACTIONS = frozenset({"alert", "forward", "ignore"})
_COMPARE = {
    "lt": Decimal.__lt__,
    "lte": Decimal.__le__,
    "gt": Decimal.__gt__,
    "gte": Decimal.__ge__,
    "eq": Decimal.__eq__,
}


def _compare(op: Operator, value: Decimal, bound: Decimal) -> bool:
    return bool(_COMPARE[op](value, bound))


def _text(record: Mapping[str, Any], name: str) -> str | None:
    value = record.get(name)
    return None if value is None else str(value)


def _amount(record: Mapping[str, Any]) -> Decimal | None:
    value = record.get("amount")
    if value is None or isinstance(value, float | bool):
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def failing_order_condition(rule: Rule, record: Mapping[str, Any]) -> str | None:
    """The first reason `rule` does not fire for this order record, or None if it does.

    Text conditions compare case-insensitively (statuses are lowercase for stable orders and
    upper case for collection orders)."""
    if ORDER_TRIGGER not in rule.on:
        return f"not on {ORDER_TRIGGER}"
    cond = rule.conditions
    checks = (
        ("orderStatus", cond.order_status),
        ("businessType", cond.business_type),
        ("kind", cond.kind),
        ("currency", cond.currency),
        ("network", cond.network),
    )
    for name, wanted in checks:
        value = _text(record, name)
        if wanted is not None and (value or "").upper() not in wanted:
            return f"{name} {value or 'unknown'} is not one of {', '.join(sorted(wanted))}"
    amount = _amount(record)
    for op, bound in cond.amount:
        if amount is None:
            return f"amount is unknown, so not {op} {decimal_str(bound)}"
        if not _compare(op, amount, bound):
            return f"amount {decimal_str(amount)} is not {op} {decimal_str(bound)}"
    return None


def evaluate_order(ruleset: RuleSet | None, record: Mapping[str, Any]) -> list[Intent]:
    """The intents of every matching rule of the `"*"` set (`RuleBook.ruleset_for(None, None)`)
    for `order_updated`, in file order (stopping at `ignore`)."""
    if ruleset is None or ruleset.wallet != ANY_WALLET:
        return []
    intents: list[Intent] = []
    for rule in ruleset.rules:
        if failing_order_condition(rule, record) is not None:
            continue
        for action in rule.actions:
            intents.append(
                Intent(
                    rule_set=ruleset.name,
                    version=ruleset.version,
                    rule=rule.name,
                    trigger=ORDER_TRIGGER,
                    action=action.name,
                    params=dict(action.params),
                )
            )
            if action.name == "ignore":
                return intents
    return intents
