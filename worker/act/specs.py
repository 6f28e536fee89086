"""What a rule may say of each action kind: its name, its parameters and their check, the
triggers it may run on (`worker.rules.ActionSpec`, read by the rule loader as data).

Kept apart from the kinds themselves (`worker.act.kinds`, which record and run the actions and
import the store, the provider client and the channels): reading and checking the rules
imports this module only, so `serve` checks its rules before it imports the stages that act
(docs/operations.md, "Start-up time"). A kind's module takes its spec from here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from worker.config.yamlkeys import known, suggest
from worker.config.yamlsrc import Loc
from worker.rules import ActionSpec, ParamCheck
from worker.rules.model import CHANNELS, SEVERITIES

# --- submit_profile ---------------------------------------------------------------------

SUBMIT_KEYS = ("profile",)
# The parameters its check accepts, as JSON Schema (`depositd schema rules`).
SUBMIT_PARAMS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"profile": {"type": "string", "minLength": 1}},
}


def check_submit(file: ParamCheck, params: dict[str, Any], loc: Loc) -> dict[str, Any] | None:
    """An optional `profile` (a stored profile's name); without it, the one that applies."""
    before = file.problem_count()
    file.unknown_keys(params, loc, SUBMIT_KEYS)
    if "profile" not in params:
        return {} if file.problem_count() == before else None
    profile = params["profile"]
    if not isinstance(profile, str) or not profile:
        file.bad((*loc, "profile"), "must be a profile name")
    elif file.profiles is not None and profile not in file.profiles:
        names = sorted(file.profiles)
        hint = suggest(profile, names)
        file.bad(
            (*loc, "profile"),
            f"unknown profile {profile!r} {known(names or ['none'])}{hint}",
        )
    if file.problem_count() > before:
        return None
    return {"profile": profile}


SUBMIT = ActionSpec("submit_profile", check=check_submit, params=SUBMIT_PARAMS)

# --- book -------------------------------------------------------------------------------

# The triggers on which the deposit is credited: credited, completed (an order at SUCCESS is
# credited, whitelisted or not) and released (a blocked deposit credited after all). Raw
# eventTypes and the other triggers do not imply it.
BOOK_TRIGGERS = frozenset({"credited", "completed", "released"})
BOOK = ActionSpec(
    "book",
    only_on=BOOK_TRIGGERS,
    only_on_meaning="that means the deposit is credited",
    only_on_example="credited",
)

# --- alert ------------------------------------------------------------------------------

ALERT_KEYS = ("severity", "channels", "message")
_CHANNEL = {"enum": list(CHANNELS)}
# The parameters its check accepts, as JSON Schema (`depositd schema rules`).
ALERT_PARAMS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "severity": {"enum": list(SEVERITIES), "default": "warning"},
        "channels": {"anyOf": [_CHANNEL, {"type": "array", "minItems": 1, "items": _CHANNEL}]},
        "message": {"type": "string"},
    },
}


def check_alert(file: ParamCheck, params: dict[str, Any], loc: Loc) -> dict[str, Any] | None:
    """severity (default warning), channels (default: every configured one), message."""
    before = file.problem_count()
    file.unknown_keys(params, loc, ALERT_KEYS)
    severity = params.get("severity", "warning")
    if severity not in SEVERITIES:
        file.bad((*loc, "severity"), f"unknown severity {severity!r} {known(SEVERITIES)}")
    channels: list[str] | None = None
    if "channels" in params:
        raw = params["channels"]
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list) or not items:
            file.bad((*loc, "channels"), f"must be a non-empty list {known(CHANNELS)}")
        else:
            channels = []
            for index, channel in enumerate(items):
                if channel not in CHANNELS:
                    file.bad(
                        (*loc, "channels", index),
                        f"unknown channel {channel!r} {known(CHANNELS)}",
                        label=(*loc, "channels"),
                    )
                elif channel not in channels:
                    channels.append(channel)
    message = params.get("message")
    if message is not None and not isinstance(message, str):
        file.bad((*loc, "message"), "must be a string")
    if file.problem_count() > before:
        return None
    out: dict[str, Any] = {"severity": severity, "channels": channels}
    if message is not None:
        out["message"] = message
    return out


def alert_channels(params: Mapping[str, Any]) -> Sequence[str]:
    """The channels an alert action names (none: every configured one)."""
    return list(params.get("channels") or ())


ALERT = ActionSpec("alert", check=check_alert, params=ALERT_PARAMS)

# --- forward ----------------------------------------------------------------------------

FORWARD_KEYS = ("url", "secret_env", "secret_file", "allow_insecure_http")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The parameters its check accepts, as JSON Schema (`depositd schema rules`).
FORWARD_PARAMS = {
    "type": "object",
    "additionalProperties": False,
    "required": ["url"],
    "oneOf": [{"required": ["secret_env"]}, {"required": ["secret_file"]}],
    "properties": {
        "url": {"type": "string", "pattern": "^https?://"},
        "secret_env": {"type": "string", "pattern": f"^{_ENV_NAME.pattern}$"},
        "secret_file": {"type": "string", "minLength": 1},
        "allow_insecure_http": {"type": "boolean"},
    },
}


def check_forward(file: ParamCheck, params: dict[str, Any], loc: Loc) -> dict[str, Any] | None:
    """url (http or https), secret_env or secret_file (the POST is signed), allow_insecure_http."""
    before = file.problem_count()
    file.unknown_keys(params, loc, FORWARD_KEYS)
    url = params.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        file.bad((*loc, "url") if "url" in params else loc, "forward needs url: http(s)://...")
    out: dict[str, Any] = {"url": url}
    if "secret_env" in params and "secret_file" in params:
        file.bad((*loc, "secret_file"), "give either secret_env or secret_file, not both")
    elif "secret_env" not in params and "secret_file" not in params:
        # docs/rules.md: forward posts the deposit signed; never unsigned by omission.
        file.bad(loc, "forward needs secret_env or secret_file (the POST is signed)")
    env = params.get("secret_env")
    if "secret_env" in params:
        if not isinstance(env, str) or not _ENV_NAME.fullmatch(env):
            file.bad((*loc, "secret_env"), "must be an environment variable name")
        out["secret_env"] = env
    if "secret_file" in params:
        secret_file = params["secret_file"]
        if not isinstance(secret_file, str) or not secret_file:
            file.bad((*loc, "secret_file"), "must be a file path")
        else:
            path = Path(secret_file)
            # Like every path in the config: relative to the file that names it.
            out["secret_file"] = str(path if path.is_absolute() else file.folder / path)
    if "allow_insecure_http" in params:
        if not isinstance(params["allow_insecure_http"], bool):
            file.bad((*loc, "allow_insecure_http"), "must be true or false")
        out["allow_insecure_http"] = params["allow_insecure_http"]
    if file.problem_count() > before:
        return None
    return out


def forward_url(params: Mapping[str, Any]) -> tuple[str, bool]:
    """(url, plain http allowed) of a forward action."""
    return str(params.get("url", "")), bool(params.get("allow_insecure_http"))


FORWARD = ActionSpec("forward", check=check_forward, params=FORWARD_PARAMS)

# --- ignore -----------------------------------------------------------------------------

IGNORE = ActionSpec("ignore", final=True)

# What the rule loader accepts (`RuleBook.load(..., specs=SPECS)`), in the order `check` and the
# loader's messages name the kinds (`worker.act.kinds.KINDS` has the same order).
SPECS: Mapping[str, ActionSpec] = {
    spec.name: spec for spec in (SUBMIT, BOOK, ALERT, FORWARD, IGNORE)
}
# Where an action posts (for the plain-http check), and the alert channels it names.
URLS: Mapping[str, Callable[[Mapping[str, Any]], tuple[str, bool]]] = {"forward": forward_url}
NAMED_CHANNELS: Mapping[str, Callable[[Mapping[str, Any]], Sequence[str]]] = {
    "alert": alert_channels
}
