"""Configuration problems in plain words: what is wrong with a key and what would be right.

pydantic's own messages ("Field required", "Input should be a valid string") name neither the
fix nor the alternatives; this module turns each validation error into a sentence for the
operator. A value is never repeated (it may be a secret), except a port number.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from worker.config.yamlkeys import suggest

_KIND = {
    bool: "true or false",
    int: "a number",
    float: "a number",
    list: "a list",
    dict: "a mapping",
}


def _what(value: Any) -> str:
    return _KIND.get(type(value), "something else")


def _model(annotation: Any) -> type[BaseModel] | None:
    """The section model a field holds (`X` or `X | None`), if any."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _credential(annotation: Any) -> bool:
    return "SecretStr" in str(annotation)


def keys_of(model: type[BaseModel]) -> list[str]:
    """The keys a section takes as written: aliases, and `<key>_file` for every credential."""
    keys = []
    for name, info in model.model_fields.items():
        if info.exclude:
            continue
        key = info.alias or name
        keys.append(key)
        if _credential(info.annotation):
            keys.append(f"{key}_file")
    return keys


def _missing(model: type[BaseModel] | None, key: str, dotted: str) -> str:
    if model is None or key not in model.model_fields:
        return "missing; this key is required"
    info = model.model_fields[key]
    section = _model(info.annotation)
    if section is not None:
        required = [
            info.alias or name
            for name, info in section.model_fields.items()
            if info.is_required() and not info.exclude
        ]
        keys = ", ".join(f"{dotted}.{k}" for k in required)
        if not required and key == "storage":  # one of two keys, either will do
            keys = "storage.path, or storage.url for PostgreSQL"
        return f"missing: the file needs a `{key}:` section (with {keys})"
    if _credential(info.annotation):
        return (
            f"missing: give {dotted} (the value, or ${{VARIABLE}}) or {dotted}_file"
            " (a file holding it, e.g. a systemd credential)"
        )
    return f"missing: {dotted} is required"


def plain(
    err: ErrorDetails, loc: tuple[str | int, ...], dotted: str, models: Mapping[Any, Any]
) -> str:
    """The message for one validation error at `loc` (as written), `models` by section loc."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    parent = models.get(tuple(p for p in loc[:-1] if isinstance(p, str)))
    key = str(loc[-1]) if loc else ""
    if kind == "missing":
        return _missing(parent, key, dotted)
    if kind == "extra_forbidden":
        known: Collection[str] = keys_of(parent) if parent else []
        hint = suggest(key, known) if known else ""
        return f"unknown key{hint}" + (f" (known here: {', '.join(known)})" if known else "")
    if kind == "string_type":
        if loc[-2:] == ("webhook", "listen") and isinstance(value, int):
            return f'must be HOST:PORT in quotes, e.g. "127.0.0.1:{value}"'
        return f"must be text, not {_what(value)} (put the value in quotes)"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"must be a whole number, not {_what(value)}"
    if kind in ("float_parsing", "float_type"):
        return f"must be a number, not {_what(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return "must be true or false"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        words = {
            "greater_than": ("more than", "gt"),
            "greater_than_equal": ("at least", "ge"),
            "less_than": ("less than", "lt"),
            "less_than_equal": ("at most", "le"),
        }[kind]
        return f"must be {words[0]} {ctx.get(words[1])}"
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", "")
        return f"must be one of: {expected.replace(' or ', ', ')}"
    if kind == "too_short":
        return "needs at least one value"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping of keys (indented lines under {key or 'it'}:)"
    if kind == "list_type":
        return "must be a list, e.g. [a, b], or one value"
    if kind == "path_type":
        return "must be a file or folder path (text)"
    msg = str(err["msg"])
    return msg.removeprefix("Value error, ")
