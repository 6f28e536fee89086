"""What a rule set compiles to: immutable values the engine evaluates without any I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, Protocol

# The tracker's transition triggers (SPEC section 7); tests check they equal tracker.Trigger.
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
# Triggers about orders (stable, collection, wallet transfer), which belong to no wallet's
# deposit: seen only by the "*" rule set (worker.rules.orders).
ORDER_TRIGGERS: tuple[str, ...] = ("order_updated",)
KNOWN_TRIGGERS: tuple[str, ...] = TRIGGERS + EVENT_TYPES + ORDER_TRIGGERS

ACTIONS: tuple[str, ...] = ("submit_profile", "book", "alert", "forward", "ignore")
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
CHANNELS: tuple[str, ...] = ("slack", "email")
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
    # Order conditions (order_updated only), upper-cased like currency and network.
    order_status: frozenset[str] | None = None
    business_type: frozenset[str] | None = None
    kind: frozenset[str] | None = None


@dataclass(frozen=True)
class Action:
    """One entry of a rule's `then:`: the action name and its checked parameters."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """A short human form, e.g. `alert(severity=critical, channels=slack)`."""
        if not self.params:
            return self.name
        parts = []
        for key, value in self.params.items():
            shown = ",".join(value) if isinstance(value, list | tuple) else value
            parts.append(f"{key}={shown}")
        return f"{self.name}({', '.join(parts)})"


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
    """The rules of one file, for one wallet key; `version` is a hash of the file's bytes."""

    name: str
    path: Path
    version: str
    wallet: WalletKey
    rules: tuple[Rule, ...]

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
