"""Rules per wallet (SPEC section 8): YAML rule sets compiled into values and evaluated purely."""

from __future__ import annotations

from worker.rules.engine import RuleBook, failing_condition
from worker.rules.model import (
    EVENT_TYPES,
    KNOWN_TRIGGERS,
    TRIGGERS,
    Action,
    ActionSpec,
    Conditions,
    DepositView,
    Intent,
    ParamCheck,
    Rule,
    RuleSet,
    RuleVerdict,
)

__all__ = [
    "EVENT_TYPES",
    "KNOWN_TRIGGERS",
    "TRIGGERS",
    "Action",
    "ActionSpec",
    "Conditions",
    "DepositView",
    "Intent",
    "ParamCheck",
    "Rule",
    "RuleBook",
    "RuleSet",
    "RuleVerdict",
    "failing_condition",
]
