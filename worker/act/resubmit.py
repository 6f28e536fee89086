"""Submissions queued when profiles change, not by a transition: at start and after a reload.

`resubmit_changed` queues a new submission once a rejected or refused deposit's profile changes;
`submit_newly_covered` once a profile covers a deposit that none covered when it arrived.
"""

from __future__ import annotations

import json

from worker.act.queue import add_submission, key_used, submit_key
from worker.config.profiles import Profiles
from worker.rules import RuleBook
from worker.store import actions as stored
from worker.store.db import Database
from worker.track.tracker import Deposit


def resubmit_changed(db: Database, profiles: Profiles) -> int:
    """Queue a new submission for rejected or refused deposits whose profile has changed.

    Runs in one transaction at start and after a profiles reload. A rejected deposit is never
    resubmitted with the payload it was rejected with.
    """
    queued = 0
    # Rejected deposits, and deposits whose submission the provider refused (10000102/10000103,
    # so still waiting for details): both wait for a corrected profile.
    for row in stored.deposits_to_resubmit(db):
        deposit = Deposit.from_row(row)
        last = stored.last_submission_params(db, deposit.transaction_id)
        if last is None:
            continue  # depositd never submitted it (a human did): its rules decide, not a reload
        previous = json.loads(last)
        named = bool(previous.get("named")) and previous.get("profile") in profiles.names()
        match = profiles.for_deposit(deposit.wallet_id, deposit.from_address)
        if named:
            name = str(previous["profile"])
        elif match is not None:
            name = match.name
        else:
            continue
        content = profiles.content_hash(name)
        if key_used(db, deposit.transaction_id, submit_key(deposit.transaction_id, content)):
            continue
        add_submission(db, deposit, name, content, named=named, trigger="profile_changed")
        queued += 1
    return queued


def submit_newly_covered(db: Database, profiles: Profiles, rules: RuleBook) -> int:
    """Queue a submission for deposits still waiting for payer details that depositd never
    submitted, now that a profile applies and their rules submit on `needs_details` (a profile
    added after the "payer details needed" alert). Runs with `resubmit_changed`."""
    queued = 0
    for row in stored.deposits_never_submitted(db):
        deposit = Deposit.from_row(row)
        match = profiles.for_deposit(deposit.wallet_id, deposit.from_address)
        if match is None:
            continue
        intent = next(
            (
                i
                for i in rules.evaluate(deposit, "needs_details", profile_found=True)
                if i.action == "submit_profile"  # evaluate stops at an `ignore`
            ),
            None,
        )
        if intent is None:
            continue
        named = intent.params.get("profile")
        name = str(named) if named else match.name
        if name not in profiles.names():
            continue
        add_submission(
            db,
            deposit,
            name,
            profiles.content_hash(name),
            named=bool(named),
            trigger="profile_added",
            intent=intent,
        )
        queued += 1
    return queued
