"""What a rule set compiles to: immutable values the engine evaluates without any I/O."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, Protocol

from worker.config.yamlsrc import Loc
from worker.rules.recordtriggers import RECORD_TRIGGERS

# The tracker's transition triggers (docs/concepts.md); tests check they equal tracker.Trigger.
TRIGGERS: tuple[str, ...] = (
    "needs_details",
    "rejected",
    "submitted",
    "credited",
    "completed",
    "blocked",
    "released",
    "failed",
)
# Raw eventTypes a rule may name instead of (or besides) a trigger. Only deposit events: address
# events update the addresses table and are reported by `register-address`, not by rules.
EVENT_TYPES: tuple[str, ...] = (
    "DEPOSIT_WHITELIST_REQUIRED",
    "DEPOSIT_WHITELIST_FAILED",
    "DEPOSIT_WHITELIST_CREDITED",
    "DEPOSIT_ORDER_NOTIFICATION",
)
# Triggers about records that belong to no wallet (abnormal funds, reconciliation findings,
# orders): seen only by the "*" rule set; their conditions are the record's own fields.
RECORD_TRIGGER_NAMES: tuple[str, ...] = tuple(RECORD_TRIGGERS)
KNOWN_TRIGGERS: tuple[str, ...] = TRIGGERS + EVENT_TYPES + RECORD_TRIGGER_NAMES

SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
CHANNELS: tuple[str, ...] = ("slack", "email")
# A rule set's `deadline:` (docs/rules.md, "Deadlines"): a whole number and one unit.
DURATION_UNITS: dict[str, int] = {"m": 60, "h": 3600, "d": 86_400}
DURATION_PATTERN = r"^[1-9][0-9]*[mhd]$"
MAX_DEADLINE_S = 366 * 86_400
OPERATORS: tuple[str, ...] = ("lt", "lte", "gt", "gte", "eq")
CONDITIONS: tuple[str, ...] = (
    "currency",
    "network",
    "amount",
    "fromAddress",
    "walletName",
    "profile",
)

Operator = Literal["lt", "lte", "gt", "gte", "eq"]
WalletKey = int | str  # walletId, walletName, or "*"
ANY_WALLET = "*"


class ParamCheck(Protocol):
    """What an action's parameter check may use while one rule file is read."""

    @property
    def profiles(self) -> set[str] | None:
        """The profile names a rule may name; None when any name is accepted."""
        ...

    @property
    def folder(self) -> Path:
        """The rule file's folder (a relative path in the file is relative to it)."""
        ...

    def problem_count(self) -> int:
        """How many problems were found so far (a check compares before and after)."""
        ...

    def bad(self, loc: Loc, message: str, *, label: Loc | None = None) -> None:
        """Record a problem at `loc`, shown as `label` (default: `loc`)."""
        ...

    def unknown_keys(self, value: dict[Any, Any], loc: Loc, allowed: Sequence[str]) -> None:
        """Record a problem for each key of `value` not in `allowed`."""
        ...


# Checks one action's parameters; the checked parameters, or None after recording problems.
ParamChecker = Callable[[ParamCheck, dict[str, Any], Loc], dict[str, Any] | None]


@dataclass(frozen=True)
class ActionSpec:
    """What the rule loader accepts for one action name (the action kinds give these).

    `check` None: the action takes no parameters. `final`: nothing after it in a rule's `then:`
    runs (so nothing may follow it). `only_on`: the triggers it may run on (None: any), with
    `only_on_meaning` saying what they have in common and `only_on_example` a rule's `on:`.
    `params`: the JSON Schema of the parameters `check` accepts (`depositd schema rules`).
    """

    name: str
    check: ParamChecker | None = None
    final: bool = False
    only_on: frozenset[str] | None = None
    only_on_meaning: str = ""
    only_on_example: str = ""
    params: Mapping[str, Any] | None = None


class DepositView(Protocol):
    """The deposit fields conditions read (tracker.Deposit has them all)."""

    @property
    def wallet_id(self) -> int | None: ...
    @property
    def wallet_name(self) -> str | None: ...
    @property
    def currency(self) -> str | None: ...
    @property
    def network(self) -> str | None: ...
    @property
    def amount(self) -> Decimal | None: ...
    @property
    def from_address(self) -> str | None: ...


@dataclass(frozen=True)
class Conditions:
    """Every condition of a rule's `if:`; None means the condition is absent (always holds).

    currency and network compare case-insensitively (they are codes); fromAddress and walletName
    compare exactly, since an address's case can matter.
    """

    currency: frozenset[str] | None = None
    network: frozenset[str] | None = None
    amount: tuple[tuple[Operator, Decimal], ...] = ()
    from_address: frozenset[str] | None = None
    wallet_name: frozenset[str] | None = None
    profile: Literal["found", "missing"] | None = None
    # Record conditions (record triggers only), upper-cased like currency and network.
    status: frozenset[str] | None = None
    address_risk_status: frozenset[str] | None = None
    order_status: frozenset[str] | None = None
    business_type: frozenset[str] | None = None
    kind: frozenset[str] | None = None


@dataclass(frozen=True)
class Action:
    """One entry of a rule's `then:`: the action name and its checked parameters."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """A short human form, e.g. `alert(severity=critical, channels=slack)`; a parameter
        left unset (None: its default, e.g. every configured channel) is not shown."""
        parts = []
        for key, value in self.params.items():
            if value is None:
                continue
            shown = ",".join(value) if isinstance(value, list | tuple) else value
            parts.append(f"{key}={shown}")
        return f"{self.name}({', '.join(parts)})" if parts else self.name


@dataclass(frozen=True)
class Rule:
    """One rule: fires on any of `on`, when every condition holds, running `then` in order."""

    name: str
    on: frozenset[str]
    conditions: Conditions
    actions: tuple[Action, ...]
    line: int = 0


@dataclass(frozen=True)
class RuleSet:
    """The rules of one file, for one wallet key; `version` is a hash of the file's bytes.

    `deadline_s`: how long a deposit of this set may wait on a person before depositd alerts
    again, raised (None: no deadline); `escalate`: the channels that alert goes to (None: those
    of the alert that began the wait).
    """

    name: str
    path: Path
    version: str
    wallet: WalletKey
    rules: tuple[Rule, ...]
    line: int = 1  # of `wallet:` in the file
    deadline_s: int | None = None
    escalate: tuple[str, ...] | None = None
    escalate_line: int = 0  # of `escalate:` in the file (0: not given)
    sha256: str = ""  # of the file's bytes, in full (`worker.rules.fingerprint`)

    def describe_wallet(self) -> str:
        """`wallet 1001`, `wallet 'Main'` or `every wallet without its own file`."""
        if self.wallet == ANY_WALLET:
            return "every wallet without its own file"
        if isinstance(self.wallet, int):
            return f"wallet {self.wallet}"
        return f"wallet {self.wallet!r}"


@dataclass(frozen=True)
class Intent:
    """An action a rule decided on; the outbox records it with the rule set's version."""

    rule_set: str
    version: str
    rule: str
    trigger: str
    action: str
    params: dict[str, Any]


@dataclass(frozen=True)
class RuleVerdict:
    """Why a rule did or did not match one deposit and trigger (for `rules test`)."""

    rule: str
    matched: bool
    reason: str | None
    actions: tuple[Action, ...]
