"""JSON Schemas of the configuration file and the payer profiles file, for editors and CI.

Generated from the models that validate the files (`Settings` and its sections, `PayerDetails`
and the payer table's rules), then adapted to the file as written: `<key>_file` beside every
section key, `${VAR}` in any value, a single value where a list is accepted. Draft-07, the
draft editors' YAML language servers implement (docs/configuration.md).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pycountry
from pydantic import BaseModel

from worker.config.settings import _SECTIONS, Settings
from worker.provider import payer

DRAFT = "http://json-schema.org/draft-07/schema#"
# A value given as ${VAR}: any type once expanded, so the schema takes the text as written.
VARIABLE = {"type": "string", "pattern": r"\$\{[A-Za-z_][A-Za-z0-9_]*\}"}

Schema = dict[str, Any]


def draft7(schema: Schema) -> Schema:
    """pydantic's schema as draft-07: `definitions` for `$defs`, no keyword beside `$ref`."""
    out: Schema = _draft7_node(schema)
    if "$defs" in out:
        out["definitions"] = out.pop("$defs")
    return {"$schema": DRAFT, **out}


def _draft7_node(node: Any) -> Any:
    if isinstance(node, list):
        return [_draft7_node(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _draft7_node(v) for k, v in node.items()}
    if isinstance(out.get("$ref"), str):
        out["$ref"] = out["$ref"].replace("#/$defs/", "#/definitions/")
        if len(out) > 1:  # draft-07 ignores keywords beside $ref: keep them around an allOf
            ref = out.pop("$ref")
            out = {"allOf": [{"$ref": ref}], **out}
    return out


_SCHEMA_MAPS = ("properties", "definitions", "$defs", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf")
_SCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "propertyNames")


def _accepts_variable(node: Any) -> Any:
    """Every value that is not already free text also accepts `${VAR}`."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _SCHEMA_MAPS:
        if key in out:
            out[key] = {name: _accepts_variable(v) for name, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if key in out:
            out[key] = [_accepts_variable(v) for v in out[key]]
    for key in _SCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = _accepts_variable(out[key])
    if any(k in out for k in (*_SCHEMA_LISTS, "$ref", "properties", "items")):
        return out
    if out.get("type") == "string" and not {"enum", "pattern", "const"} & out.keys():
        return out
    if out.get("type") in (None, "null") and not {"enum", "const"} & out.keys():
        return out
    return {"anyOf": [out, VARIABLE]}


def _one_or_many(model: type[BaseModel]) -> set[str]:
    """Fields whose `before` validator wraps a single value in a list."""
    names: set[str] = set()
    for dec in model.__pydantic_decorators__.field_validators.values():
        if dec.info.mode == "before" and dec.cls_var_name == "_one_or_many":
            names.update(dec.info.fields)
    return names


def _file_keys(section: Schema, model: type[BaseModel]) -> None:
    """`<key>_file` beside each key (the file's text is the value); a required key may be
    given either way, never both."""
    props: dict[str, Any] = section["properties"]
    many = _one_or_many(model)
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in props:
            continue
        files: Schema = {"type": "string", "description": f"a file whose text is {key}"}
        if name in many:
            files = {"anyOf": [files, {"type": "array", "minItems": 1, "items": files}]}
        props[f"{key}_file"] = files
    required = section.pop("required", [])
    rules: list[Schema] = []
    for key in required:
        if f"{key}_file" in props:
            rules.append({"anyOf": [{"required": [key]}, {"required": [f"{key}_file"]}]})
        else:
            section.setdefault("required", []).append(key)
    for key in [k for k in props if f"{k}_file" in props]:
        rules.append({"not": {"required": [key, f"{key}_file"]}})
    if rules:
        section["allOf"] = rules


def _lists_take_one(section: Schema, model: type[BaseModel]) -> None:
    props: dict[str, Any] = section["properties"]
    for name in _one_or_many(model):
        key = model.model_fields[name].alias or name
        listed = props[key]
        props[key] = {"anyOf": [listed["items"], listed]}


def config_schema() -> Schema:
    """The JSON Schema of depositd.yaml."""
    schema = copy.deepcopy(Settings.model_json_schema(ref_template="#/$defs/{model}"))
    schema["properties"].pop("config_path", None)
    defs: dict[str, Schema] = schema["$defs"]
    for model in _SECTIONS.values():
        _lists_take_one(defs[model.__name__], model)
        _file_keys(defs[model.__name__], model)
    schema["title"] = "depositd configuration (depositd.yaml)"
    out = draft7(schema)
    return dict(_accepts_variable(out))


def _payer_rules() -> list[Schema]:
    """The payer table's conditional rules for a submission (worker.provider.payer)."""

    def when(field: str, value: str, then: Schema) -> Schema:
        cond = {"properties": {field: {"const": value}}, "required": [field]}
        return {"if": cond, "then": then}

    def refuse(fields: tuple[str, ...]) -> Schema:
        return {"not": {"anyOf": [{"required": [f]} for f in fields]}}

    entity, individual = payer.ENTITY_FIELDS, payer.INDIVIDUAL_FIELDS
    return [
        when("correspondentType", "ENTITY", {"required": list(entity), **refuse(individual)}),
        when("correspondentType", "INDIVIDUAL", {"required": list(individual), **refuse(entity)}),
        when("walletType", "VASP", {"required": ["provider"]}),
        when("walletType", "OTHERS", {"required": ["othersPleaseSpecify"]}),
    ]


def _payer_details() -> Schema:
    details = payer.PayerDetails.model_json_schema(ref_template="#/$defs/{model}")
    props: dict[str, Any] = details["properties"]
    # Submitted for a received deposit: the on-chain fields come from the transaction.
    for name in (*payer.SOURCE_FIELDS, "walletId"):
        props.pop(name)
    codes = sorted(c.alpha_2 for c in pycountry.countries)
    props["countryCode"] = {"enum": codes, "description": "ISO 3166-1 alpha-2 (GB, not UK)"}
    props["birthday"] = {
        "anyOf": [{"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}, {"type": "null"}],
        "description": "yyyy-MM-dd",
    }
    props["walletLabel"]["anyOf"][0]["maxLength"] = payer.WALLET_LABEL_MAX
    props["othersPleaseSpecify"]["anyOf"][0]["maxLength"] = payer.OTHERS_MAX
    details["allOf"] = _payer_rules()
    details["title"] = "payer details"
    return details


def profiles_schema() -> Schema:
    """The JSON Schema of a payer profiles file."""
    details = _payer_details()
    defs = details.pop("$defs", {})
    names = {"type": "string", "description": "a profile name"}
    top: Mapping[str, Schema] = {
        "profiles": {
            "type": ["object", "null"],
            "description": "name -> payer details",
            "additionalProperties": {"$ref": "#/$defs/PayerDetails"},
        },
        "addresses": {
            "type": ["object", "null"],
            "description": "source address (exact, case kept) -> profile name",
            "additionalProperties": names,
        },
        "wallets": {
            "type": ["object", "null"],
            "description": "walletId -> fallback profile name",
            "propertyNames": {"pattern": "^[1-9][0-9]*$"},
            "additionalProperties": names,
        },
    }
    schema: Schema = {
        "title": "depositd payer profiles",
        "type": "object",
        "additionalProperties": False,
        "properties": dict(top),
        "$defs": {**defs, "PayerDetails": details},
    }
    return draft7(schema)
