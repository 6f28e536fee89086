"""Turns tracker transitions into recorded actions, inside the processor's transaction.

Pure decisions come from the rule book; each intent is recorded by its action kind
(`worker.act.kinds`): `book` writes its ledger row here (same transaction as the transition, so
booking is exactly once), every other action becomes an outbox row that `worker.act.outbox`
runs after the commit. A transition that leaves the deposit waiting on a person starts a wait
(`worker.act.waits`), whose deadline the scheduler watches.
"""

from __future__ import annotations

from collections.abc import Callable

from worker.act.kinds import KINDS
from worker.act.kinds.base import Recording
from worker.act.kinds.book import CREDITED_STATES, book_held, known_now
from worker.act.waits import WAIT_TRIGGERS
from worker.act.waits import begin as begin_wait
from worker.config.profiles import Profiles
from worker.logs import LogLine
from worker.rules import RuleBook
from worker.rules.fingerprint import rules_hash
from worker.store.actions import acted_on_event
from worker.store.db import Database
from worker.track.batch import Reaction
from worker.track.tracker import Deposit, Fact, Transition


class RuleReactor:
    """The processor's reactor: rules decide, the action kinds record."""

    def __init__(self, rules: Callable[[], RuleBook], profiles: Callable[[], Profiles]) -> None:
        self._rules = rules
        self._profiles = profiles

    def react(
        self,
        db: Database,
        deposit: Deposit,
        transitions: list[Transition],
        fact: Fact,
        reaction: Reaction,
    ) -> list[LogLine]:
        """Record the actions that the rules pick for each transition (and raw eventType),
        and the booking that waited for what this fact states first (its txHash, amount,
        currency or network: `Reaction.learnt_for_booking`); the lines to log once
        committed."""
        rulebook = self._rules()
        profiles = self._profiles()
        lines: list[LogLine] = []
        match = profiles.for_deposit(deposit.wallet_id, deposit.from_address)
        decided_under = rules_hash(rulebook, profiles)
        todo: list[tuple[str, str]] = [(t.trigger._value_, t.key) for t in transitions]
        if (
            fact.event_type
            and fact.event_id
            and rulebook.names(fact.event_type)
            and not acted_on_event(db, fact.event_id, fact.event_type)
        ):
            # Raw eventType rules run once per stored event: a replay does not repeat them.
            todo.append((fact.event_type, fact.event_type))
        # A rule runs at most once per fact: `on: [credited, completed]` on a deposit that is
        # both at once (or its raw eventType besides) acts once, on the first in causal order.
        ran: set[tuple[str, str]] = set()
        for trigger, key in todo:
            running: set[tuple[str, str]] = set()
            intents = rulebook.evaluate(deposit, trigger, profile_found=match is not None)
            for intent in intents:
                rule = (intent.rule_set, intent.rule)
                if rule in ran:
                    continue
                running.add(rule)
                recording = Recording(
                    db,
                    deposit,
                    key,
                    fact,
                    intent,
                    match,
                    self._profiles,
                    lines,
                    reaction,
                    decided_under,
                )
                if self._record(recording):
                    break  # `ignore`: nothing after it runs
            ran |= running
            if trigger in WAIT_TRIGGERS:
                begin_wait(db, deposit, trigger, intents, match)
        if reaction.learnt_for_booking and deposit.state in CREDITED_STATES:
            done = book_held(
                db,
                deposit,
                known_now(reaction.learnt_for_booking),
                reaction,
                rules_hash=decided_under,
            )
            if done is not None:
                lines.append((done[1], {"transactionId": deposit.transaction_id}))
        return lines

    @staticmethod
    def _record(recording: Recording) -> bool:
        """Record one intent by its kind; True when the kind ends the rule set (`ignore`)."""
        kind = KINDS.get(recording.intent.action)
        if kind is None:
            raise ValueError(f"unknown action {recording.intent.action!r}")
        kind.record(recording)
        return kind.spec.final
