"""Reading rule sets from YAML (SPEC section 8) with every problem named by file and line.

`rules:` in the config is one file or a folder; a folder contributes its `*.yaml` files in name
order, except `*.example.yaml` and a payer profiles file (recognised by its `profiles:` key and
the absence of `wallet:`/`rules:`), since the shipped layout keeps `profiles.yaml` next to the
rule sets. Sub-folders (e.g. `rules/examples/`) are not read.

A file's top-level keys are `wallet`, `rules` and an optional free-text `description`.
Every file is read in full and every problem is collected before `ConfigError` is raised, so
one `depositd check` shows all of them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, cast

import yaml

from worker.config.yamlkeys import duplicate_keys, known, suggest
from worker.config.yamlsrc import Loc, YamlSource, dotted, yaml_error
from worker.config.yamlsrc import loads as parse_yaml
from worker.errors import ConfigError
from worker.rules.model import (
    ACTIONS,
    ANY_WALLET,
    CHANNELS,
    CONDITIONS,
    KNOWN_TRIGGERS,
    OPERATORS,
    SEVERITIES,
    Action,
    Conditions,
    Operator,
    Rule,
    RuleSet,
    WalletKey,
)
from worker.rules.orders import ORDER_ACTIONS, ORDER_CONDITIONS, ORDER_TRIGGER

TOP_KEYS = ("wallet", "rules", "description")
# The triggers on which the deposit is credited: credited, completed (an order at SUCCESS is
# credited, whitelisted or not) and released (a blocked deposit credited after all). Raw
# eventTypes and the other triggers do not imply it.
BOOK_TRIGGERS = frozenset({"credited", "completed", "released"})
RULE_KEYS = ("name", "on", "if", "then")
ALERT_KEYS = ("severity", "channels", "message")
FORWARD_KEYS = ("url", "secret_env", "secret_file", "allow_insecure_http")
SUBMIT_KEYS = ("profile",)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PROFILE_FILE_KEYS = frozenset({"profiles", "addresses", "wallets"})


class _File:
    """Problems of one rule file, each as `file:line: dotted.key: message`."""

    def __init__(self, src: YamlSource, problems: list[str], profiles: set[str] | None) -> None:
        self.src = src
        self.problems = problems
        self.profiles = profiles
        self.wallet_key: WalletKey | None = None  # set once `wallet:` is read

    def bad(self, loc: Loc, message: str, *, label: Loc | None = None) -> None:
        self.problems.append(f"{self.src.where(loc)}: {dotted(label or loc)}: {message}")

    def unknown_keys(self, value: dict[Any, Any], loc: Loc, allowed: Sequence[str]) -> None:
        for key in value:
            if key not in allowed:
                hint = suggest(str(key), allowed)
                self.bad((*loc, key), f"unknown key {key!r} {known(allowed)}{hint}")

    # --- top level ---

    def wallet(self, data: dict[str, Any]) -> WalletKey | None:
        if "wallet" not in data:
            self.bad((), 'wallet: is missing (a walletId, a walletName, or "*")')
            return None
        value = data["wallet"]
        if isinstance(value, bool) or not isinstance(value, int | str):
            self.bad(("wallet",), 'must be a walletId number, a walletName string, or "*"')
            return None
        if isinstance(value, int) and value <= 0:
            self.bad(("wallet",), "a walletId is a positive number")
            return None
        if isinstance(value, str) and not value.strip():
            self.bad(("wallet",), "must not be empty")
            return None
        return value

    def rules(self, data: dict[str, Any]) -> tuple[Rule, ...]:
        if "rules" not in data:
            self.bad((), "rules: is missing (a list of rules)")
            return ()
        items = data["rules"]
        if not isinstance(items, list):
            self.bad(("rules",), "must be a list of rules")
            return ()
        out: list[Rule] = []
        names: dict[str, int] = {}
        for index, item in enumerate(items):
            rule = self.rule(item, ("rules", index))
            if rule is None:
                continue
            if rule.name in names:
                self.bad(
                    ("rules", index, "name"),
                    f"rule name {rule.name!r} is used twice (first at line {names[rule.name]})",
                )
                continue
            names[rule.name] = rule.line
            out.append(rule)
        return tuple(out)

    # --- one rule ---

    def rule(self, item: Any, loc: Loc) -> Rule | None:
        if not isinstance(item, dict):
            self.bad(loc, "a rule must be a mapping with name, on, if and then")
            return None
        before = len(self.problems)
        self.unknown_keys(item, loc, RULE_KEYS)
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            self.bad((*loc, "name"), "every rule needs a name (a non-empty string)")
        on = self.triggers(item.get("on"), (*loc, "on"), present="on" in item)
        is_order = ORDER_TRIGGER in on
        if is_order and len(on) > 1:
            self.bad(
                (*loc, "on"),
                f"{ORDER_TRIGGER} is about an order, not a deposit: give it a rule of its own",
            )
        allowed = ORDER_CONDITIONS if is_order else CONDITIONS
        conditions = self.conditions(item.get("if"), (*loc, "if"), allowed)
        actions = self.actions(item.get("then"), (*loc, "then"), present="then" in item)
        if is_order:
            wrong = sorted({a.name for a in actions} - ORDER_ACTIONS)
            if wrong:
                self.bad(
                    (*loc, "then"),
                    f"{', '.join(wrong)} cannot act on an order ({ORDER_TRIGGER}):"
                    f" {', '.join(sorted(ORDER_ACTIONS))}",
                )
        elif any(a.name == "book" for a in actions):
            self.book_triggers(on, item.get("then"), loc)
        if len(self.problems) > before or not isinstance(name, str):
            return None
        return Rule(name, on, conditions, actions, self.src.line(loc))

    def book_triggers(self, on: frozenset[str], then: Any, loc: Loc) -> None:
        """`book` only on triggers that mean the deposit is credited at that moment."""
        wrong = sorted(on - BOOK_TRIGGERS)
        if not wrong:
            return
        items = then if isinstance(then, list) else [then]
        index = next(
            (
                i
                for i, a in enumerate(items)
                if a == "book" or (isinstance(a, dict) and "book" in a)
            ),
            None,
        )
        where = (*loc, "then", index) if isinstance(then, list) and index is not None else loc
        allowed = ", ".join(sorted(BOOK_TRIGGERS))
        self.bad(
            where,
            f"book needs a trigger that means the deposit is credited ({allowed}), not"
            f" {', '.join(wrong)}: put book in a rule of its own on: [credited]",
            label=(*loc, "then"),
        )

    def triggers(self, value: Any, loc: Loc, *, present: bool) -> frozenset[str]:
        if not present:
            self.bad(loc, "is missing (a list of triggers or eventTypes)")
            return frozenset()
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            self.bad(loc, "must be a non-empty list of triggers or eventTypes")
            return frozenset()
        out = set()
        for index, trigger in enumerate(items):
            if trigger == ORDER_TRIGGER and self.wallet_key not in (None, ANY_WALLET):
                self.bad(
                    (*loc, index),
                    f"{trigger} belongs to no wallet: only the rule set for every wallet"
                    ' (wallet: "*") sees it',
                    label=loc,
                )
            elif trigger in KNOWN_TRIGGERS:
                out.add(cast(str, trigger))
            else:
                hint = suggest(str(trigger), KNOWN_TRIGGERS)
                self.bad(
                    (*loc, index),
                    f"unknown trigger {trigger!r} {known(KNOWN_TRIGGERS)}{hint}",
                    label=loc,
                )
        return frozenset(out)

    # --- conditions ---

    def conditions(self, value: Any, loc: Loc, allowed: Sequence[str] = CONDITIONS) -> Conditions:
        if value is None:
            return Conditions()
        if not isinstance(value, dict):
            self.bad(loc, "must be a mapping of conditions")
            return Conditions()
        for key in value:
            if key not in allowed:
                hint = suggest(str(key), allowed)
                self.bad((*loc, key), f"unknown condition {key!r} {known(allowed)}{hint}")
        currency = self.strings(value, "currency", loc, upper=True)
        network = self.strings(value, "network", loc, upper=True)
        from_address = self.strings(value, "fromAddress", loc)
        wallet_name = self.strings(value, "walletName", loc)
        amount = self.amount(value["amount"], (*loc, "amount")) if "amount" in value else ()
        profile = value.get("profile")
        if "profile" in value and profile not in ("found", "missing"):
            self.bad((*loc, "profile"), f"must be found or missing, not {profile!r}")
            profile = None
        return Conditions(
            currency=currency,
            network=network,
            amount=amount,
            from_address=from_address,
            wallet_name=wallet_name,
            profile=profile,
            order_status=self.strings(value, "orderStatus", loc, upper=True),
            business_type=self.strings(value, "businessType", loc, upper=True),
            kind=self.strings(value, "kind", loc, upper=True),
        )

    def strings(
        self, cond: dict[str, Any], key: str, loc: Loc, *, upper: bool = False
    ) -> frozenset[str] | None:
        if key not in cond:
            return None
        value = cond[key]
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            self.bad((*loc, key), "must be a string or a non-empty list of strings")
            return None
        out = set()
        for index, item in enumerate(items):
            if not isinstance(item, str) or not item.strip():
                hint = " (quote it in YAML)" if isinstance(item, int | float) else ""
                where = (*loc, key, index) if isinstance(value, list) else (*loc, key)
                self.bad(where, f"must be a non-empty string{hint}", label=(*loc, key))
                continue
            out.add(item.strip().upper() if upper else item)
        return frozenset(out)

    def amount(self, value: Any, loc: Loc) -> tuple[tuple[Operator, Decimal], ...]:
        if not isinstance(value, dict) or not value:
            self.bad(loc, 'must be a mapping of operator to decimal string, e.g. {lte: "50000"}')
            return ()
        out: list[tuple[Operator, Decimal]] = []
        for op, raw in value.items():
            if op not in OPERATORS:
                hint = suggest(str(op), OPERATORS)
                self.bad((*loc, op), f"unknown operator {op!r} {known(OPERATORS)}{hint}")
                continue
            bound = self.decimal(raw, (*loc, op))
            if bound is not None:
                out.append((cast(Operator, op), bound))
        return tuple(out)

    def decimal(self, raw: Any, loc: Loc) -> Decimal | None:
        if isinstance(raw, float):
            self.bad(
                loc,
                f"{raw!r} is a YAML float, which is inexact; write the amount as a quoted "
                f'decimal string, e.g. "{raw}"',
            )
            return None
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            self.bad(loc, f'must be a decimal string, e.g. "50000", not {raw!r}')
            return None
        # A YAML int is exact, so `lte: 50000` is accepted as well as `lte: "50000"`.
        try:
            number = Decimal(raw.strip() if isinstance(raw, str) else raw)
        except InvalidOperation:
            self.bad(loc, f"{raw!r} is not a decimal number")
            return None
        if not number.is_finite():
            self.bad(loc, f"{raw!r} is not a finite decimal number")
            return None
        return number

    # --- actions ---

    def actions(self, value: Any, loc: Loc, *, present: bool) -> tuple[Action, ...]:
        if not present:
            self.bad(loc, "is missing (a list of actions)")
            return ()
        items = [value] if isinstance(value, str | dict) else value
        if not isinstance(items, list) or not items:
            self.bad(loc, "must be a non-empty list of actions")
            return ()
        out: list[Action] = []
        for index, item in enumerate(items):
            if out and out[-1].name == "ignore":
                self.bad(
                    (*loc, index),
                    "an action after ignore never runs; put ignore last",
                    label=(*loc, index),
                )
                break
            action = self.action(item, (*loc, index))
            if action is not None:
                out.append(action)
        return tuple(out)

    def action(self, item: Any, loc: Loc) -> Action | None:
        if isinstance(item, str):
            name, params, ploc = item, None, loc
        elif isinstance(item, dict) and len(item) == 1:
            name, params = next(iter(item.items()))
            ploc = (*loc, name)
        else:
            self.bad(loc, "an action is a name, or a mapping of one name to its parameters")
            return None
        if name not in ACTIONS:
            self.bad(loc, f"unknown action {name!r} {known(ACTIONS)}{suggest(str(name), ACTIONS)}")
            return None
        if params is not None and not isinstance(params, dict):
            self.bad(ploc, f"the parameters of {name} must be a mapping")
            return None
        params = params or {}
        if name in ("book", "ignore"):
            if params:
                self.bad(ploc, f"{name} takes no parameters")
                return None
            return Action(name)
        if name == "submit_profile":
            return self.submit(params, ploc)
        if name == "alert":
            return self.alert(params, ploc)
        return self.forward(params, ploc)

    def submit(self, params: dict[str, Any], loc: Loc) -> Action | None:
        before = len(self.problems)
        self.unknown_keys(params, loc, SUBMIT_KEYS)
        if "profile" not in params:
            return Action("submit_profile") if len(self.problems) == before else None
        profile = params["profile"]
        if not isinstance(profile, str) or not profile:
            self.bad((*loc, "profile"), "must be a profile name")
        elif self.profiles is not None and profile not in self.profiles:
            names = sorted(self.profiles)
            hint = suggest(profile, names)
            self.bad(
                (*loc, "profile"),
                f"unknown profile {profile!r} {known(names or ['none'])}{hint}",
            )
        if len(self.problems) > before:
            return None
        return Action("submit_profile", {"profile": profile})

    def alert(self, params: dict[str, Any], loc: Loc) -> Action | None:
        before = len(self.problems)
        self.unknown_keys(params, loc, ALERT_KEYS)
        severity = params.get("severity", "warning")
        if severity not in SEVERITIES:
            self.bad((*loc, "severity"), f"unknown severity {severity!r} {known(SEVERITIES)}")
        channels: list[str] | None = None
        if "channels" in params:
            raw = params["channels"]
            items = [raw] if isinstance(raw, str) else raw
            if not isinstance(items, list) or not items:
                self.bad((*loc, "channels"), f"must be a non-empty list {known(CHANNELS)}")
            else:
                channels = []
                for index, channel in enumerate(items):
                    if channel not in CHANNELS:
                        self.bad(
                            (*loc, "channels", index),
                            f"unknown channel {channel!r} {known(CHANNELS)}",
                            label=(*loc, "channels"),
                        )
                    elif channel not in channels:
                        channels.append(channel)
        message = params.get("message")
        if message is not None and not isinstance(message, str):
            self.bad((*loc, "message"), "must be a string")
        if len(self.problems) > before:
            return None
        out: dict[str, Any] = {"severity": severity, "channels": channels}
        if message is not None:
            out["message"] = message
        return Action("alert", out)

    def forward(self, params: dict[str, Any], loc: Loc) -> Action | None:
        before = len(self.problems)
        self.unknown_keys(params, loc, FORWARD_KEYS)
        url = params.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            self.bad((*loc, "url") if "url" in params else loc, "forward needs url: http(s)://...")
        out: dict[str, Any] = {"url": url}
        if "secret_env" in params and "secret_file" in params:
            self.bad((*loc, "secret_file"), "give either secret_env or secret_file, not both")
        elif "secret_env" not in params and "secret_file" not in params:
            # SPEC section 8: forward posts the deposit signed; never unsigned by omission.
            self.bad(loc, "forward needs secret_env or secret_file (the POST is signed)")
        env = params.get("secret_env")
        if "secret_env" in params:
            if not isinstance(env, str) or not _ENV_NAME.fullmatch(env):
                self.bad((*loc, "secret_env"), "must be an environment variable name")
            out["secret_env"] = env
        if "secret_file" in params:
            file = params["secret_file"]
            if not isinstance(file, str) or not file:
                self.bad((*loc, "secret_file"), "must be a file path")
            else:
                path = Path(file)
                # Like every path in the config: relative to the file that names it.
                out["secret_file"] = str(
                    path if path.is_absolute() else self.src.path.parent / path
                )
        if "allow_insecure_http" in params:
            if not isinstance(params["allow_insecure_http"], bool):
                self.bad((*loc, "allow_insecure_http"), "must be true or false")
            out["allow_insecure_http"] = params["allow_insecure_http"]
        if len(self.problems) > before:
            return None
        return Action("forward", out)


def rule_files(path: Path) -> list[Path]:
    """The rule files `rules:` names: the file itself, or a folder's `*.yaml` in name order."""
    if path.is_dir():
        return sorted(
            p for p in path.glob("*.yaml") if p.is_file() and not p.name.endswith(".example.yaml")
        )
    return [path]


def _is_profiles_file(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and bool(_PROFILE_FILE_KEYS & data.keys())
        and not {"wallet", "rules"} & data.keys()
    )


@dataclass(frozen=True)
class _Loaded:
    wallet: WalletKey | None
    line: int
    ruleset: RuleSet | None


def _load_file(
    path: Path, problems: list[str], profile_names: set[str] | None, folder: bool
) -> _Loaded | None:
    """One rule file; problems go to `problems`. None when unreadable or a profiles file."""
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        problems.append(f"{path}: cannot read rules: {exc.strerror}")
        return None
    except UnicodeDecodeError:
        problems.append(f"{path}:1: rules file is not UTF-8 text")
        return None
    try:
        # `on:` is the trigger key, and YAML 1.1 would read it (and `On:`, `yes:`) as True.
        src = parse_yaml(text, path, bool_keys_as_text=True)
    except yaml.YAMLError as exc:
        problems.append(yaml_error(path, exc))
        return None
    except ConfigError as exc:
        problems.extend(exc.problems)
        return None
    if folder and _is_profiles_file(src.data):
        return None
    if not isinstance(src.data, dict):
        found = "an empty file" if src.data is None else f"a {type(src.data).__name__}"
        problems.append(
            f"{path}:1: a rule set must be a YAML mapping with wallet: and rules: (found {found})"
        )
        return None
    before = len(problems)
    problems.extend(duplicate_keys(src))
    file = _File(src, problems, profile_names)
    file.unknown_keys(src.data, (), TOP_KEYS)
    wallet = file.wallet(src.data)
    file.wallet_key = wallet
    rules = file.rules(src.data)
    line = src.line(("wallet",))
    if len(problems) > before or wallet is None:
        return _Loaded(wallet, line, None)
    version = hashlib.sha256(raw).hexdigest()[:12]
    return _Loaded(wallet, line, RuleSet(path.name, path, version, wallet, rules))


def load_ruleset(path: Path, *, profile_names: set[str] | None = None) -> RuleSet:
    """One rule file; `ConfigError` lists its problems."""
    problems: list[str] = []
    loaded = _load_file(path, problems, profile_names, folder=False)
    if problems or loaded is None or loaded.ruleset is None:
        raise ConfigError(problems)
    return loaded.ruleset


def _describe(wallet: WalletKey) -> str:
    if wallet == ANY_WALLET:
        return 'every wallet ("*")'
    return f"wallet {wallet}" if isinstance(wallet, int) else f"wallet {wallet!r}"


def load_rulesets(path: Path, *, profile_names: set[str] | None = None) -> list[RuleSet]:
    """Every rule set under `path`; `ConfigError` lists every problem of every file."""
    if not path.exists():
        raise ConfigError([f"{path}: rules path does not exist"])
    problems: list[str] = []
    sets: list[RuleSet] = []
    owners: dict[tuple[bool, WalletKey], tuple[Path, int]] = {}
    folder = path.is_dir()
    for file in rule_files(path):
        loaded = _load_file(file, problems, profile_names, folder)
        if loaded is None or loaded.wallet is None:
            continue
        key = (isinstance(loaded.wallet, int), loaded.wallet)
        if key in owners:
            other, line = owners[key]
            problems.append(
                f"{file}:{loaded.line}: wallet: {_describe(loaded.wallet)} already has a rule set "
                f"in {other}:{line}"
            )
            continue
        owners[key] = (file, loaded.line)
        if loaded.ruleset is not None:
            sets.append(loaded.ruleset)
    if problems:
        raise ConfigError(problems)
    return sets
