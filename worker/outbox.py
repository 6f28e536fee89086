"""The outbox runner: executes recorded actions (submit, alert, forward) after their commit.

Rows are written by `worker.reactor` in the same transaction as the state change that caused
them. The runner marks a row running, performs the call outside any transaction, then records
the outcome. A crash between the two leaves the row `running`; at the next start it is run again
with the same Idempotency-Key, so the provider sees one submission, not two.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import sqlite_utils

from worker.aio import first_done
from worker.errors import (
    ProviderAuthError,
    ProviderBusinessError,
    ProviderError,
    ProviderProtocolError,
    ProviderRetryLater,
    ProviderUnavailable,
    StorageError,
)
from worker.facts import fact_from_order
from worker.logs import get_logger
from worker.notify.channels import Notifier, send_once
from worker.notify.message import build_alert
from worker.profiles import Profiles
from worker.provider import jsonio, signing
from worker.provider.client import ProviderClient
from worker.provider.codes import RetryCategory, categorize, code_rule, may_retry_same_key
from worker.provider.models import DepositOrder, WhiteListStatus
from worker.provider.payer import WITHDRAWN_FIELDS, PayerDetails
from worker.queries import utc_now
from worker.reactor import add_action, enqueue_alert, submit_key, submit_params
from worker.store import Store
from worker.tracker import Deposit, Fact, iso_from_ms

log = get_logger(__name__)

Observe = Callable[[Fact], Awaitable[Any]]

MAX_FORWARD_ATTEMPTS = 8
# An alert row is sent once per pass: up to MAX_ALERT_ROUNDS x notify_retry["attempts"] (5)
# sends while its channels fail in a retryable way, MAX_ALERT_ROUNDS when they refuse it.
MAX_ALERT_ROUNDS = 3
MAX_RETRY_AFTER_S = 3600.0  # a channel's Retry-After is honoured up to this
# A submission whose outcome is unknown (an unreadable answer, a system error, "processing") is
# retried with the same key without end; a human is told once it has lasted this many attempts.
UNKNOWN_ALERT_AFTER = 3
# Field names a provider message may name; its values are never echoed (they may be payer data).
PAYER_FIELDS = (*PayerDetails.model_fields, *WITHDRAWN_FIELDS)


def _iso_in(seconds: float) -> str:
    return iso_from_ms(signing.now_ms() + round(seconds * 1000))


class Outbox:
    """Runs due action rows until stopped; `run_until_idle` for tests and the demo."""

    def __init__(
        self,
        store: Store,
        *,
        client: ProviderClient,
        notifiers: Mapping[str, Notifier],
        profiles: Callable[[], Profiles],
        observe: Observe,
        backoff_s: float = 2.0,
        backoff_max_s: float = 300.0,
        notify_retry: Mapping[str, Any] | None = None,
        on_alert: Callable[[str, str], None] | None = None,
    ) -> None:
        self._store = store
        self._client = client
        self._notifiers = notifiers
        self._profiles = profiles
        self._observe = observe
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._notify_retry = dict(notify_retry or {})
        self._alert_attempts = MAX_ALERT_ROUNDS * int(self._notify_retry.get("attempts", 5))
        self._stop: asyncio.Event | None = None
        self._on_alert = on_alert
        self._wake = asyncio.Event()
        # One pass at a time: serve's loop and a burst caller must not run a row twice.
        self._pass = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None

    def wake(self) -> None:
        """Tell the runner that new rows may be due."""
        self._wake.set()

    def _delay(self, attempts: int) -> float:
        # The exponent is capped: a row retried without end (an unknown outcome) must not
        # overflow a float after ~1000 attempts.
        step = 2.0 ** min(max(0, attempts - 1), 40)
        base: float = min(self._backoff_max_s, self._backoff_s * step)
        return base * (0.5 + random.random() / 2)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; the action in flight is finished first."""
        self._stop = stop
        while not stop.is_set():
            try:
                ran = await self.run_once()
            except Exception:
                # The runner must outlive a storage outage: the rows wait, the next pass retries.
                log.exception("outbox pass failed; retrying")
                ran = 0
            if ran:
                continue
            self._wake.clear()
            # Events stay set: a wake() while the next due time is read is not missed.
            timeout = await self._until_next_due()
            await first_done(self._wake.wait(), stop.wait(), at_most_s=timeout)
        if self._http is not None:
            await self._http.close()

    async def _until_next_due(self, cap_s: float = 1.0) -> float:
        """Seconds until the earliest delayed row is due, so a short back-off stays short."""
        try:
            first = await self._store.read(
                lambda db: db.execute(
                    "SELECT MIN(next_attempt_at) FROM actions WHERE status IN ('pending','running')"
                ).fetchone()[0]
            )
        except StorageError:
            return cap_s
        if not first:
            return cap_s
        due = datetime.fromisoformat(str(first).replace("Z", "+00:00"))
        return min(cap_s, max(0.005, (due - datetime.now(UTC)).total_seconds()))

    async def run_until_idle(self, *, include_delayed: bool = False) -> None:
        """Run every due row (and rows they cause) until none is left."""
        while await self.run_once(include_delayed=include_delayed):
            pass

    async def run_once(self, *, include_delayed: bool = False) -> int:
        """Run the rows due now; returns how many ran."""
        now = "9999" if include_delayed else utc_now()
        async with self._pass:
            rows = await self._store.write(
                lambda db: list(
                    db.query(
                        "SELECT * FROM actions WHERE status IN ('pending','running')"
                        " AND next_attempt_at <= ? ORDER BY id LIMIT 50",
                        [now],
                    )
                )
            )
            ran = 0
            for row in rows:
                if self._stop is not None and self._stop.is_set():
                    break  # the rows left stay pending: a stop waits for one row, not fifty
                await self._execute(row)
                ran += 1
        return ran

    async def _execute(self, row: dict[str, Any]) -> None:
        action_id = int(row["id"])

        def start(db: sqlite_utils.Database) -> dict[str, Any] | None:
            db.execute(
                "UPDATE actions SET status='running', attempts=attempts+1, updated_at=? WHERE id=?",
                [utc_now(), action_id],
            )
            found = list(
                db.query("SELECT * FROM deposits WHERE transaction_id=?", [row["transaction_id"]])
            )
            return found[0] if found else None

        deposit_row = await self._store.write(start)
        deposit = Deposit.from_row(deposit_row) if deposit_row else None
        params = json.loads(row["params"] or "{}")
        attempts = int(row["attempts"]) + 1
        try:
            if row["action"] == "submit_profile":
                await self._submit(action_id, row, deposit, params, attempts)
            elif row["action"] == "alert":
                await self._alert(action_id, deposit, params, attempts)
            elif row["action"] == "forward":
                await self._forward(action_id, deposit, params, attempts)
            else:
                await self._finish(action_id, "skipped", f"nothing to run for {row['action']}")
        except Exception as exc:  # a bug must not stop the runner; the row shows it
            log.exception("action crashed", actionId=action_id, action=row["action"])
            await self._finish(action_id, "failed", f"internal error: {type(exc).__name__}: {exc}")

    async def _finish(
        self,
        action_id: int,
        status: str,
        outcome: str,
        *,
        retry_in: float | None = None,
        also: Callable[[sqlite_utils.Database], object] | None = None,
        key: str | None = None,
    ) -> None:
        def fn(db: sqlite_utils.Database) -> None:
            sets = "status=?, outcome=?, updated_at=?, next_attempt_at=?"
            args: list[Any] = [status, outcome, utc_now(), _iso_in(retry_in or 0)]
            if key is not None:
                sets += ", idempotency_key=?"
                args.append(key)
            db.execute(f"UPDATE actions SET {sets} WHERE id=?", [*args, action_id])
            if also is not None:
                also(db)

        await self._store.write(fn)
        log.info("action", actionId=action_id, status=status, outcome=outcome)

    async def _later(
        self,
        action_id: int,
        attempts: int,
        outcome: str,
        *,
        key: str | None = None,
        also: Callable[[sqlite_utils.Database], object] | None = None,
    ) -> None:
        """Back to pending, due again after this attempt's back-off."""
        await self._finish(
            action_id, "pending", outcome, retry_in=self._delay(attempts), key=key, also=also
        )

    # --- submit_profile ----------------------------------------------------------------------

    async def _submit(
        self,
        action_id: int,
        row: dict[str, Any],
        deposit: Deposit | None,
        params: dict[str, Any],
        attempts: int,
    ) -> None:
        tx = str(row["transaction_id"])
        profiles = self._profiles()
        match = profiles.for_deposit(
            deposit.wallet_id if deposit else None, deposit.from_address if deposit else None
        )
        name = match.name if match is not None else None
        if params.get("named"):
            name = params["profile"] if params["profile"] in profiles.names() else None
        if name is None:
            await self._finish(action_id, "skipped", "no profile applies any more")
            return
        content = profiles.content_hash(name)
        key = submit_key(tx, content)
        try:
            await self._client.submit_payer(tx, profiles.body(name), idempotency_key=key)
        except ProviderRetryLater as exc:
            await self._later(
                action_id,
                attempts,
                f"{exc.code}: cannot submit now; retrying later with the same payload",
                key=key,
            )
            return
        except ProviderAuthError as exc:
            auth_detail = str(exc)
            await self._later(
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
            await self._later(
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
        except ProviderBusinessError as exc:
            await self._submit_failed(
                action_id, tx, deposit, name, key, exc, profiles.body(name), attempts
            )
            return
        await self._finish(
            action_id, "done", f"submitted profile {name}; whiteListStatus pending", key=key
        )
        # Just after the status the submission answered, in the provider's time (rows queued
        # before `after_ms` was recorded: this machine's clock).
        after = params.get("after_ms")
        fact = Fact(
            transaction_id=tx,
            source="submit",
            observed_at=int(after) + 1 if after is not None else signing.now_ms(),
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
            also = _alert_once(
                deposit,
                f"submit_failed:{label}",
                "warning",
                detail=f"{what}; {attempts} attempts so far; depositd keeps retrying with the "
                "same Idempotency-Key",
                profile=profile,
                once_per=_short(key),
            )
        await self._later(
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
        try:
            await self._observe(fact_from_order(order, source="poll"))
        except Exception:
            # What was read still decides this row; the detail poll records it later.
            log.exception("detail read; its fact not recorded now", transactionId=tx)
        return order

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
        fields = _fields_named(exc.msg, body)
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
            return lambda db: _queue_alert(
                db,
                deposit,
                f"submit_failed:{code}",
                severity,
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
            await self._finish(action_id, "done", f"{what}; {read}", key=key)
        elif code == "10000100":
            try:
                order = await self._refresh(tx)
            except ProviderError as err:
                # Gone or not cannot be told yet: try again later with the same key.
                await self._later(
                    action_id,
                    attempts,
                    f"{detail}; detail not read ({err.msg}); retrying later",
                    key=key,
                )
                return
            if order is None:
                await self._finish(
                    action_id, "failed", f"{detail}; deposit gone", key=key, also=alert("critical")
                )
            elif order.whiteListStatus is WhiteListStatus.INIT:
                # Not found to a submission, yet still waiting for payer details: nothing
                # depositd may do (no retry with this key) moves it on, so a human must know.
                await self._finish(
                    action_id,
                    "failed",
                    f"{detail}; the deposit still exists and still waits for details",
                    key=key,
                    also=alert(
                        "warning",
                        f"{detail}; the deposit still exists and still waits for payer details;"
                        " depositd does not submit again",
                    ),
                )
            else:
                # It moved on (a review under way or done): the tracker follows it from here.
                await self._finish(
                    action_id, "failed", f"{detail}; the deposit still exists", key=key
                )
        elif code in ("10000102", "10000103"):
            await self._finish(
                action_id,
                "failed",
                f"profile {profile} refused: {detail}; no retry until the profile changes",
                key=key,
                also=alert("warning"),
            )
        else:  # 10000106 (a bug on our side), 10000107 (wallet) and codes the interface omits
            await self._finish(action_id, "failed", detail, key=key, also=alert("critical"))

    # --- alert -------------------------------------------------------------------------------

    async def _alert(
        self, action_id: int, deposit: Deposit | None, params: dict[str, Any], attempts: int
    ) -> None:
        condition = str(params["condition"])
        tx = deposit.transaction_id if deposit else "-"
        # Deposit alerts: once per (deposit, condition, channel), or per (deposit, condition,
        # once_per, channel) when the caller names what one alert is about (a submission). An
        # alert about no deposit (poll failing, reload refused) is once per queued alert: its
        # callers decide how often.
        scope = tx if deposit else f"system#{action_id}"
        if params.get("once_per"):
            scope += f"#{params['once_per']}"
        wanted = params.get("channels") or list(self._notifiers)
        channels = [c for c in wanted if c in self._notifiers]
        alert = build_alert(
            condition,
            str(params.get("severity", "warning")),
            deposit,
            detail=params.get("detail"),
            profile=params.get("profile"),
        )
        if not channels:
            log.warning("alert", condition=condition, transactionId=tx, title=alert.title)
            await self._finish(action_id, "done", "logged (no alert channel configured)")
            return

        def dedupe(channel: str) -> str:
            return f"{scope}:{condition}:{channel}"

        def claim(db: sqlite_utils.Database) -> list[str]:
            todo = []
            for channel in channels:
                key = dedupe(channel)
                db.execute(
                    "INSERT OR IGNORE INTO alerts (dedupe_key, transaction_id, condition, severity,"
                    " channel, status, attempts, created_at) VALUES (?,?,?,?,?, 'pending', 0, ?)",
                    [key, tx, condition, alert.severity, channel, utc_now()],
                )
                status = db.execute(
                    "SELECT status FROM alerts WHERE dedupe_key=?", [key]
                ).fetchone()[0]
                if status != "sent":
                    todo.append(channel)
            return todo

        todo = await self._store.write(claim)
        if not todo:
            await self._finish(action_id, "done", "already sent")
            return
        # One attempt per pass: a channel that answers 429 (Retry-After) or is down must not
        # hold the pass (and its lock) in a sleep while submissions wait and SIGTERM cannot end
        # it; the row is requeued for when the channel may take it.
        results = await send_once(self._notifiers, alert, todo)
        failed = {c: e for c, e in results.items() if e is not None}
        errors = "; ".join(e.msg for e in failed.values())
        # Retrying cannot help a refused URL or login: those get the old three rounds only.
        retryable = any(e.retryable for e in failed.values())
        limit = self._alert_attempts if retryable else MAX_ALERT_ROUNDS
        retry = bool(failed) and attempts < limit

        def record(db: sqlite_utils.Database) -> None:
            for channel, error in results.items():
                status = "sent" if error is None else "pending" if retry else "failed"
                db.execute(
                    "UPDATE alerts SET status=?, attempts=attempts+1, last_error=?, sent_at=?"
                    " WHERE dedupe_key=?",
                    [
                        status,
                        None if error is None else error.msg,
                        None if error else utc_now(),
                        dedupe(channel),
                    ],
                )

        for channel, error in results.items():
            if self._on_alert is not None:
                self._on_alert(channel, "failed" if error else "sent")
        if not failed:
            await self._finish(action_id, "done", f"sent to {', '.join(todo)}", also=record)
        elif retry:
            hint = max((e.retry_after or 0.0 for e in failed.values()), default=0.0)
            await self._finish(
                action_id,
                "pending",
                f"not sent to {', '.join(failed)}: {errors}",
                retry_in=max(self._alert_delay(attempts), min(hint, MAX_RETRY_AFTER_S)),
                also=record,
            )
        else:
            await self._finish(
                action_id,
                "failed",
                f"could not send to {', '.join(failed)}: {errors}",
                also=record,
            )

    def _alert_delay(self, attempts: int) -> float:
        """Back-off between sends of one alert (notify_retry's backoff_s, backoff_max_s)."""
        base = float(self._notify_retry.get("backoff_s", 1.0))
        cap = float(self._notify_retry.get("backoff_max_s", 60.0))
        return min(cap, base * 2.0 ** min(max(0, attempts - 1), 40))

    # --- forward -----------------------------------------------------------------------------

    async def _forward(
        self, action_id: int, deposit: Deposit | None, params: dict[str, Any], attempts: int
    ) -> None:
        if deposit is None:
            await self._finish(action_id, "skipped", "deposit unknown")
            return
        url = str(params["url"])
        secret, problem = forward_secret(params)
        if problem is not None:
            # Forward is signed (SPEC section 8): never post unsigned; wait for the secret.
            outcome = f"not sent: forward secret missing ({problem})"
            also = _alert_once(
                deposit,
                "forward_secret_missing",
                "warning",
                detail=f"forward not sent: {problem}; depositd retries with back-off and never "
                "posts unsigned",
            )
            if attempts < MAX_FORWARD_ATTEMPTS:
                await self._later(action_id, attempts, f"{outcome}; retrying", also=also)
            else:
                await self._finish(action_id, "failed", outcome, also=also)
            return
        body = jsonio.dumpb(params.get("deposit") or deposit.as_json())
        target = url.split("://", 1)[-1]
        path = "/" + target.split("/", 1)[1] if "/" in target else "/"
        headers = {"Content-Type": "application/json"}
        if secret:
            headers.update(signing.signed_headers("depositd", secret, "POST", path, body))
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            async with self._http.post(url, data=body, headers=headers) as resp:
                ok = 200 <= resp.status < 300
                outcome = f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            ok, outcome = False, f"{type(exc).__name__}: {exc}"
        if ok:
            await self._finish(action_id, "done", f"forwarded to {url}: {outcome}")
        elif attempts < MAX_FORWARD_ATTEMPTS:
            await self._later(
                action_id,
                attempts,
                f"forward failed ({outcome}); retrying",
            )
        else:
            await self._finish(action_id, "failed", f"forward to {url} failed: {outcome}")


def forward_secret(params: Mapping[str, Any]) -> tuple[str, str | None]:
    """(secret, problem) of a forward rule's signing secret (secret_env/secret_file), read when
    used: ("", None) when the rule names none, a problem when it names one that is unset, empty
    or unreadable (SPEC section 8: forward is signed, so that forward must not be sent)."""
    if params.get("secret_env"):
        name = str(params["secret_env"])
        value = os.environ.get(name, "")
        return (value, None) if value else ("", f"secret_env {name} is not set or empty")
    if params.get("secret_file"):
        path = Path(str(params["secret_file"]))
        try:
            value = path.read_text().strip()
        except OSError as exc:
            return "", f"secret_file {path} cannot be read ({exc.strerror})"
        return (value, None) if value else ("", f"secret_file {path} is empty")
    return "", None


def _fields_named(text: str | None, body: Mapping[str, Any]) -> list[str]:
    """The payer fields a provider message names, never the values it may echo."""
    names = dict.fromkeys([*PAYER_FIELDS, *(str(k) for k in body)])
    return [
        name
        for name in names
        if text and re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text, re.I)
    ]


def _short(key: str) -> str:
    """The short form of an Idempotency-Key that tells one submission's alerts from another's."""
    return key[:12]


def _queue_alert(
    db: sqlite_utils.Database,
    deposit: Deposit | None,
    condition: str,
    severity: str,
    *,
    detail: str,
    profile: str | None = None,
    once_per: str | None = None,
) -> int:
    """`enqueue_alert` of a submission or forward; `once_per` narrows the alert's dedupe from
    (deposit, condition) to (deposit, condition, once_per): one alert per submission."""
    params = {
        "condition": condition,
        "severity": severity,
        "channels": None,
        "detail": detail,
        "profile": profile,
        "once_per": once_per,
    }
    trigger = "forward" if condition.startswith("forward") else "submit"
    return add_action(db, deposit=deposit, action="alert", params=params, trigger=trigger)


def _alert_once(
    deposit: Deposit | None,
    condition: str,
    severity: str,
    *,
    detail: str,
    profile: str | None = None,
    once_per: str | None = None,
) -> Callable[[sqlite_utils.Database], object]:
    """Queue the alert unless one of the same (deposit, condition, once_per) is queued already:
    a condition that lasts over many attempts queues one alert row, not one per attempt."""

    def fn(db: sqlite_utils.Database) -> None:
        queued = db.execute(
            "SELECT 1 FROM actions WHERE action='alert' AND transaction_id IS ?"
            " AND json_extract(params, '$.condition')=?"
            " AND json_extract(params, '$.once_per') IS ? LIMIT 1",
            [deposit.transaction_id if deposit else None, condition, once_per],
        ).fetchone()
        if queued is None:
            _queue_alert(
                db, deposit, condition, severity, detail=detail, profile=profile, once_per=once_per
            )

    return fn


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
        key = submit_key(deposit.transaction_id, content)
        seen = db.execute(
            "SELECT COUNT(*) FROM actions WHERE transaction_id=? AND action='submit_profile'"
            " AND idempotency_key=?",
            [deposit.transaction_id, key],
        ).fetchone()[0]
        if seen:
            continue
        add_action(
            db,
            deposit=deposit,
            action="submit_profile",
            params=submit_params(deposit, name, content, named=named),
            trigger="profile_changed",
            idempotency_key=key,
        )
        queued += 1
    return queued
