"""What an action kind is: its rule parameters, what it records, what it runs, what `check` says.

Each kind is one module in `worker.act.kinds` building a `Kind`, registered in
`worker.act.kinds.KINDS`. The rule loader reads `Kind.spec` (as data: the rules package does not
import this one), `worker.act.reactor` calls `record` inside the processor's transaction,
`worker.act.outbox` calls the runner built by `runner` after the commit, and
`worker.commands.check` reads `secret_problem`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from worker.act.queue import ActionRows, add_action
from worker.config.profiles import ProfileMatch, Profiles
from worker.logs import LogLine
from worker.notify.channels import Notifier
from worker.provider.client import ProviderClient
from worker.rules import ActionSpec, Intent, RuleBook
from worker.store.db import Database
from worker.store.sqlitestore import Store
from worker.track.batch import Reaction
from worker.track.tracker import Deposit, Fact

Observe = Callable[[Fact], Awaitable[Any]]


@dataclass
class Recording:
    """One intent being recorded by the reactor, inside the processor's transaction."""

    db: Database
    deposit: Deposit
    trigger: str
    fact: Fact
    intent: Intent
    match: ProfileMatch | None
    profiles: Callable[[], Profiles]
    lines: list[LogLine]  # what to log once committed
    reaction: Reaction = field(default_factory=Reaction)  # the batch's bookings and the like
    rules_hash: str | None = None  # of the rules and profiles deciding (`worker.rules.fingerprint`)

    def add(self, *, params: dict[str, Any], **fields: Any) -> None:
        """Add this intent's action row (status, outcome and key as `fields` say); its id is
        not read (not waited for on PostgreSQL)."""
        add_action(
            self.db,
            deposit=self.deposit,
            action=self.intent.action,
            params=params,
            trigger=self.trigger,
            event_id=self.fact.event_id,
            intent=self.intent,
            want_id=False,
            **fields,
        )


@dataclass(frozen=True)
class RunnerDeps:
    """What the outbox gives the kinds' runners."""

    store: Store
    rows: ActionRows
    client: ProviderClient
    notifiers: Mapping[str, Notifier]
    profiles: Callable[[], Profiles]
    observe: Observe
    notify_retry: Mapping[str, Any] | None
    on_alert: Callable[[str, str], None] | None
    rules: Callable[[], RuleBook] = RuleBook.empty  # the rules in force (order_updated rows)


class Runner(Protocol):
    """Runs one kind's rows after their commit, recording outcomes in `ActionRows`."""

    async def run(
        self,
        action_id: int,
        row: dict[str, Any],
        deposit: Deposit | None,
        params: dict[str, Any],
        attempts: int,
    ) -> None:
        """Run one row (marked running, `attempts` counting this one)."""
        ...

    async def close(self) -> None:
        """Release what the runner holds (an HTTP session)."""
        ...


@dataclass(frozen=True)
class Kind:
    """One action kind.

    `record`: what the reactor records for a rule's intent, inside the transaction.
    `runner`: builds what the outbox runs after the commit (None: nothing runs after it).
    `secret_problem`: why an action's secret is not usable now, for `check`.
    Where an action posts and the alert channels it names are read from its params without the
    kind (`worker.act.specs.URLS`, `NAMED_CHANNELS`): the rules are checked before it is imported.
    """

    spec: ActionSpec
    record: Callable[[Recording], None]
    runner: Callable[[RunnerDeps], Runner] | None = None
    secret_problem: Callable[[Mapping[str, Any]], str | None] | None = None

    @property
    def name(self) -> str:
        """The action's name in rules and rows."""
        return self.spec.name
