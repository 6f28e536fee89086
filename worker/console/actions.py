"""The console's actions: POST only (the guard checks the session and the CSRF token), each
recorded in `operator_actions` with its time, the operator's name and the note typed.

Retries set rows back to pending with their idempotency keys, through the same store
functions as `depositd replay` and `retry-failed`; the outbox and the processor run them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web

from worker.act.approve import approve
from worker.clock import utc_now
from worker.console import pages, queries
from worker.console.auth import SESSION_KEY, Session
from worker.console.state import CONSOLE, Console
from worker.errors import ProviderError
from worker.logs import get_logger
from worker.store import actions as action_store
from worker.store import alerts as alert_store
from worker.store import deposits as deposit_store
from worker.store import events as event_store
from worker.store import findings as finding_store
from worker.store import operator as operator_store
from worker.store.db import Database, Db
from worker.store.tx import conn_of

log = get_logger(__name__)
MAX_NOTE = 500
MAX_PROFILE_NAME = 200  # longer is no stored profile's name: refused before it is recorded


def add_routes(app: web.Application) -> None:
    """The POST routes."""
    app.router.add_post("/logout", pages.logout)
    app.router.add_post("/actions/{id:\\d+}/retry", retry_action)
    app.router.add_post("/alerts/{id:\\d+}/retry", retry_alert)
    app.router.add_post("/events/{event_id}/retry", retry_event)
    app.router.add_post("/findings/{id:\\d+}/ack", acknowledge)
    app.router.add_post("/reconcile", reconcile)
    app.router.add_post("/deposits/{tx}/refresh", refresh)
    app.router.add_post("/deposits/{tx}/submit", submit_profile)


# A path of this console (and its query): no scheme, no host, no "//" or "/\\" start, no
# whitespace or control character (browsers drop tabs and newlines: "/\t/evil" is "//evil").
_BACK = re.compile(r"/(?![/\\])[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*")


def safe_back(raw: str) -> str:
    """Where to go back to after an action: the posted path if it is one of this console's,
    else the overview (never another site, never a header break)."""
    return raw if _BACK.fullmatch(raw) else "/"


async def _form(request: web.Request) -> tuple[str, str]:
    """(note, where to go back to) of a posted form; a note over `MAX_NOTE` characters is
    refused (400) rather than recorded cut."""
    form = await request.post()
    note = str(form.get("note", "")).strip()
    if len(note) > MAX_NOTE:
        raise web.HTTPBadRequest(text=f"a note is at most {MAX_NOTE} characters")
    return note, safe_back(str(form.get("back", "/")))


def _who(request: web.Request) -> str:
    session: Session = request[SESSION_KEY]
    return session.operator


def _by(request: web.Request) -> str:
    return f"{_who(request)}@{request.remote or '-'}"


async def _record(request: web.Request, kind: str, subject: str, note: str, outcome: str) -> None:
    console = request.app[CONSOLE]
    remote = _by(request)
    await console.store.write(
        lambda db: operator_store.record(
            db, kind, subject, note=note, outcome=outcome, remote=remote
        )
    )
    log.info("console action", kind=kind, subject=subject, outcome=outcome, by=remote)


async def _change_and_record(
    request: web.Request,
    kind: str,
    subject: str,
    note: str,
    job: Callable[[Database], str | None],
) -> str | None:
    """Run one write job (its outcome; None: no such row) and record it in the same
    transaction: a change is never left without its record, nor a record without its change."""
    console: Console = request.app[CONSOLE]
    remote = _by(request)

    def both(db: Database) -> str | None:
        outcome = job(db)
        if outcome is not None:
            operator_store.record(db, kind, subject, note=note, outcome=outcome, remote=remote)
        return outcome

    outcome = await console.store.write(both)
    if outcome is not None:
        log.info("console action", kind=kind, subject=subject, outcome=outcome, by=remote)
    return outcome


async def _requeue(
    request: web.Request,
    kind: str,
    subject: str,
    job: Callable[[Database], str | None],
) -> web.StreamResponse:
    """Run one write job that sets rows back to pending (None: no such row), record it, wake
    the runners."""
    console: Console = request.app[CONSOLE]
    note, back = await _form(request)
    outcome = await _change_and_record(request, kind, subject, note, job)
    if outcome is None:
        raise web.HTTPNotFound(text=f"no {subject}")
    console.ops.wake()
    console.wake_processor()
    raise web.HTTPSeeOther(back)


async def retry_action(request: web.Request) -> web.StreamResponse:
    """A failed action back to pending with its idempotency key (as `retry-failed`)."""
    action_id = int(request.match_info["id"])

    def job(db: Db) -> str | None:
        if action_store.get_action(db, action_id) is None:
            return None
        done = action_store.requeue_action(db, action_id, utc_now())
        return "queued again" if done else "not retried: not failed, or refused for its profile"

    return await _requeue(request, "retry_action", f"action#{action_id}", job)


async def retry_alert(request: web.Request) -> web.StreamResponse:
    """A failed alert (one channel) sent again: its row and its alert action back to pending;
    the channels that took it are not sent it again."""
    alert_id = int(request.match_info["id"])

    def job(db: Db) -> str | None:
        alert = alert_store.get_alert(db, alert_id)
        if alert is None:
            return None
        if not alert_store.requeue_alert(db, alert_id):
            return "not retried: not failed"
        ids = action_store.failed_alert_actions(
            db, str(alert["transaction_id"]), str(alert["condition"])
        )
        ids += _system_action(alert)
        now = utc_now()
        queued = sum(action_store.requeue_action(db, i, now) for i in set(ids))
        return f"queued again ({queued} alert action(s))"

    return await _requeue(request, "retry_alert", f"alert#{alert_id}", job)


def _system_action(alert: dict[str, Any]) -> list[int]:
    """The action of an alert about no deposit: its id is in the dedupe key (system#ID...)."""
    key = str(alert.get("dedupe_key") or "")
    if not key.startswith("system#"):
        return []
    digits = key[len("system#") :].split("#")[0].split(":")[0]
    return [int(digits)] if digits.isdigit() else []


async def retry_event(request: web.Request) -> web.StreamResponse:
    """A stored event back in the inbox (as `replay`): re-run through the tracker and rules."""
    event_id = request.match_info["event_id"]

    def job(db: Db) -> str | None:
        return "queued again" if event_store.requeue_event(conn_of(db), event_id) else None

    return await _requeue(request, "retry_event", f"event#{event_id}", job)


async def acknowledge(request: web.Request) -> web.StreamResponse:
    """Acknowledge one reconciliation finding with a note (required)."""
    finding_id = int(request.match_info["id"])
    note, back = await _form(request)
    if not note:
        raise web.HTTPBadRequest(text="an acknowledgement needs a note")
    by = _who(request)

    def job(db: Db) -> str | None:
        # An acknowledgement stands: a second one (double click, second tab) does not replace
        # who acknowledged, when and why.
        if finding_store.acknowledge(db, finding_id, by=by, note=note, now=utc_now()):
            return "acknowledged"
        finding = finding_store.get_finding(db, finding_id)
        if finding is None:
            return None
        return f"refused: acknowledged already by {finding.get('acknowledged_by')}"

    outcome = await _change_and_record(request, "ack_finding", f"finding#{finding_id}", note, job)
    if outcome is None:
        raise web.HTTPNotFound(text=f"no finding {finding_id}")
    if outcome != "acknowledged":
        raise web.HTTPConflict(text=f"finding {finding_id}: {outcome}")
    raise web.HTTPSeeOther(back)


async def reconcile(request: web.Request) -> web.StreamResponse:
    """Reconcile one day again now (as `depositd reconcile --date`)."""
    console = request.app[CONSOLE]
    form = await request.post()
    note, back = await _form(request)
    try:
        day = dt.date.fromisoformat(str(form.get("day", "")))
    except ValueError:
        raise web.HTTPBadRequest(text="day must be YYYY-MM-DD") from None
    if day > dt.datetime.now(dt.UTC).date():
        raise web.HTTPBadRequest(text=f"{day.isoformat()} has not begun yet (UTC)")
    subject = f"day#{day.isoformat()}"
    with _once(console, f"reconcile:{day.isoformat()}") as first:
        if not first:
            await _record(request, "reconcile", subject, note, "refused: already running")
            raise web.HTTPConflict(text=f"{day.isoformat()} is being reconciled already")
        try:
            outcome = await console.ops.reconcile(day)
        except ProviderError as exc:
            outcome = f"failed: {exc}"
    await _record(request, "reconcile", subject, note, outcome)
    raise web.HTTPSeeOther(back)


@contextlib.contextmanager
def _once(console: Console, what: str) -> Iterator[bool]:
    """True (and `what` marked running until the block ends) when `what` is not running yet;
    False when it is: the caller refuses the second request."""
    if what in console.running:
        yield False
        return
    console.running.add(what)
    try:
        yield True
    finally:
        console.running.discard(what)


async def refresh(request: web.Request) -> web.StreamResponse:
    """Read one deposit's detail now; JSON with its new state when asked from a script (the
    hosted page closed), else back to the page."""
    console = request.app[CONSOLE]
    tx = request.match_info["tx"]
    note, back = await _form(request)
    if await console.store.read(lambda db: deposit_store.get_deposit_row(db, tx)) is None:
        raise web.HTTPNotFound(text=f"no deposit {tx}")
    try:
        read = await console.ops.read_detail(tx)
        outcome = "detail read" if read else "failed: the detail could not be read (see the log)"
    except ProviderError as exc:
        outcome = f"failed: {exc}"
    await _record(request, "read_detail", tx, note, outcome)
    row = await console.store.read(lambda db: deposit_store.get_deposit_row(db, tx))
    assert row is not None
    if request.headers.get("Accept", "").startswith("application/json"):
        deposit = queries.deposit_view(row)
        return web.json_response(
            {
                "transactionId": tx,
                "state": deposit["state"],
                "whiteListStatus": deposit["whiteListStatus"],
                "outcome": outcome,
            }
        )
    raise web.HTTPSeeOther(back)


async def submit_profile(request: web.Request) -> web.StreamResponse:
    """Submit a stored profile (named in the form) for a deposit waiting for payer details, as
    `depositd submit` does: queued for the outbox and recorded in one transaction. 409 when the
    deposit no longer waits (or this payload was sent already and rejected), 400 for a profile
    that is not stored or does not fit; a second post of the same profile queues nothing."""
    console: Console = request.app[CONSOLE]
    tx = request.match_info["tx"]
    form = await request.post()
    note, back = await _form(request)
    profile = str(form.get("profile", ""))
    if len(profile) > MAX_PROFILE_NAME:
        raise web.HTTPBadRequest(text="not a stored profile's name")
    remote = _by(request)
    approval = await console.store.write(
        lambda db: approve(db, tx, profile, console.ops.profiles, note=note, remote=remote)
    )
    log.info(
        "console action", kind="submit_profile", subject=tx, outcome=approval.verdict, by=remote
    )
    if approval.verdict == "unknown_deposit":
        raise web.HTTPNotFound(text=f"no deposit {tx}")
    if approval.verdict in ("unknown_profile", "unfit"):
        raise web.HTTPBadRequest(text=approval.message)
    if approval.verdict in ("not_waiting", "identical"):
        raise web.HTTPConflict(text=approval.message)
    console.ops.wake()
    raise web.HTTPSeeOther(back)
