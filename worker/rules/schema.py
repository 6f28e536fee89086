"""The JSON Schema of a rule file, built from the tables the rule loader reads.

Triggers, conditions and operators come from `worker.rules.model`, each action's parameters
from its `ActionSpec.params`; tests/project/test_schemas.py checks the keys against the loader's.
What the schema cannot say (a record trigger's own conditions and actions, `book` only on
credited triggers, profile names) `depositd check` still does.
"""

from __future__ import annotations

from collections.abc import Mapping

from worker.config.schema import DRAFT, Schema
from worker.rules.model import (
    CHANNELS,
    CONDITIONS,
    DURATION_PATTERN,
    KNOWN_TRIGGERS,
    OPERATORS,
    ActionSpec,
)
from worker.rules.recordtriggers import RECORD_CONDITIONS

DECIMAL = r"^\s*[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*$"


def _one_or_list(item: Schema) -> Schema:
    return {"anyOf": [item, {"type": "array", "minItems": 1, "items": item}]}


def _conditions() -> Schema:
    text = _one_or_list({"type": "string", "minLength": 1})
    bound = {"anyOf": [{"type": "string", "pattern": DECIMAL}, {"type": "integer"}]}
    props: dict[str, Schema] = {name: text for name in (*CONDITIONS, *RECORD_CONDITIONS)}
    props["amount"] = {
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {op: bound for op in OPERATORS},
        "description": 'a decimal string per operator, e.g. {lte: "50000"}',
    }
    props["profile"] = {"enum": ["found", "missing"]}
    return {"type": ["object", "null"], "additionalProperties": False, "properties": props}


def _action(specs: Mapping[str, ActionSpec]) -> Schema:
    """A name alone (when no parameter is required), or a mapping of one name to its params."""
    bare: list[str] = []
    forms: list[Schema] = []
    for name, spec in specs.items():
        params = dict(spec.params) if spec.params is not None else None
        if spec.check is None:
            params = {"type": "object", "maxProperties": 0}
        elif params is None:
            params = {"type": "object"}
        if not params.get("required"):
            bare.append(name)
            params = {"anyOf": [params, {"type": "null"}]}
        forms.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": [name],
                "properties": {name: params},
            }
        )
    return {"anyOf": [{"enum": bare}, *forms]}


def rules_schema(specs: Mapping[str, ActionSpec]) -> Schema:
    """The JSON Schema of a rule file; `specs` are the actions rules may name."""
    rule: Schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "on", "then"],
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": "unique in the file"},
            "on": _one_or_list({"$ref": "#/definitions/trigger"}),
            "if": _conditions(),
            "then": _one_or_list({"$ref": "#/definitions/action"}),
        },
    }
    top: Schema = {
        "wallet": {
            "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "minLength": 1}],
            "description": 'a walletId, a walletName, or "*" for every wallet without a file',
        },
        "description": {"type": "string"},
        "deadline": {
            "type": "string",
            "pattern": DURATION_PATTERN,
            "description": "how long a deposit may wait on a person before depositd alerts"
            " again, raised: a whole number and m, h or d, e.g. 4h",
        },
        "escalate": {
            **_one_or_list({"enum": list(CHANNELS)}),
            "description": "the channels of the alert past the deadline (default: those of the"
            " alert that began the wait)",
        },
        "rules": {"type": "array", "items": {"$ref": "#/definitions/rule"}},
    }
    return {
        "$schema": DRAFT,
        "title": "depositd rule set",
        "type": "object",
        "additionalProperties": False,
        "required": ["wallet", "rules"],
        "properties": top,
        "dependencies": {"escalate": ["deadline"]},
        "definitions": {
            "rule": rule,
            "trigger": {"enum": list(KNOWN_TRIGGERS)},
            "action": _action(specs),
        },
    }
