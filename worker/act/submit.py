"""The submit_profile rows: submit a payer profile, read what the provider answered.

`Submitter` runs one submission row for `worker.act.outbox.Outbox`: the call with a stable
Idempotency-Key, an unknown outcome retried with that key, a refusal read by its code.
`resubmit_changed` queues a new submission once a rejected or refused deposit's profile changes;
`submit_newly_covered` once a profile covers a deposit that none covered when it arrived.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import sqlite_utils

from worker import clock
from worker.act.notfound import Reread, find_in_queues
from worker.act.reactor import (
    add_submission,
    enqueue_alert,
    key_used,
    submit_key,
)
from worker.act.rows import ActionRows, alert_once
from worker.config.profiles import Profiles
from worker.errors import (
    ProviderAnswerMismatch,
    ProviderAuthError,
    ProviderBusinessError,
    ProviderError,
    ProviderProtocolError,
    ProviderRequestRefused,
    ProviderRetryLater,
    ProviderUnavailable,
)
from worker.logs import get_logger
from worker.poll.scheduler import alert_mismatch
from worker.provider.client import ProviderClient
from worker.provider.codes import RetryCategory, categorize, code_rule, may_retry_same_key
from worker.provider.models import DepositOrder, WhiteListStatus
from worker.provider.payer import fields_named
from worker.rules import RuleBook
from worker.track.facts import fact_from_order
from worker.track.tracker import Deposit, Fact

log = get_logger(__name__)

Observe = Callable[[Fact], Awaitable[Any]]

# A submission whose outcome is unknown (an unreadable answer, a system error, "processing") is
# retried with the same key without end; a human is told once it has lasted this many attempts.
UNKNOWN_ALERT_AFTER = 3


class Submitter:
    """Runs submit_profile rows on the provider client, recording outcomes in `ActionRows`."""

    def __init__(
        self,
        rows: ActionRows,
        *,
        client: ProviderClient,
        profiles: Callable[[], Profiles],
        observe: Observe,
    ) -> None:
        self._rows = rows
        self._client = client
        self._profiles = profiles
        self._observe = observe

    async def run(
        self,
        action_id: int,
        row: dict[str, Any],
        deposit: Deposit | None,
        params: dict[str, Any],
        attempts: int,
    ) -> None:
        """Submit the profile that applies now; record the outcome, or retry or alert."""
        tx = str(row["transaction_id"])
        profiles = self._profiles()
        match = profiles.for_deposit(
            deposit.wallet_id if deposit else None, deposit.from_address if deposit else None
        )
        name = match.name if match is not None else None
        if params.get("named"):
            name = params["profile"] if params["profile"] in profiles.names() else None
        if name is None:
            await self._rows.finish(action_id, "skipped", "no profile applies any more")
            return
        content = profiles.content_hash(name)
        key = submit_key(tx, content)
        try:
            await self._client.submit_payer(tx, profiles.body(name), idempotency_key=key)
        except ProviderRetryLater as exc:
            await self._rows.later(
                action_id,
                attempts,
                f"{exc.code}: cannot submit now; retrying later with the same payload",
                key=key,
            )
            return
        except ProviderAuthError as exc:
            auth_detail = str(exc)
            await self._rows.later(
                action_id,
                attempts,
                f"auth failure: {exc.msg}; retrying after back-off",
                key=key,
                also=lambda db: enqueue_alert(
                    db, deposit, "auth_failure", "critical", trigger="submit", detail=auth_detail
                ),
            )
            return
        except ProviderUnavailable as exc:
            await self._rows.later(
                action_id,
                attempts,
                f"provider unavailable: {exc}; retrying with the same key",
                key=key,
            )
            return
        except ProviderProtocolError as exc:
            # No answer that can be read (an HTML error page, a redirect, data of the wrong
            # shape): the submission may or may not have been taken. The interface's
            # "Timeout / unknown": retry with back-off and the same key.
            await self._unknown_outcome(
                action_id, attempts, deposit, name, key, "unreadable", f"answer unreadable: {exc}"
            )
            return
        except ProviderRequestRefused as exc:
            # An id that would change the request path: nothing was sent, and nothing depositd
            # may do changes the id; a human looks at the deposit.
            await self._rows.finish(
                action_id,
                "failed",
                exc.msg,
                also=alert_once(
                    deposit, "submit_refused", "critical", trigger="submit", detail=exc.msg
                ),
            )
            return
        except ProviderBusinessError as exc:
            await self._submit_failed(
                action_id, tx, deposit, name, key, exc, profiles.body(name), attempts
            )
            return
        await self._rows.finish(
            action_id, "done", f"submitted profile {name}; whiteListStatus pending", key=key
        )
        # Just after the status the submission answered, in the provider's time (rows queued
        # before `after_ms` was recorded: this machine's clock).
        after = params.get("after_ms")
        fact = Fact(
            transaction_id=tx,
            source="submit",
            observed_at=int(after) + 1 if after is not None else clock.now_ms(),
            white_list_status=WhiteListStatus.PENDING,
        )
        try:
            await self._observe(fact)
        except Exception:
            # The provider has the submission and the row says so: it must stay done (a failed
            # row would let a profile edit queue a second submission while this one is under
            # review). The detail poll and the webhooks bring the deposit's state.
            log.exception("submission accepted; its fact not recorded now", transactionId=tx)

    async def _unknown_outcome(
        self,
        action_id: int,
        attempts: int,
        deposit: Deposit | None,
        profile: str,
        key: str,
        label: str,
        what: str,
    ) -> None:
        """Retry later with the same key; alert (warning) once it has lasted a few attempts."""
        also = None
        if attempts >= UNKNOWN_ALERT_AFTER:
            also = alert_once(
                deposit,
                f"submit_failed:{label}",
                "warning",
                trigger="submit",
                detail=f"{what}; {attempts} attempts so far; depositd keeps retrying with the "
                "same Idempotency-Key",
                profile=profile,
                once_per=_short(key),
            )
        await self._rows.later(
            action_id,
            attempts,
            f"{what}; outcome unknown, retrying with the same key",
            key=key,
            also=also,
        )

    async def _refresh(self, tx: str) -> DepositOrder | None:
        """Read the deposit's detail and feed it to the tracker; None if it is gone."""
        try:
            order = await self._client.transaction_detail(tx)
        except ProviderBusinessError as exc:
            if exc.code == "10000100":
                return None
            raise
        except ProviderAnswerMismatch as exc:
            # Another deposit's record: nothing recorded, a human told, then read as unread.
            await self._rows.write(partial(alert_mismatch, transaction_id=tx, detail=str(exc)))
            raise
        try:
            await self._observe(fact_from_order(order, source="poll"))
        except Exception:
            # What was read still decides this row; the detail poll records it later.
            log.exception("detail read; its fact not recorded now", transactionId=tx)
        return order

    async def _not_found(
        self,
        action_id: int,
        tx: str,
        deposit: Deposit | None,
        key: str,
        detail: str,
        attempts: int,
        alert: Callable[[str, str], Callable[[sqlite_utils.Database], object]],
    ) -> None:
        """10000100: re-read the history queues (init, rejected), then the detail; a deposit in
        neither and unknown to the detail is gone (critical alert). No retry with this key."""
        try:
            queue = await find_in_queues(
                self._client,
                tx,
                wallet_id=deposit.wallet_id if deposit else None,
                observe=self._observe,
            )
            seen = Reread(queue, await self._refresh(tx))
        except ProviderError as err:
            # Gone or not cannot be told yet: try again later with the same key.
            await self._rows.later(
                action_id,
                attempts,
                f"{detail}; queues or detail not read ({err.msg}); retrying later",
                key=key,
            )
            return
        found = f"{detail}; {seen.describe()}"
        log.warning("submission answered 10000100", transactionId=tx, queue=seen.queue)
        if seen.gone:
            await self._rows.finish(
                action_id,
                "failed",
                f"{found}; deposit gone",
                key=key,
                also=alert("critical", found),
            )
        elif seen.waits_for_details:
            # Not found to a submission, yet still waiting for payer details: nothing
            # depositd may do (no retry with this key) moves it on, so a human must know.
            await self._rows.finish(
                action_id,
                "failed",
                f"{found}; the deposit still exists and still waits for details",
                key=key,
                also=alert(
                    "warning",
                    f"{found}; the deposit still exists and still waits for payer details;"
                    " depositd does not submit again",
                ),
            )
        else:
            # It moved on (rejected, a review under way or done): the tracker follows it.
            await self._rows.finish(
                action_id, "failed", f"{found}; the deposit still exists", key=key
            )

    async def _submit_failed(
        self,
        action_id: int,
        tx: str,
        deposit: Deposit | None,
        profile: str,
        key: str,
        exc: ProviderBusinessError,
        body: Mapping[str, Any],
        attempts: int,
    ) -> None:
        code = exc.code or ""
        rule = code_rule(code)
        # The provider's message may echo the values sent (payer data): only the fields it
        # names are kept, for the alert, the row and the log alike.
        fields = fields_named(exc.msg, body)
        named = f"names {', '.join(fields)}" if fields else "names no field"
        head = f"{code} {rule.meaning}" if rule else (code or f"HTTP {exc.http_status}")
        detail = f"{head}: the provider's message {named} (traceId {exc.trace_id})"

        if may_retry_same_key(exc.code, exc.msg, exc.http_status):
            # Codes outside the interface's table, read by its retry categories: "System
            # error" (same key acceptable) and "In-flight" (do not change the key; query).
            if categorize(exc.msg, exc.http_status) is RetryCategory.IN_FLIGHT:
                try:
                    await self._refresh(tx)
                except ProviderError as err:
                    log.warning("detail not read", transactionId=tx, error=err.msg)
                label, what = "in_flight", f"submission in flight at the provider: {detail}"
            else:
                label, what = code or "system_error", f"provider system error: {detail}"
            await self._unknown_outcome(action_id, attempts, deposit, profile, key, label, what)
            return

        # Each submission's refusal alerts on its own (a refusal after a correction is news);
        # the same submission refused again does not.
        def alert(severity: str, text: str = detail) -> Callable[[sqlite_utils.Database], object]:
            return lambda db: enqueue_alert(
                db,
                deposit,
                f"submit_failed:{code}",
                severity,
                trigger="submit",
                detail=text,
                profile=profile,
                once_per=_short(key),
            )

        if code in ("10000101", "10000105"):
            if code == "10000101":
                what, read = "review already completed", "detail refreshed"
            else:
                what, read = "duplicate request", "original result read"
            try:
                await self._refresh(tx)
            except ProviderError as err:
                # Nothing to submit either way; the detail poll reads the result later.
                read = f"detail not read now ({err.msg}); the detail poll reads it"
            await self._rows.finish(action_id, "done", f"{what}; {read}", key=key)
        elif code == "10000100":
            await self._not_found(action_id, tx, deposit, key, detail, attempts, alert)
        elif code in ("10000102", "10000103"):
            await self._rows.finish(
                action_id,
                "failed",
                f"profile {profile} refused: {detail}; no retry until the profile changes",
                key=key,
                also=alert("warning"),
            )
        else:  # 10000106 (a bug on our side), 10000107 (wallet) and codes the interface omits
            await self._rows.finish(action_id, "failed", detail, key=key, also=alert("critical"))


def _short(key: str) -> str:
    """The short form of an Idempotency-Key that tells one submission's alerts from another's."""
    return key[:12]


def resubmit_changed(db: sqlite_utils.Database, profiles: Profiles) -> int:
    """Queue a new submission for rejected or refused deposits whose profile has changed.

    Runs in one transaction at start and after a profiles reload. A rejected deposit is never
    resubmitted with the payload it was rejected with.
    """
    queued = 0
    # Rejected deposits, and deposits whose submission the provider refused (10000102/10000103,
    # so still waiting for details): both wait for a corrected profile.
    rows = db.query(
        "SELECT * FROM deposits WHERE state='rejected' OR (state='needs_details' AND EXISTS"
        " (SELECT 1 FROM actions a WHERE a.transaction_id=deposits.transaction_id"
        " AND a.action='submit_profile' AND a.status='failed'))"
    )
    for row in list(rows):
        deposit = Deposit.from_row(row)
        last = db.execute(
            "SELECT params FROM actions WHERE transaction_id=? AND action='submit_profile'"
            " AND idempotency_key IS NOT NULL ORDER BY id DESC LIMIT 1",
            [deposit.transaction_id],
        ).fetchone()
        if last is None:
            continue  # depositd never submitted it (a human did): its rules decide, not a reload
        previous = json.loads(last[0] or "{}")
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


def submit_newly_covered(db: sqlite_utils.Database, profiles: Profiles, rules: RuleBook) -> int:
    """Queue a submission for deposits still waiting for payer details that depositd never
    submitted, now that a profile applies and their rules submit on `needs_details` (a profile
    added after the "payer details needed" alert). Runs with `resubmit_changed`."""
    queued = 0
    rows = db.query(
        "SELECT * FROM deposits WHERE state='needs_details' AND NOT EXISTS"
        " (SELECT 1 FROM actions a WHERE a.transaction_id=deposits.transaction_id"
        " AND a.action='submit_profile' AND a.status != 'skipped')"
    )
    for row in list(rows):
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
