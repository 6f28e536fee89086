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
    ProviderRetryLater,
    ProviderUnavailable,
    StorageError,
)
from worker.facts import fact_from_order
from worker.logs import get_logger
from worker.notify.channels import Notifier, send_all
from worker.notify.message import build_alert
from worker.profiles import Profiles
from worker.provider import jsonio, signing
from worker.provider.client import ProviderClient
from worker.provider.codes import code_rule
from worker.provider.models import WhiteListStatus
from worker.queries import utc_now
from worker.reactor import add_action, enqueue_alert, submit_key, submit_params
from worker.store import Store
from worker.tracker import Deposit, Fact, iso_from_ms

log = get_logger(__name__)

Observe = Callable[[Fact], Awaitable[Any]]

MAX_FORWARD_ATTEMPTS = 8
MAX_ALERT_ROUNDS = 3


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
        self._on_alert = on_alert
        self._wake = asyncio.Event()
        # One pass at a time: serve's loop and a burst caller must not run a row twice.
        self._pass = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None

    def wake(self) -> None:
        """Tell the runner that new rows may be due."""
        self._wake.set()

    def _delay(self, attempts: int) -> float:
        base: float = min(self._backoff_max_s, self._backoff_s * 2.0 ** max(0, attempts - 1))
        return base * (0.5 + random.random() / 2)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; the action in flight is finished first."""
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
            for row in rows:
                await self._execute(row)
        return len(rows)

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
        await self._observe(
            Fact(
                transaction_id=tx,
                source="submit",
                observed_at=int(after) + 1 if after is not None else signing.now_ms(),
                white_list_status=WhiteListStatus.PENDING,
            )
        )

    async def _refresh(self, tx: str) -> bool:
        """Read the deposit's detail and feed it to the tracker; False if it is gone."""
        try:
            order = await self._client.transaction_detail(tx)
        except ProviderBusinessError as exc:
            if exc.code == "10000100":
                return False
            raise
        await self._observe(fact_from_order(order, source="poll"))
        return True

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
        msg = _redact(exc.msg, body)
        detail = f"{code} {rule.meaning if rule else ''}: {msg} (traceId {exc.trace_id})"
        condition = f"submit_failed:{code}"

        def alert(severity: str) -> Callable[[sqlite_utils.Database], object]:
            return lambda db: enqueue_alert(
                db, deposit, condition, severity, trigger="submit", detail=detail, profile=profile
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
            await self._finish(action_id, "done", f"{what}; {read}")
        elif code == "10000100":
            try:
                still_there = await self._refresh(tx)
            except ProviderError as err:
                # Gone or not cannot be told yet: try again later with the same key.
                await self._later(
                    action_id,
                    attempts,
                    f"{detail}; detail not read ({err.msg}); retrying later",
                )
                return
            if still_there:
                await self._finish(action_id, "failed", f"{detail}; the deposit still exists")
            else:
                await self._finish(
                    action_id, "failed", f"{detail}; deposit gone", also=alert("critical")
                )
        elif code in ("10000102", "10000103"):
            await self._finish(
                action_id,
                "failed",
                f"profile {profile} refused: {detail}; no retry until the profile changes",
                also=alert("warning"),
            )
        else:  # 10000106 (a bug on our side), 10000107 (wallet) and codes the interface omits
            await self._finish(action_id, "failed", detail, also=alert("critical"))

    # --- alert -------------------------------------------------------------------------------

    async def _alert(
        self, action_id: int, deposit: Deposit | None, params: dict[str, Any], attempts: int
    ) -> None:
        condition = str(params["condition"])
        tx = deposit.transaction_id if deposit else "-"
        # Deposit alerts: once per (deposit, condition, channel). An alert about no deposit (poll
        # failing, reload refused) is once per queued alert: its callers decide how often.
        scope = tx if deposit else f"system#{action_id}"
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

        def claim(db: sqlite_utils.Database) -> list[str]:
            todo = []
            for channel in channels:
                key = f"{scope}:{condition}:{channel}"
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
        results = await send_all(self._notifiers, alert, todo, **self._notify_retry)

        def record(db: sqlite_utils.Database) -> None:
            for channel, error in results.items():
                db.execute(
                    "UPDATE alerts SET status=?, attempts=attempts+1, last_error=?, sent_at=?"
                    " WHERE dedupe_key=?",
                    [
                        "failed" if error else "sent",
                        error,
                        None if error else utc_now(),
                        f"{scope}:{condition}:{channel}",
                    ],
                )

        for channel, error in results.items():
            if self._on_alert is not None:
                self._on_alert(channel, "failed" if error else "sent")
        failed = {c: e for c, e in results.items() if e}
        if not failed:
            await self._finish(action_id, "done", f"sent to {', '.join(todo)}", also=record)
        elif attempts < MAX_ALERT_ROUNDS:
            await self._later(
                action_id,
                attempts,
                f"not sent to {', '.join(failed)}: {'; '.join(failed.values())}",
                also=record,
            )
        else:
            await self._finish(
                action_id,
                "failed",
                f"could not send to {', '.join(failed)}: {'; '.join(failed.values())}",
                also=record,
            )

    # --- forward -----------------------------------------------------------------------------

    async def _forward(
        self, action_id: int, deposit: Deposit | None, params: dict[str, Any], attempts: int
    ) -> None:
        if deposit is None:
            await self._finish(action_id, "skipped", "deposit unknown")
            return
        url = str(params["url"])
        secret = _forward_secret(params)
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


def _forward_secret(params: Mapping[str, Any]) -> str:
    """The forward signing secret (rule keys secret_env/secret_file), read when used."""
    if params.get("secret_env"):
        return os.environ.get(str(params["secret_env"]), "")
    if params.get("secret_file"):
        try:
            return Path(str(params["secret_file"])).read_text().strip()
        except OSError as exc:
            log.warning("forward secret unreadable", error=exc.strerror)
    return ""


def _redact(text: str, body: Mapping[str, Any]) -> str:
    """A provider message without the payer values it may echo: alerts name fields only."""
    for value in body.values():
        if isinstance(value, str) and value:
            for form in (f" {value!r}", repr(value), f'"{value}"'):
                text = text.replace(form, "")
            if len(value) > 3:
                text = text.replace(value, "[redacted]")
    return text


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
