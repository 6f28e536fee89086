"""The approve path: an operator submits a stored profile for a deposit held for a person.

`depositd submit TX --profile NAME --by WHO` and the console's deposit page both call
`approve` inside one write transaction. It queues the same submit_profile row a rule's
`submit_profile: {profile: NAME}` queues (the outbox runs it: validation, Idempotency-Key,
outcome codes and alerts are the rule action's, `worker.act.kinds.submit`) and records the
operator's action in `operator_actions` in the same transaction: never a submission without its
record, nor a record without its submission. A second request for the same profile content
queues nothing and reports the first (its Idempotency-Key is the same). Payer data is never
part of an answer: the profile is named, its fields are named, their values never.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from worker.act.queue import add_submission, submit_key
from worker.config.profiles import Profiles
from worker.config.yamlkeys import known, suggest
from worker.provider.payer import PayerValidationError, validate_payer
from worker.store import actions as stored
from worker.store import operator as operator_store
from worker.store.db import Db
from worker.store.deposits import get_deposit_row, lock_deposit
from worker.track.tracker import Deposit, State

# The states in which the provider takes payer details for a deposit (whiteListStatus init or
# rejected): the deposits a rule can hold for a person.
WAITING = (State.NEEDS_DETAILS.value, State.REJECTED.value)
# The trigger recorded on the submission row and the kind recorded in operator_actions.
TRIGGER = "operator"
KIND = "submit_profile"

Verdict = Literal[
    "queued", "already", "unknown_deposit", "unknown_profile", "unfit", "identical", "not_waiting"
]


@dataclass(frozen=True)
class Approval:
    """What `approve` did: `queued` (a new submission, `action_id`), `already` (the same
    payload was queued before: `action_id` is that first row), or why nothing was queued."""

    verdict: Verdict
    message: str
    action_id: int | None = None
    first: dict[str, Any] | None = None

    @property
    def queued(self) -> bool:
        """A submission exists for the request (new or the first one)."""
        return self.verdict in ("queued", "already")


def operator_name(raw: str) -> str:
    """A name as recorded with an operator's action: printable characters only (no line break
    or terminal escape reaches a log line or a record), at most 40; empty when none is left."""
    return "".join(c for c in raw if c.isprintable()).strip()[:40]


def unfit_fields(profiles: Profiles, name: str) -> list[str]:
    """The fields of a profile that break the payer-details rules for a submission (a
    correspondentType's fields missing or of the other type, a value not accepted), named
    without their values; empty when the profile may be submitted."""
    try:
        validate_payer(profiles.body(name), form="submit")
    except PayerValidationError as exc:
        return list(dict.fromkeys(exc.fields))
    return []


def approve(
    db: Db,
    transaction_id: str,
    profile: str,
    profiles: Profiles,
    *,
    note: str,
    remote: str,
) -> Approval:
    """Queue a submission of `profile` for the deposit (in the caller's write transaction) and
    record it as an operator action (`remote`: who, and from where), or say why not. A refusal
    is recorded too, except for an unknown deposit (nothing to record it against)."""
    lock_deposit(db, transaction_id)
    row = get_deposit_row(db, transaction_id)
    if row is None:
        return Approval("unknown_deposit", f"no tracked deposit {transaction_id}")
    approval = _decide(db, Deposit.from_row(row), profile, profiles)
    operator_store.record(
        db, KIND, transaction_id, note=note, outcome=approval.message, remote=remote
    )
    return approval


def _decide(db: Db, deposit: Deposit, profile: str, profiles: Profiles) -> Approval:
    tx = deposit.transaction_id
    names = sorted(profiles.names())
    if profile not in names:
        hint = suggest(profile, names)
        return Approval(
            "unknown_profile", f"unknown profile {profile!r} {known(names or ['none'])}{hint}"
        )
    unfit = unfit_fields(profiles, profile)
    if unfit:
        return Approval(
            "unfit",
            f"refused: profile {profile} does not fit a submission for this deposit; fix"
            f" {', '.join(unfit)}",
        )
    content = profiles.content_hash(profile)
    key = submit_key(tx, content)
    first = stored.submission_with_key(db, tx, key)
    if first is not None:
        return _already(deposit, profile, first)
    state = deposit.state.value
    if state not in WAITING:
        return Approval(
            "not_waiting",
            f"refused: {tx} is {state}, not waiting for payer details (needs_details or"
            " rejected); nothing submitted",
        )
    running = stored.open_submission(db, tx)
    if running is not None:
        return Approval(
            "not_waiting",
            f"refused: submission #{running['id']} for {tx} is {running['status']} already;"
            " nothing submitted",
        )
    action_id = add_submission(db, deposit, profile, content, named=True, trigger=TRIGGER)
    return Approval("queued", f"queued submission #{action_id} of profile {profile}", action_id)


def _already(deposit: Deposit, profile: str, first: dict[str, Any]) -> Approval:
    """The same payload (same Idempotency-Key) was queued before: nothing new. A failed one is
    refused (it runs again with its key through a retry, not a second row); a rejected deposit
    waits for a corrected profile: the provider is never sent a payload twice."""
    action_id = int(first["id"])
    what = f"submission #{action_id} ({first['status']}: {first.get('outcome') or 'queued'})"
    if first["status"] == "failed":
        return Approval(
            "identical",
            f"refused: {what} had this very payload; correct the profile first, or run that"
            " submission again with its key (`depositd retry-failed`, or Retry on its row)",
            action_id,
            first,
        )
    if deposit.state is State.REJECTED:
        return Approval(
            "identical",
            f"refused: profile {profile} as it is now was submitted already, {what}, and the"
            " deposit was rejected since; correct the profile first (the same payload is never"
            " sent twice)",
            action_id,
            first,
        )
    return Approval(
        "already", f"submitted already: {what}; nothing new submitted", action_id, first
    )
