"""Deposits waiting on a person: when a wait starts, and the one alert past its deadline
(docs/rules.md, "Deadlines").

`begin` runs in the reactor, inside the processor's transaction: a transition to needs_details
that no submission answers, a rejection, a BLOCKED deposit each start a wait, announced by the
rules' alerts for that trigger (their severity and channels are kept with it). A booking held
for a decision starts one where it is held (`worker.track.conflicts`).

`check_deadlines` is the scheduler's job (`worker.schedule.deadlines`): it ends the waits that are
over and, for each wait past the deadline of its deposit's rule set and still waiting, queues
one alert, its severity raised one step (critical stays critical, its title says overdue), to
the set's `escalate:` channels, else to those of the alert that began the wait. It reads the
open waits only (`worker.store.waits`), never every deposit, and writes nothing when nothing is
due.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from worker import clock
from worker.config.profiles import ProfileMatch
from worker.logs import get_logger
from worker.rules import Intent, RuleBook
from worker.rules.model import SEVERITIES
from worker.store import waits
from worker.store.actions import queue_alert
from worker.store.db import Db
from worker.store.deposits import lock_deposit
from worker.store.sqlitestore import Store
from worker.track.tracker import Deposit, State

log = get_logger(__name__)

# The triggers that start a wait, each in the state of the same name.
WAIT_TRIGGERS = frozenset({State.NEEDS_DETAILS.value, State.REJECTED.value, State.BLOCKED.value})
# What each wait is for, as the alert past the deadline says it.
WAITS_ON = {
    "needs_details": "payer details (no stored profile applies, or no rule submits the one that"
    " does)",
    "rejected": "corrected payer details (the provider rejected those sent)",
    "blocked": "provider support (the deposit is BLOCKED)",
    "held": "a decision on its held booking (depositd resolve)",
}
# The trigger of the alert rows this module queues.
TRIGGER = "deadline"
# Waits ended or alerted per write transaction (a backlog, e.g. a deadline just added, is
# worked off in several).
BATCH = 200


def raised(severity: str) -> str:
    """One step up: info -> warning -> critical; critical stays critical."""
    index = SEVERITIES.index(severity) if severity in SEVERITIES else 1
    return SEVERITIES[min(index + 1, len(SEVERITIES) - 1)]


def begin(
    db: Db,
    deposit: Deposit,
    trigger: str,
    intents: Sequence[Intent],
    match: ProfileMatch | None,
) -> None:
    """Start the wait a transition to `trigger` begins, if it begins one: the deposit is in
    that state now and, for needs_details, no submission was queued (`intents`: what the rules
    decided for the trigger; `match`: the profile that applies, if any)."""
    if trigger not in WAIT_TRIGGERS or deposit.state.value != trigger:
        return
    if trigger == State.NEEDS_DETAILS.value and any(
        i.action == "submit_profile" and (match is not None or i.params.get("profile"))
        for i in intents
    ):
        return
    severity, channels = _announced(intents)
    waits.start_wait(
        db,
        deposit.transaction_id,
        trigger,
        now=clock.now_ms(),
        severity=severity,
        channels=channels,
        again=trigger == State.REJECTED.value,
    )


def _announced(intents: Sequence[Intent]) -> tuple[str, list[str] | None]:
    """The highest severity of the rules' alerts (warning when none alerts) and the channels
    they went to (None: every configured one)."""
    alerts = [i.params for i in intents if i.action == "alert"]
    if not alerts:
        return "warning", None
    severity = max(
        (str(p.get("severity", "warning")) for p in alerts),
        key=lambda s: SEVERITIES.index(s) if s in SEVERITIES else 1,
    )
    if any(not p.get("channels") for p in alerts):
        return severity, None
    return severity, list(dict.fromkeys(c for p in alerts for c in p["channels"]))


@dataclass(frozen=True)
class Checked:
    """What one run of the deadline job did: the waits alerted past their deadline, and how
    many waits it found over."""

    alerted: tuple[waits.Wait, ...] = ()
    ended: int = 0


def _due(rules: RuleBook, wait: waits.Wait, now: int) -> int | None:
    """The deadline's epoch ms when this wait is past it now, else None."""
    ruleset = rules.ruleset_for(wait.wallet_id, wait.wallet_name)
    if ruleset is None or ruleset.deadline_s is None:
        return None
    due = wait.started_at + ruleset.deadline_s * 1000
    return due if due <= now else None


async def check_deadlines(store: Store, rules: RuleBook, *, now: int) -> Checked:
    """One run: end the waits that are over, alert once for each wait past its deadline."""

    def read(db: Any) -> tuple[list[int], list[waits.Wait]]:
        over = waits.over(db, limit=BATCH)
        shortest = rules.shortest_deadline_s
        if shortest is None:
            return over, []
        # Every one the shortest deadline may have passed for: which deadline applies is the
        # rule set of its wallet, so a limit here could leave a due one behind others.
        return over, waits.due_candidates(db, started_by=now - shortest * 1000)

    over, candidates = await store.read(read)
    due = [w for w in candidates if _due(rules, w, now) is not None]
    if not over and not due:
        return Checked()
    checked = Checked()
    for start in range(0, max(len(due), 1), BATCH):
        ended = over if start == 0 else []
        some = due[start : start + BATCH]
        more = await store.write(partial(_apply, rules=rules, over=ended, due=some, now=now))
        checked = Checked(checked.alerted + more.alerted, checked.ended + more.ended)
    for wait in checked.alerted:
        log.info(
            "deposit past its deadline",
            transactionId=wait.transaction_id,
            waitsOn=wait.reason,
            waitedSeconds=(now - wait.started_at) // 1000,
        )
    return checked


def _apply(
    db: Db,
    rules: RuleBook,
    over: list[int],
    due: list[waits.Wait],
    now: int,
) -> Checked:
    """In one write: end the waits read as over, and escalate the due ones still waiting
    (each checked again here, under its deposit's lock)."""
    ended = 0
    alerted: list[waits.Wait] = []
    for wait_id in over:
        if not waits.still_waiting(db, wait_id):
            ended += waits.end_wait(db, wait_id, now=now)
    for wait in due:
        lock_deposit(db, wait.transaction_id)
        if not waits.still_waiting(db, wait.id):
            ended += waits.end_wait(db, wait.id, now=now)
        elif waits.mark_escalated(db, wait.id, now=now):
            _alert(db, rules, wait, now)
            alerted.append(wait)
    return Checked(alerted=tuple(alerted), ended=ended)


def _alert(db: Db, rules: RuleBook, wait: waits.Wait, now: int) -> None:
    """Queue the alert of a wait past its deadline: how long, on what, never personal data."""
    ruleset = rules.ruleset_for(wait.wallet_id, wait.wallet_name)
    assert ruleset is not None and ruleset.deadline_s is not None
    waited = clock.duration_text((now - wait.started_at) // 1000)
    deadline = clock.duration_text(ruleset.deadline_s)
    detail = (
        f"waiting {waited} (since {clock.iso_from_ms(wait.started_at)}) on"
        f" {WAITS_ON[wait.reason]}; the deadline of {ruleset.name} is {deadline}"
    )
    channels = ruleset.escalate or wait.channels
    queue_alert(
        db,
        transaction_id=wait.transaction_id,
        condition=f"overdue:{wait.reason}",
        severity=raised(wait.severity),
        trigger=TRIGGER,
        detail=detail,
        channels=list(channels) if channels else None,
        once_per=f"wait#{wait.id}",
        rule_set=ruleset.name,
        rule_set_version=ruleset.version,
    )
