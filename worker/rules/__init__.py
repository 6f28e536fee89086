"""Rules per wallet (SPEC section 8): YAML rule sets compiled into values and evaluated purely."""

from __future__ import annotations

from worker.rules.engine import RuleBook, failing_condition
from worker.rules.model import (
    ACTIONS,
    EVENT_TYPES,
    KNOWN_TRIGGERS,
    TRIGGERS,
    Action,
    Conditions,
    DepositView,
    Intent,
    Rule,
    RuleSet,
    RuleVerdict,
)
from worker.rules.records import RECORD_TRIGGERS, RecordView, is_record_trigger

__all__ = [
    "ACTIONS",
    "EVENT_TYPES",
    "KNOWN_TRIGGERS",
    "RECORD_TRIGGERS",
    "TRIGGERS",
    "Action",
    "Conditions",
    "DepositView",
    "Intent",
    "RecordView",
    "Rule",
    "RuleBook",
    "RuleSet",
    "RuleVerdict",
    "failing_condition",
    "is_record_trigger",
]
