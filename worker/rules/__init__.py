"""Rules per wallet (docs/rules.md): YAML rule sets compiled into values and evaluated purely."""

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
from worker.rules.recordtriggers import RECORD_TRIGGERS, RecordView, is_record_trigger

__all__ = [
    "EVENT_TYPES",
    "KNOWN_TRIGGERS",
    "RECORD_TRIGGERS",
    "TRIGGERS",
    "Action",
    "ActionSpec",
    "Conditions",
    "DepositView",
    "Intent",
    "ParamCheck",
    "RecordView",
    "Rule",
    "RuleBook",
    "RuleSet",
    "RuleVerdict",
    "failing_condition",
    "is_record_trigger",
]
