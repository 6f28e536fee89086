"""Turns tracker transitions into recorded actions, inside the processor's transaction.

Pure decisions come from the rule book; this module only writes their rows: `book` writes its
ledger row here (same transaction as the transition, so booking is exactly once), every other
action becomes an outbox row that `worker.act.outbox` runs after the commit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import sqlite_utils

from worker.clock import utc_now
from worker.config.profiles import Profiles
from worker.logs import LogLine
from worker.rules import Intent, RuleBook
from worker.track.conflicts import WIRE_NAMES, as_text, open_conflicts
from worker.track.tracker import Deposit, Fact, State, Transition

# The states in which the deposit is credited at this moment: credited, or completed (an order
# at SUCCESS is credited, whitelisted or not). Booking happens in no other.
CREDITED_STATES = frozenset({State.CREDITED, State.COMPLETED})


def submit_key(transaction_id: str, content_hash: str) -> str:
    """Idempotency-Key of a submission: stable for one profile content, new after a change."""
    return hashlib.sha256(f"{transaction_id}:{content_hash}".encode()).hexdigest()[:40]


def submit_params(
    deposit: Deposit, profile: str, content_hash: str, *, named: bool
) -> dict[str, Any]:
    """The params of a submit_profile action.

    `after_ms` is the provider's time of the whitelist status the submission answers: once the
    provider accepts it, the tracker takes "pending" as observed just after that, never at this
    machine's clock, which the provider's own timestamps must not be compared with (a review
    finished within the call, or a clock that is off, would otherwise lose a rejection).
    """
    return {
        "profile": profile,
        "content_hash": content_hash,
        "named": named,
        "after_ms": deposit.white_list_time(),
    }


def add_action(
    db: sqlite_utils.Database,
    *,
    deposit: Deposit | None,
    action: str,
    params: dict[str, Any],
    trigger: str,
    event_id: str | None = None,
    intent: Intent | None = None,
    status: str = "pending",
    outcome: str | None = None,
    idempotency_key: str | None = None,
) -> int:
    """Insert one action (outbox) row; returns its id."""
    now = utc_now()
    cur = db.execute(
        "INSERT INTO actions (transaction_id, event_id, trigger, rule_set, rule_set_version, rule,"
        " action, params, idempotency_key, status, attempts, next_attempt_at, outcome,"
        " created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,0,?,?,?,?)",
        [
            deposit.transaction_id if deposit else None,
            event_id,
            trigger,
            intent.rule_set if intent else None,
            intent.version if intent else None,
            intent.rule if intent else None,
            action,
            json.dumps(params, sort_keys=True),
            idempotency_key,
            status,
            now,
            outcome,
            now,
            now,
        ],
    )
    return int(cur.lastrowid or 0)


def book(db: sqlite_utils.Database, deposit: Deposit, trigger: str) -> bool:
    """Write the ledger row for a deposit once; False when it was already booked."""
    cur = db.execute(
        "INSERT OR IGNORE INTO ledger (transaction_id, wallet_id, wallet_name, currency, network,"
        " amount, from_address, tx_hash, booked_at, trigger) VALUES (?,?,?,?,?,?,?,?,?,?)",
        [
            deposit.transaction_id,
            deposit.wallet_id,
            deposit.wallet_name,
            deposit.currency,
            deposit.network,
            deposit.as_json()["amount"],
            deposit.from_address,
            deposit.tx_hash,
            utc_now(),
            trigger,
        ],
    )
    return cur.rowcount == 1


def book_checked(db: sqlite_utils.Database, deposit: Deposit, trigger: str) -> tuple[str, str]:
    """Book the deposit if it may be booked now; the book action's (status, outcome).

    Whatever trigger a rule names, a deposit is booked only while credited, never while a fixed
    field is in conflict (`worker.track.conflicts`), and never when its txHash is already booked
    under another transactionId (that one alerts, critical).
    """
    tx = deposit.transaction_id
    if db.execute("SELECT 1 FROM ledger WHERE transaction_id=?", [tx]).fetchone() is not None:
        return "done", "already booked"
    if deposit.state not in CREDITED_STATES:
        return "skipped", f"not booked: the deposit is {deposit.state.value}, not credited"
    held = open_conflicts(db, tx)
    if held:
        names = ", ".join(sorted({WIRE_NAMES[c["field"]] for c in held}))
        return "skipped", f"held: {names} in conflict; waiting for a decision (depositd resolve)"
    if deposit.tx_hash:
        other = db.execute(
            "SELECT transaction_id FROM ledger WHERE tx_hash=? AND transaction_id<>? LIMIT 1",
            [deposit.tx_hash, tx],
        ).fetchone()
        if other is not None:
            detail = (
                f"txHash {deposit.tx_hash} is already booked for {other[0]}; "
                f"{tx} is not booked (a deposit booked twice?)"
            )
            enqueue_alert(
                db, deposit, "duplicate_tx_hash", "critical", trigger=trigger, detail=detail
            )
            return "skipped", f"refused: txHash already booked for {other[0]}"
    booked = book(db, deposit, trigger)
    return "done", "booked" if booked else "already booked"


def add_submission(
    db: sqlite_utils.Database,
    deposit: Deposit,
    profile: str,
    content_hash: str,
    *,
    named: bool,
    trigger: str,
    event_id: str | None = None,
    intent: Intent | None = None,
) -> int:
    """Queue one submit_profile row for `profile`'s content, under that content's
    Idempotency-Key; returns its id."""
    return add_action(
        db,
        deposit=deposit,
        action="submit_profile",
        params=submit_params(deposit, profile, content_hash, named=named),
        trigger=trigger,
        event_id=event_id,
        intent=intent,
        idempotency_key=submit_key(deposit.transaction_id, content_hash),
    )


def enqueue_alert(
    db: sqlite_utils.Database,
    deposit: Deposit | None,
    condition: str,
    severity: str,
    *,
    trigger: str,
    detail: str | None = None,
    channels: Sequence[str] | None = None,
    intent: Intent | None = None,
    profile: str | None = None,
    once_per: str | None = None,
    event_id: str | None = None,
) -> int:
    """Queue an alert; the runner sends it once per (deposit, condition, channel), or per
    (deposit, condition, once_per, channel) when `once_per` names what one alert is about (one
    submission, one rule)."""
    params: dict[str, Any] = {
        "condition": condition,
        "severity": severity,
        "channels": list(channels) if channels else None,
        "detail": detail,
        "profile": profile,
    }
    if once_per is not None:
        params["once_per"] = once_per
    return add_action(
        db,
        deposit=deposit,
        action="alert",
        params=params,
        trigger=trigger,
        intent=intent,
        event_id=event_id,
    )


def alert_conflict(db: sqlite_utils.Database, deposit: Deposit, fact: Fact, name: str) -> None:
    """Queue the critical alert of a fixed field in conflict (once per deposit and field)."""
    where = f"{fact.source} event {fact.event_id}" if fact.event_id else f"{fact.source} fact"
    detail = (
        f"{WIRE_NAMES[name]} was {as_text(getattr(deposit, name))}, the {where} says "
        f"{as_text(getattr(fact, name))}; booking is held until a decision: "
        f"depositd resolve {deposit.transaction_id} --set {WIRE_NAMES[name]}=VALUE --by NAME"
    )
    enqueue_alert(
        db,
        deposit,
        "fixed_field_conflict",
        "critical",
        trigger="conflict",
        detail=detail,
        once_per=name,
        event_id=fact.event_id,
    )


def _alert_detail(intent: Intent, deposit: Deposit, trigger: str) -> str | None:
    """The rule's message, and the provider's failMessage for a rejection."""
    parts = [str(intent.params["message"])] if intent.params.get("message") else []
    if trigger.startswith("rejected") and deposit.fail_message:
        parts.append(f"failMessage: {deposit.fail_message}")
    return "; ".join(parts) or None


def key_used(db: sqlite_utils.Database, transaction_id: str, key: str) -> bool:
    """Was a submission with this Idempotency-Key (this exact payload) already queued?"""
    row = db.execute(
        "SELECT 1 FROM actions WHERE transaction_id=? AND action='submit_profile'"
        " AND idempotency_key=? LIMIT 1",
        [transaction_id, key],
    ).fetchone()
    return row is not None


def _acted_on(db: sqlite_utils.Database, event_id: str, event_type: str) -> bool:
    """True when rules already ran on this stored event's raw eventType (a replay)."""
    row = db.execute(
        "SELECT 1 FROM actions WHERE event_id=? AND trigger=? LIMIT 1", [event_id, event_type]
    ).fetchone()
    return row is not None


class RuleReactor:
    """The processor's reactor: rules decide, rows record."""

    def __init__(self, rules: Callable[[], RuleBook], profiles: Callable[[], Profiles]) -> None:
        self._rules = rules
        self._profiles = profiles

    def react(
        self,
        db: sqlite_utils.Database,
        deposit: Deposit,
        transitions: list[Transition],
        fact: Fact,
    ) -> list[LogLine]:
        """Record the actions that the rules pick for each transition (and raw eventType);
        the lines to log once committed."""
        rulebook = self._rules()
        lines: list[LogLine] = []
        match = self._profiles().for_deposit(deposit.wallet_id, deposit.from_address)
        todo: list[tuple[str, str]] = [(t.trigger.value, t.key) for t in transitions]
        if fact.event_type and fact.event_id and not _acted_on(db, fact.event_id, fact.event_type):
            # Raw eventType rules run once per stored event: a replay does not repeat them.
            todo.append((fact.event_type, fact.event_type))
        # A rule runs at most once per fact: `on: [credited, completed]` on a deposit that is
        # both at once (or its raw eventType besides) acts once, on the first in causal order.
        ran: set[tuple[str, str]] = set()
        for trigger, key in todo:
            running: set[tuple[str, str]] = set()
            for intent in rulebook.evaluate(deposit, trigger, profile_found=match is not None):
                rule = (intent.rule_set, intent.rule)
                if rule in ran:
                    continue
                running.add(rule)
                if intent.action == "ignore":
                    add_action(
                        db,
                        deposit=deposit,
                        action="ignore",
                        params={},
                        trigger=key,
                        event_id=fact.event_id,
                        intent=intent,
                        status="done",
                        outcome="ignored by rule",
                    )
                    break
                self._record(db, deposit, key, fact, intent, match, lines)
            ran |= running
        return lines

    def _record(
        self,
        db: sqlite_utils.Database,
        deposit: Deposit,
        trigger: str,
        fact: Fact,
        intent: Intent,
        match: Any,
        lines: list[LogLine],
    ) -> None:
        common: dict[str, Any] = {
            "deposit": deposit,
            "trigger": trigger,
            "event_id": fact.event_id,
            "intent": intent,
        }
        if intent.action == "book":
            status, outcome = book_checked(db, deposit, trigger.split("#")[0])
            add_action(db, action="book", params={}, status=status, outcome=outcome, **common)
            fields = {
                "transactionId": deposit.transaction_id,
                "amount": deposit.as_json()["amount"],
                "currency": deposit.currency,
            }
            if status == "done":
                lines.append((outcome, fields))
            else:
                lines.append(("book " + status, {**fields, "outcome": outcome}))
        elif intent.action == "submit_profile":
            if match is None and not intent.params.get("profile"):
                add_action(
                    db,
                    action="submit_profile",
                    params={},
                    status="skipped",
                    outcome="no profile applies",
                    **common,
                )
                return
            profiles = self._profiles()
            named = intent.params.get("profile")
            name = str(named) if named else match.name
            content = profiles.content_hash(name)
            key = submit_key(deposit.transaction_id, content)
            if key_used(db, deposit.transaction_id, key):
                # The provider has this very payload already (a rejection is never answered
                # with the same details): wait for a changed profile instead.
                add_action(
                    db,
                    action="submit_profile",
                    params=submit_params(deposit, name, content, named=bool(named)),
                    status="skipped",
                    outcome="identical payload already submitted; waiting for a changed profile",
                    **common,
                )
                return
            add_submission(
                db,
                deposit,
                name,
                content,
                named=bool(named),
                trigger=trigger,
                event_id=fact.event_id,
                intent=intent,
            )
        elif intent.action == "alert":
            # One alert per rule and trigger (every matching rule runs); a raw eventType rule
            # alerts per stored event (a second rejection is news), a replay of it does not.
            once_per = f"{intent.rule_set}:{intent.rule}"
            if trigger == fact.event_type:
                once_per += f":{fact.event_id}"
            enqueue_alert(
                db,
                deposit,
                trigger,
                str(intent.params.get("severity", "warning")),
                trigger=trigger,
                detail=_alert_detail(intent, deposit, trigger),
                channels=intent.params.get("channels"),
                intent=intent,
                profile=match.name if match is not None else None,
                once_per=once_per,
                event_id=fact.event_id,
            )
        elif intent.action == "forward":
            # The deposit as of this transition: every retry posts the same body.
            params = {**intent.params, "deposit": deposit.as_json()}
            add_action(db, action="forward", params=params, **common)
        else:
            raise ValueError(f"unknown action {intent.action!r}")
