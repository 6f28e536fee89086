"""Reading rule sets from YAML (docs/rules.md) with every problem named by file and line.

`rules:` in the config is one file or a folder; a folder contributes its `*.yaml` files in name
order, except `*.example.yaml` and a payer profiles file (recognised by its `profiles:` key and
the absence of `wallet:`/`rules:`), since the shipped layout keeps `profiles.yaml` next to the
rule sets. Sub-folders (e.g. `rules/examples/`) are not read.

A file's top-level keys are `wallet`, `rules`, an optional free-text `description`, and the
optional `deadline` and `escalate` of deposits waiting on a person (docs/rules.md, "Deadlines").
Every file is read in full and every problem is collected before `ConfigError` is raised, so
one `depositd check` shows all of them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
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
    ANY_WALLET,
    CHANNELS,
    CONDITIONS,
    DURATION_PATTERN,
    DURATION_UNITS,
    KNOWN_TRIGGERS,
    MAX_DEADLINE_S,
    OPERATORS,
    Action,
    ActionSpec,
    Conditions,
    Operator,
    Rule,
    RuleSet,
    WalletKey,
)
from worker.rules.recordtriggers import ORDER_TRIGGER, RECORD_CONDITIONS, RECORD_TRIGGERS

TOP_KEYS = ("wallet", "rules", "description", "deadline", "escalate")
RULE_KEYS = ("name", "on", "if", "then")
# What a rule on a record trigger may do: the record is no deposit to book or submit.
RECORD_ACTIONS = frozenset({"alert", "ignore"})
# Record triggers that allow more: an order may also be forwarded (the body is the order record).
_MORE_RECORD_ACTIONS: dict[str, frozenset[str]] = {ORDER_TRIGGER: frozenset({"forward"})}
_PROFILE_FILE_KEYS = frozenset({"profiles", "addresses", "wallets"})


class _File:
    """Problems of one rule file, each as `file:line: dotted.key: message`."""

    def __init__(
        self,
        src: YamlSource,
        problems: list[str],
        profiles: set[str] | None,
        specs: Mapping[str, ActionSpec],
    ) -> None:
        self.src = src
        self.problems = problems
        self.profiles = profiles
        self.specs = specs
        self.wallet_key: WalletKey | None = None  # set once `wallet:` is read

    @property
    def folder(self) -> Path:
        return self.src.path.parent

    def problem_count(self) -> int:
        return len(self.problems)

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

    def deadline(self, data: dict[str, Any]) -> int | None:
        """`deadline:` in seconds (a whole number and m, h or d), or None when absent."""
        if "deadline" not in data:
            return None
        value = data["deadline"]
        example = "a whole number and a unit, m (minutes), h (hours) or d (days), e.g. 4h"
        if not isinstance(value, str) or not re.fullmatch(DURATION_PATTERN, value):
            shown = "nothing" if value is None else repr(value)
            self.bad(("deadline",), f"must be a duration: {example}; not {shown}")
            return None
        seconds = int(value[:-1]) * DURATION_UNITS[value[-1]]
        if seconds > MAX_DEADLINE_S:
            self.bad(("deadline",), f"{value} is longer than {MAX_DEADLINE_S // 86_400}d")
            return None
        return seconds

    def escalate(self, data: dict[str, Any]) -> tuple[str, ...] | None:
        """`escalate:` (alert channels, as an alert's `channels:`), or None when absent."""
        if "escalate" not in data:
            return None
        if "deadline" not in data:
            self.bad(
                ("escalate",),
                "needs a deadline: (it names the channels of the alert past the deadline)",
            )
            return None
        raw = data["escalate"]
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list) or not items:
            self.bad(("escalate",), f"must be a non-empty list of channels {known(CHANNELS)}")
            return None
        channels: list[str] = []
        before = len(self.problems)
        for index, channel in enumerate(items):
            if channel not in CHANNELS:
                where = ("escalate", index) if isinstance(raw, list) else ("escalate",)
                hint = suggest(str(channel), CHANNELS)
                self.bad(
                    where,
                    f"unknown channel {channel!r} {known(CHANNELS)}{hint}",
                    label=("escalate",),
                )
            elif channel not in channels:
                channels.append(channel)
        return tuple(channels) if len(self.problems) == before else None

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
        if ORDER_TRIGGER in on and len(on) > 1:
            self.bad(
                (*loc, "on"),
                f"{ORDER_TRIGGER} is about an order, not a deposit: give it a rule of its own",
            )
        conditions = self.conditions(item.get("if"), (*loc, "if"), _allowed_conditions(on))
        actions = self.actions(item.get("then"), (*loc, "then"), present="then" in item)
        for spec in [self.specs[n] for n in dict.fromkeys(a.name for a in actions)]:
            if spec.only_on is not None:
                self.only_on(spec, on, item.get("then"), loc)
        self.record_actions(on, actions, loc)
        if len(self.problems) > before or not isinstance(name, str):
            return None
        return Rule(name, on, conditions, actions, self.src.line(loc))

    def record_actions(self, on: frozenset[str], actions: tuple[Action, ...], loc: Loc) -> None:
        """A rule on a record trigger: only the actions every one of its record triggers allows
        (alert and ignore; forward too on order_updated)."""
        records = on & RECORD_TRIGGERS.keys()
        if not records:
            return
        more = [_MORE_RECORD_ACTIONS.get(t, frozenset()) for t in sorted(records)]
        allowed = RECORD_ACTIONS | frozenset.intersection(*more)
        wrong = sorted({a.name for a in actions} - allowed)
        if not wrong:
            return
        what = "an order" if records == {ORDER_TRIGGER} else "a record that belongs to no deposit"
        names = sorted(allowed)
        self.bad(
            (*loc, "then"),
            f"{', '.join(wrong)} cannot act on {what} ({', '.join(sorted(records))}):"
            f" {', '.join(names[:-1])} or {names[-1]}",
        )

    def only_on(self, spec: ActionSpec, on: frozenset[str], then: Any, loc: Loc) -> None:
        """An action that runs only on some triggers (`book`: those meaning credited)."""
        allowed_on = spec.only_on or frozenset()
        wrong = sorted(on - allowed_on)
        if not wrong:
            return
        name = spec.name
        items = then if isinstance(then, list) else [then]
        index = next(
            (i for i, a in enumerate(items) if a == name or (isinstance(a, dict) and name in a)),
            None,
        )
        where = (*loc, "then", index) if isinstance(then, list) and index is not None else loc
        allowed = ", ".join(sorted(allowed_on))
        self.bad(
            where,
            f"{name} needs a trigger {spec.only_on_meaning} ({allowed}), not"
            f" {', '.join(wrong)}: put {name} in a rule of its own on: [{spec.only_on_example}]",
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
            if trigger in RECORD_TRIGGERS and self.wallet_key not in (None, ANY_WALLET):
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

    def conditions(self, value: Any, loc: Loc, allowed: tuple[str, ...]) -> Conditions:
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
            status=self.strings(value, "status", loc, upper=True),
            address_risk_status=self.strings(value, "addressRiskStatus", loc, upper=True),
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
            if out and self.specs[out[-1].name].final:
                last = out[-1].name
                self.bad(
                    (*loc, index),
                    f"an action after {last} never runs; put {last} last",
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
        spec = self.specs.get(name) if isinstance(name, str) else None
        if spec is None:
            names = list(self.specs)
            self.bad(loc, f"unknown action {name!r} {known(names)}{suggest(str(name), names)}")
            return None
        if params is not None and not isinstance(params, dict):
            self.bad(ploc, f"the parameters of {name} must be a mapping")
            return None
        params = params or {}
        if spec.check is None:
            if params:
                self.bad(ploc, f"{name} takes no parameters")
                return None
            return Action(name)
        checked = spec.check(self, params, ploc)
        return None if checked is None else Action(name, checked)


def _allowed_conditions(on: frozenset[str]) -> tuple[str, ...]:
    """The conditions a rule on these triggers may name: those every one of them knows (a
    record trigger knows its record's fields, a deposit trigger the deposit conditions)."""
    if not on:
        return (*CONDITIONS, *RECORD_CONDITIONS)
    allowed: list[str] | None = None
    for trigger in sorted(on):
        fields = RECORD_TRIGGERS.get(trigger, CONDITIONS)
        allowed = list(fields) if allowed is None else [f for f in allowed if f in fields]
    return tuple(allowed or ())


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
    path: Path,
    problems: list[str],
    profile_names: set[str] | None,
    folder: bool,
    specs: Mapping[str, ActionSpec],
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
    file = _File(src, problems, profile_names, specs)
    file.unknown_keys(src.data, (), TOP_KEYS)
    wallet = file.wallet(src.data)
    file.wallet_key = wallet
    deadline = file.deadline(src.data)
    escalate = file.escalate(src.data)
    rules = file.rules(src.data)
    line = src.line(("wallet",))
    if len(problems) > before or wallet is None:
        return _Loaded(wallet, line, None)
    digest = hashlib.sha256(raw).hexdigest()
    ruleset = RuleSet(
        path.name,
        path,
        digest[:12],
        wallet,
        rules,
        line,
        deadline_s=deadline,
        escalate=escalate,
        escalate_line=src.line(("escalate",)) if escalate is not None else 0,
        sha256=digest,
    )
    return _Loaded(wallet, line, ruleset)


def _describe(wallet: WalletKey) -> str:
    if wallet == ANY_WALLET:
        return 'every wallet ("*")'
    return f"wallet {wallet}" if isinstance(wallet, int) else f"wallet {wallet!r}"


def load_rulesets(
    path: Path, *, specs: Mapping[str, ActionSpec], profile_names: set[str] | None = None
) -> list[RuleSet]:
    """Every rule set under `path`; `ConfigError` lists every problem of every file."""
    if not path.exists():
        raise ConfigError([f"{path}: rules path does not exist"])
    problems: list[str] = []
    sets: list[RuleSet] = []
    owners: dict[tuple[bool, WalletKey], tuple[Path, int]] = {}
    folder = path.is_dir()
    for file in rule_files(path):
        loaded = _load_file(file, problems, profile_names, folder, specs)
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
