"""`depositd rules test EVENT.json` / `rules test --event EVENT_ID`: a dry run, touching nothing.

Builds the deposit as the tracker would see it (the stored row, if any, plus the event's fact),
then shows every trigger the fact causes, every rule of the applying rule set with why it
matched or not, and the actions that would run. The database is opened read-only; profiles are
named, never shown.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from worker.clock import now_ms
from worker.commands.orders import explain_order
from worker.config.profiles import Profiles
from worker.config.settings import load_settings
from worker.config.shipped import example_events
from worker.errors import ConfigError
from worker.provider import jsonio
from worker.provider.models import DEPOSIT_EVENT_TYPES, DepositOrder, WebhookEnvelope
from worker.rules.engine import RuleBook
from worker.service.bundle import load_bundle
from worker.store.db import Connection
from worker.store.deposits import get_deposit_row
from worker.store.errors import StoreError
from worker.store.events import stored_body
from worker.store.facts import fact_history
from worker.store.pgstore import command_connection
from worker.store.sqlite import connect
from worker.track.facts import fact_from_event, fact_from_order
from worker.track.tracker import Deposit, Fact, observe

Out = Callable[[str], None]


class _Usage(Exception):
    """A bad event file or id: printed, exit 2."""


def _errors(exc: ValidationError) -> str:
    # Without input values: an event carries payer-adjacent data.
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
        for err in exc.errors(include_input=False, include_url=False)
    )


def _open_ro(path: Path) -> Connection | None:
    """The store read-only, or None when there is no database file yet (never creates one)."""
    if not path.is_file():
        return None
    # No writer is attached (the WAL is checkpointed away): read the file as immutable, since
    # a read-only WAL reader would otherwise leave new -wal/-shm files behind.
    immutable = not path.with_name(path.name + "-wal").exists()
    return connect(path, readonly=True, immutable=immutable)


def _read_file(path: Path) -> Any:
    try:
        return jsonio.loads(path.read_bytes())
    except OSError as exc:
        raise _Usage(f"{path}: cannot read event: {exc.strerror}") from None
    except ValueError as exc:
        raise _Usage(f"{path}: not JSON: {exc}") from None


def _event_path(given: str) -> Path:
    """The file given, or the shipped example event of that name (`rules test credited`)."""
    path = Path(given)
    if path.exists() or os.sep in given:
        return path
    examples = example_events()
    example = examples.get(path.name.removesuffix(".json"))
    if example is None:
        names = ", ".join(examples) or "none found"
        raise _Usage(f"{given}: no such file, nor an example event of that name ({names})")
    return example


def _read_stored(conn: Connection | None, db_path: Path | str, event_id: str) -> Any:
    if conn is None:
        raise _Usage(f"{db_path}: no database here (storage.path); nothing is stored yet")
    try:
        body = stored_body(conn, event_id)
    except StoreError as exc:
        raise _Usage(f"{db_path}: cannot read events: {exc}") from None
    if body is None:
        raise _Usage(f"{db_path}: no stored event with eventId {event_id!r}")
    return jsonio.loads(body)


def _fact(data: Any, source: str) -> tuple[Fact | None, str]:
    """The fact of an event envelope (or of a deposit order, as a poll sees it), and a title."""
    if not isinstance(data, dict):
        raise _Usage(f"{source}: an event must be a JSON object")
    try:
        if "eventType" in data or "eventId" in data:
            env = WebhookEnvelope.model_validate(data)
            title = f"event {env.eventId} ({env.eventType})"
            if env.eventType not in DEPOSIT_EVENT_TYPES:
                return None, title
            return fact_from_event(env), title
        order = DepositOrder.model_validate(data)
        return fact_from_order(
            order, sent_at=now_ms()
        ), f"deposit order {order.transactionId} (as a poll)"
    except ValidationError as exc:
        raise _Usage(f"{source}: not a webhook event or deposit order: {_errors(exc)}") from None


def _stored_deposit(conn: Connection | None, transaction_id: str) -> Deposit | None:
    if conn is None:
        return None
    try:
        row = get_deposit_row(conn, transaction_id)
    except StoreError:
        return None  # a database without the table yet: the deposit is new
    return None if row is None else Deposit.from_row(row)


def _deposit_before(conn: Connection | None, transaction_id: str, event_id: str) -> Deposit | None:
    """The deposit as it was when a stored event arrived: its recorded facts folded up to that
    event's own (the current row already holds what the event changed). Facts that changed
    nothing, which retention may have dropped, change nothing in the fold either."""
    if conn is None:
        return None
    try:
        rows = fact_history(conn, transaction_id)
    except StoreError:
        return None
    if event_id not in {row["event_id"] for row in rows}:
        return _stored_deposit(conn, transaction_id)  # not applied yet (pending, failed)
    deposit: Deposit | None = None
    for row in rows:
        if row["event_id"] == event_id:
            break
        fact = Fact.from_json(jsonio.loads(row["fact"]), observed_at=row["observed_at"])
        deposit, _ = observe(deposit, fact)
    return deposit


def _show_deposit(
    out: Out, before: Deposit | None, after: Deposit, now: Deposit | None = None
) -> None:
    """The deposit and the state the fact moves it between; `now`: the tracked deposit today,
    for a stored event (whose `before` is the deposit as that event found it)."""
    amount = after.as_json()["amount"] or "?"
    name = f" ({after.wallet_name})" if after.wallet_name else ""
    out(f"deposit {after.transaction_id}: wallet {after.wallet_id}{name}")
    out(f"  {amount} {after.currency or '?'} on {after.network or '?'}")
    out(f"  from {after.from_address or '(unknown address)'}")
    if before is not None:
        was = before.state.value
    elif now is not None:
        was = "(first seen in this event)"
    else:
        was = "(not tracked yet)"
    tracked = f"; tracked now: {now.state.value}" if now is not None else ""
    out(f"  state: {was} -> {after.state.value}{tracked}")


def explain_fact(
    out: Out,
    rules: RuleBook,
    profiles: Profiles,
    before: Deposit | None,
    fact: Fact,
    now: Deposit | None = None,
) -> int:
    """Print the tracker's view of the fact and what the rules would do; returns actions count.
    `now`: the deposit as tracked today, when the fact is a stored event's."""
    after, transitions = observe(before, fact)
    _show_deposit(out, before, after, now)
    match = profiles.for_deposit(after.wallet_id, after.from_address)
    if match is None:
        out("profile: none applies (profile: missing)")
    else:
        out(f"profile: {match.name} (via {match.via}; profile: found)")
    triggers = [t.trigger.value for t in transitions]
    out(f"transitions: {', '.join(t.key for t in transitions) or 'none'}")
    if fact.event_type:
        triggers.append(fact.event_type)
    ruleset = rules.ruleset_for(after.wallet_id, after.wallet_name)
    if ruleset is None:
        out(f"rule set: none applies to wallet {after.wallet_id}; nothing would run")
        return 0
    out(f"rule set: {ruleset.path} (version {ruleset.version}, {ruleset.describe_wallet()})")
    total = 0
    for trigger in triggers:
        out("")
        if trigger == fact.event_type and not any(trigger in r.on for r in ruleset.rules):
            out(f"on {trigger}: no rule names this eventType")
            continue
        out(f"on {trigger}:")
        for verdict in rules.explain(after, trigger, profile_found=match is not None):
            actions = ", ".join(a.describe() for a in verdict.actions)
            if verdict.matched:
                out(f"  [match] {verdict.rule} -> {actions}")
            else:
                out(f"  [ no  ] {verdict.rule}: {verdict.reason}")
        intents = rules.evaluate(after, trigger, profile_found=match is not None)
        for intent in intents:
            profile = ""
            if intent.action == "submit_profile":
                name = intent.params.get("profile") or (match.name if match else None)
                profile = f" profile {name}" if name else " (no profile applies: skipped)"
            # Unset parameters (None: the default, e.g. every configured channel) are left out.
            params = {k: v for k, v in intent.params.items() if k != "profile" and v is not None}
            shown = f" {jsonio.dumps(params)}" if params else ""
            out(f"  would run: {intent.action}{profile}{shown} (rule {intent.rule!r})")
        if not intents:
            out("  would run: nothing")
        total += len(intents)
    if not triggers:
        out("no trigger: this fact changes nothing the rules react to")
    return total


def run(args: argparse.Namespace, out: Out = print) -> int:
    """`rules test`: exit 0 after the report, 2 on a bad config, event file or event id."""
    try:
        settings = load_settings(args.config)
        bundle = load_bundle(settings)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 2
    db_path = settings.storage.where
    conn: Connection | None = (
        command_connection(settings.storage)
        if settings.storage.url is not None
        else _open_ro(settings.storage.file)
    )
    try:
        if getattr(args, "event", None):
            data, source = _read_stored(conn, db_path, args.event), f"event {args.event}"
        elif getattr(args, "event_file", None):
            path = _event_path(args.event_file)
            data, source = _read_file(path), str(path)
        else:
            raise _Usage("give EVENT.json or --event EVENT_ID")
        fact, title = _fact(data, source)
        out(title)
        if fact is None:
            if explain_order(out, bundle.rules, data):
                out("")
                out("dry run: nothing was sent, stored or changed")
                return 0
            out("not a deposit event: deposit rules do not run for it")
            return 0
        now = None
        if getattr(args, "event", None):
            before = _deposit_before(conn, fact.transaction_id, args.event)
            now = _stored_deposit(conn, fact.transaction_id)
        else:
            before = _stored_deposit(conn, fact.transaction_id)
        explain_fact(out, bundle.rules, bundle.profiles, before, fact, now)
        out("")
        out("dry run: nothing was sent, stored or changed")
        return 0
    except _Usage as exc:
        print(f"depositd rules test: {exc}", file=sys.stderr)
        return 2
    finally:
        if conn is not None:
            conn.close()
