"""The rule book and its pure evaluation: (deposit, trigger) -> intents, no I/O.

Which rule set applies to a deposit: the set whose `wallet:` is its walletId, else the set whose
`wallet:` is its walletName, else the `"*"` set. Within that set every rule whose `on:` names the
trigger and whose conditions all hold runs, in file order. `ignore` is the exception: it ends the
evaluation for that trigger, so no later rule (and no later action of the same rule) runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path

from worker.provider.jsonio import decimal_str
from worker.rules.model import (
    ANY_WALLET,
    Action,
    ActionSpec,
    DepositView,
    Intent,
    Operator,
    Rule,
    RuleSet,
    RuleVerdict,
)
from worker.rules.recordtriggers import RecordView

_COMPARE = {
    "lt": Decimal.__lt__,
    "lte": Decimal.__le__,
    "gt": Decimal.__gt__,
    "gte": Decimal.__ge__,
    "eq": Decimal.__eq__,
}


def _listing(values: Iterable[str]) -> str:
    return ", ".join(sorted(values))


def _compare(op: Operator, value: Decimal, bound: Decimal) -> bool:
    return bool(_COMPARE[op](value, bound))


def failing_condition(
    rule: Rule, deposit: DepositView, trigger: str, *, profile_found: bool
) -> str | None:
    """The first reason `rule` does not fire for this deposit and trigger, or None if it does."""
    if trigger not in rule.on:
        return f"not on {trigger} (on: {_listing(rule.on)})"
    cond = rule.conditions
    if cond.currency is not None:
        currency = (deposit.currency or "").upper()
        if currency not in cond.currency:
            shown = deposit.currency or "unknown"
            return f"currency {shown} is not one of {_listing(cond.currency)}"
    if cond.network is not None:
        network = (deposit.network or "").upper()
        if network not in cond.network:
            shown = deposit.network or "unknown"
            return f"network {shown} is not one of {_listing(cond.network)}"
    for op, bound in cond.amount:
        if deposit.amount is None:
            return f"amount is unknown, so not {op} {decimal_str(bound)}"
        if not _compare(op, deposit.amount, bound):
            return f"amount {decimal_str(deposit.amount)} is not {op} {decimal_str(bound)}"
    if cond.from_address is not None and deposit.from_address not in cond.from_address:
        shown = deposit.from_address or "unknown"
        return f"fromAddress {shown} is not one of the rule's {len(cond.from_address)} address(es)"
    if cond.wallet_name is not None and deposit.wallet_name not in cond.wallet_name:
        shown = repr(deposit.wallet_name) if deposit.wallet_name else "unknown"
        return f"walletName {shown} is not one of {_listing(repr(n) for n in cond.wallet_name)}"
    if cond.profile == "found" and not profile_found:
        return "profile: no stored profile applies (rule needs found)"
    if cond.profile == "missing" and profile_found:
        return "profile: a stored profile applies (rule needs missing)"
    return None


def _text_condition(name: str, wanted: frozenset[str] | None, value: str | None) -> str | None:
    if wanted is None or (value or "").upper() in wanted:
        return None
    return f"{name} {value or 'unknown'} is not one of {_listing(wanted)}"


def failing_record_condition(rule: Rule, record: RecordView, trigger: str) -> str | None:
    """The first reason `rule` does not fire for this record and trigger, or None if it does."""
    if trigger not in rule.on:
        return f"not on {trigger} (on: {_listing(rule.on)})"
    cond = rule.conditions
    checks = (
        ("currency", cond.currency),
        ("network", cond.network),
        ("status", cond.status),
        ("addressRiskStatus", cond.address_risk_status),
        ("orderStatus", cond.order_status),
        ("businessType", cond.business_type),
        ("kind", cond.kind),
    )
    for name, wanted in checks:
        reason = _text_condition(name, wanted, record.text(name))
        if reason is not None:
            return reason
    amount = record.amount()
    for op, bound in cond.amount:
        if amount is None:
            return f"amount is unknown, so not {op} {decimal_str(bound)}"
        if not _compare(op, amount, bound):
            return f"amount {decimal_str(amount)} is not {op} {decimal_str(bound)}"
    return None


def _intents(ruleset: RuleSet, rule: Rule, trigger: str) -> tuple[list[Intent], bool]:
    """The rule's intents, and whether it ended evaluation with `ignore`."""
    out = []
    for action in rule.actions:
        out.append(
            Intent(
                rule_set=ruleset.name,
                version=ruleset.version,
                rule=rule.name,
                trigger=trigger,
                action=action.name,
                params=dict(action.params),
            )
        )
        if action.name == "ignore":
            return out, True
    return out, False


class RuleBook:
    """Every loaded rule set, indexed by walletId, walletName and "*"."""

    def __init__(self, rulesets: Sequence[RuleSet]) -> None:
        self.rulesets: tuple[RuleSet, ...] = tuple(rulesets)
        self._by_id: dict[int, RuleSet] = {}
        self._by_name: dict[str, RuleSet] = {}
        self._default: RuleSet | None = None
        for rs in self.rulesets:
            if rs.wallet == ANY_WALLET:
                if self._default is not None:
                    raise ValueError("two rule sets for every wallet ('*')")
                self._default = rs
            elif isinstance(rs.wallet, int):
                if self._by_id.setdefault(rs.wallet, rs) is not rs:
                    raise ValueError(f"two rule sets for wallet {rs.wallet}")
            elif self._by_name.setdefault(rs.wallet, rs) is not rs:
                raise ValueError(f"two rule sets for wallet {rs.wallet!r}")
        self._named: frozenset[str] = frozenset(
            trigger for rs in self.rulesets for rule in rs.rules for trigger in rule.on
        )

    def __repr__(self) -> str:
        names = ", ".join(f"{rs.name}@{rs.version}" for rs in self.rulesets)
        return f"RuleBook({names})"

    @classmethod
    def load(
        cls,
        path: Path,
        *,
        specs: Mapping[str, ActionSpec],
        profile_names: set[str] | None = None,
    ) -> RuleBook:
        """Load a rule file or a folder of them; `ConfigError` lists every problem (file:line).

        `specs` are the actions a rule may name (`worker.act.kinds.SPECS`); `profile_names`,
        when given, are the stored profiles a rule may name.
        """
        from worker.rules.loader import load_rulesets

        return cls(load_rulesets(path, specs=specs, profile_names=profile_names))

    @classmethod
    def empty(cls) -> RuleBook:
        """A book without rules: nothing acts."""
        return cls(())

    def actions(self, name: str) -> Iterator[tuple[RuleSet, Rule, Action]]:
        """Every action called `name`, with the rule and the rule set it is in (file order)."""
        for ruleset in self.rulesets:
            for rule in ruleset.rules:
                for action in rule.actions:
                    if action.name == name:
                        yield ruleset, rule, action

    @property
    def version(self) -> str:
        """One hash over every set's name and version, to notice any change on reload."""
        text = "\n".join(f"{rs.name}:{rs.version}" for rs in self.rulesets)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def shortest_deadline_s(self) -> int | None:
        """The shortest `deadline:` of any set (None: no set has one, nothing is ever due)."""
        deadlines = [rs.deadline_s for rs in self.rulesets if rs.deadline_s is not None]
        return min(deadlines, default=None)

    def names(self, trigger: str) -> bool:
        """Whether any rule of any set has `trigger` in its `on:` (nothing else can fire)."""
        return trigger in self._named

    def ruleset_for(self, wallet_id: int | None, wallet_name: str | None) -> RuleSet | None:
        """The set for this wallet: exact walletId, then walletName, then "*"."""
        if wallet_id is not None and wallet_id in self._by_id:
            return self._by_id[wallet_id]
        if wallet_name is not None and wallet_name in self._by_name:
            return self._by_name[wallet_name]
        return self._default

    def evaluate(self, deposit: DepositView, trigger: str, *, profile_found: bool) -> list[Intent]:
        """The intents of every matching rule, in file order (stopping at `ignore`)."""
        ruleset = self.ruleset_for(deposit.wallet_id, deposit.wallet_name)
        if ruleset is None:
            return []
        intents: list[Intent] = []
        for rule in ruleset.rules:
            if trigger not in rule.on:
                continue  # the common case, decided without building the reason
            if failing_condition(rule, deposit, trigger, profile_found=profile_found) is None:
                found, stop = _intents(ruleset, rule, trigger)
                intents.extend(found)
                if stop:
                    break
        return intents

    def evaluate_record(self, record: RecordView, trigger: str) -> list[Intent]:
        """The intents of every matching rule of the "*" set for a record trigger (a record
        belongs to no wallet), in file order (stopping at `ignore`)."""
        if self._default is None:
            return []
        intents: list[Intent] = []
        for rule in self._default.rules:
            if failing_record_condition(rule, record, trigger) is None:
                found, stop = _intents(self._default, rule, trigger)
                intents.extend(found)
                if stop:
                    break
        return intents

    def explain(
        self, deposit: DepositView, trigger: str, *, profile_found: bool
    ) -> list[RuleVerdict]:
        """A verdict for every rule of the applying set: matched, or the failing condition."""
        ruleset = self.ruleset_for(deposit.wallet_id, deposit.wallet_name)
        if ruleset is None:
            return []
        verdicts: list[RuleVerdict] = []
        ignored_by: str | None = None
        for rule in ruleset.rules:
            if ignored_by is not None and trigger in rule.on:
                # Only a rule that could have run is stopped by the ignore; the others say why
                # they do not apply, as without it.
                reason = f"not evaluated: rule {ignored_by!r} ran ignore"
                verdicts.append(RuleVerdict(rule.name, False, reason, rule.actions))
                continue
            reason_or_none = failing_condition(rule, deposit, trigger, profile_found=profile_found)
            verdicts.append(
                RuleVerdict(rule.name, reason_or_none is None, reason_or_none, rule.actions)
            )
            if reason_or_none is None and any(a.name == "ignore" for a in rule.actions):
                ignored_by = rule.name
        return verdicts
