"""The outbox runner: executes recorded actions (submit, alert, forward) after their commit.

Rows are written by `worker.act.reactor` (and `worker.act.queue`) in the same transaction as the
state change that caused them. The runner marks a row running, performs the call outside any
transaction, then records the outcome. A crash between the two leaves the row `running`; at the
next start it is run again with the same Idempotency-Key, so the provider sees one submission,
not two.

Several instances share the rows: a row is claimed (`claimed_by`, `lease_until`) by one
statement that only one instance can win, the claim is renewed while the action runs, and only
the claimant records the outcome. The claim of an instance that died lapses after `lease_s`,
and another instance runs the row again with the same Idempotency-Key.

Each kind of row runs on the runner its action kind registers (`worker.act.kinds.KINDS`:
submit_profile, alert and forward; book and ignore run nothing after the commit), or the one
`worker.act.kinds.ROW_RUNNERS` names for rows no rule names (order_updated, queued by the processor
for an order webhook); all record outcomes in `worker.act.queue.ActionRows`. This module holds the
runner: its pass loop and row dispatch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

from worker.act.kinds import KINDS, ROW_RUNNERS
from worker.act.kinds.base import Observe, Runner, RunnerDeps
from worker.act.queue import ActionRows
from worker.aio import first_done
from worker.clock import iso_from_ms, now_ms, utc_now
from worker.config.profiles import Profiles
from worker.errors import StorageError
from worker.logs import get_logger
from worker.notify.channels import Notifier
from worker.provider.client import ProviderClient
from worker.rules import RuleBook
from worker.store import actions as stored
from worker.store import alerts as alert_rows
from worker.store.leases import default_instance_id
from worker.store.sqlitestore import Store
from worker.track.tracker import Deposit

log = get_logger(__name__)


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
        rules: Callable[[], RuleBook] | None = None,
        instance: str | None = None,
        lease_s: float = 60.0,
        on_claim_lost: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._observe = observe
        self.instance = instance or default_instance_id()
        self.lease_s = lease_s
        self._rows = ActionRows(
            store,
            backoff_s=backoff_s,
            backoff_max_s=backoff_max_s,
            instance=self.instance,
            lease_s=lease_s,
            on_lost=on_claim_lost,
        )
        self._stop: asyncio.Event | None = None
        self._unreadable_due: str | None = None  # the last due time that was not a time
        self._wake = asyncio.Event()
        # One pass at a time: serve's loop and a burst caller must not run a row twice.
        self._pass = asyncio.Lock()
        deps = RunnerDeps(
            store=store,
            rows=self._rows,
            client=client,
            notifiers=notifiers,
            profiles=profiles,
            # Looked up at each call: `_observe` may be replaced on a built runner (tests do).
            observe=lambda fact: self._observe(fact),
            notify_retry=notify_retry,
            on_alert=on_alert,
            rules=rules if rules is not None else RuleBook.empty,
        )
        self._runners: dict[str, Runner] = {
            name: kind.runner(deps) for name, kind in KINDS.items() if kind.runner is not None
        }
        self._runners.update({name: build(deps) for name, build in ROW_RUNNERS.items()})

    def wake(self) -> None:
        """Tell the runner that new rows may be due."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; the action in flight is finished first, unless the stop
        cancels it (`Runtime`: after a grace): its row stays running and resumes after the
        restart with the same key, as after a crash."""
        self._stop = stop
        try:
            while not stop.is_set():
                try:
                    ran = await self.run_once()
                except StorageError as exc:
                    # The rows wait, the next pass retries; an outage counts it in its lines.
                    if not self._store.outage.note("outboxPassesFailed"):
                        log.error("outbox pass failed; retrying", error=str(exc))
                    ran = 0
                except Exception:
                    # The runner must outlive a storage outage: the rows wait, the next pass
                    # retries.
                    log.exception("outbox pass failed; retrying")
                    ran = 0
                if ran:
                    continue
                self._wake.clear()
                # Events stay set: a wake() while the next due time is read is not missed.
                timeout = await self._until_next_due()
                await first_done(self._wake.wait(), stop.wait(), at_most_s=timeout)
        finally:  # also when a stop cancels the action in flight
            for runner in self._runners.values():
                await runner.close()

    async def _until_next_due(self, cap_s: float = 1.0) -> float:
        """Seconds until the earliest delayed row is due, so a short back-off stays short."""
        try:
            first = await self._store.read(lambda db: stored.next_due_at(db, self.instance))
        except StorageError:
            return cap_s
        if not first:
            return cap_s
        try:
            due = datetime.fromisoformat(first.replace("Z", "+00:00"))
            if due.tzinfo is None:
                due = due.replace(tzinfo=UTC)  # the store's times are UTC
        except ValueError:
            # Not a time (a row edited by hand): the rows are compared as text when claimed,
            # so it is due or not by that alone; look again within the cap, as with no
            # delayed row, rather than end the runner. Said once per value.
            if first != self._unreadable_due:
                self._unreadable_due = first
                log.warning("next attempt time not understood; checking every second", value=first)
            return cap_s
        return min(cap_s, max(0.005, (due - datetime.now(UTC)).total_seconds()))

    async def run_until_idle(self, *, include_delayed: bool = False) -> None:
        """Run every due row (and rows they cause) until none is left."""
        while await self.run_once(include_delayed=include_delayed):
            pass

    async def run_once(self, *, include_delayed: bool = False) -> int:
        """Run the rows due now that this instance could claim; returns how many ran."""
        due_by = "9999" if include_delayed else None
        async with self._pass:
            rows = await self._store.write(
                lambda db: stored.due_actions(db, utc_now(), self.instance, due_by)
            )
            ran = 0
            for row in rows:
                if self._stop is not None and self._stop.is_set():
                    break  # the rows left stay pending: a stop waits for one row, not fifty
                ran += await self._execute(row, due_by)
        return ran

    def _lease_end(self) -> str:
        return iso_from_ms(now_ms() + round(self.lease_s * 1000))

    async def _claim(self, row: dict[str, Any], due_by: str | None) -> tuple[bool, Any]:
        """Claim the row for this instance: (claimed, the row of its deposit)."""
        action_id = int(row["id"])

        def claim(db: Any) -> tuple[bool, Any]:
            claimed = stored.claim_action(
                db,
                action_id,
                instance=self.instance,
                now=utc_now(),
                until=self._lease_end(),
                due_by=due_by,
            )
            return claimed, stored.deposit_of(db, row["transaction_id"]) if claimed else None

        return await self._store.write(claim)

    async def _renew(self, action_id: int, work: asyncio.Task[None]) -> None:
        """Keep the claim on a row while its action runs (a slow provider call), and the
        claims on the alert channels it is sending to, in the same write. A renewal that finds
        the row claimed by another instance (this one's claim lapsed: a pause, a store
        unreachable for longer than the lease) stops the action: the other runs it again
        with the same Idempotency-Key, and this one could not record its outcome anyway. A
        renewal the store refuses is tried again at the next third of the lease."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            channels = self._rows.alert_claims(action_id)
            try:
                held = await self._store.write(partial(self._renew_claims, action_id, channels))
            except StorageError as exc:
                log.warning("claim not renewed", actionId=action_id, error=str(exc))
                continue
            if not held:
                log.warning(
                    "claim lost to another instance; action stopped, outcome not recorded",
                    actionId=action_id,
                )
                self._rows.lost("renewal")
                work.cancel()
                return

    def _renew_claims(self, action_id: int, channels: list[str], db: Any) -> bool:
        """One renewal: the row's claim, then (while it holds) its alert channels' claims."""
        until = self._lease_end()
        held = stored.renew_claim(db, action_id, self.instance, until)
        if held and channels:
            alert_rows.renew_alert_claims(db, channels, self.instance, until)
        return held

    async def _execute(self, row: dict[str, Any], due_by: str | None = None) -> int:
        """Claim and run one row; 1 if it ran, 0 if another instance has it."""
        action_id = int(row["id"])
        try:
            claimed, deposit_row = await self._claim(row, due_by)
        except StorageError as exc:
            # A store that refuses a write racing another instance's (PostgreSQL's
            # serialization failure) lost the race like a row count of 0; a failing store
            # leaves the row to the next pass the same way.
            log.info("action not claimed", actionId=action_id, error=str(exc))
            return 0
        if not claimed:
            return 0
        deposit = Deposit.from_row(deposit_row) if deposit_row else None
        work = asyncio.create_task(self._run_row(action_id, row, deposit), name=f"run-{action_id}")
        renewing = asyncio.create_task(self._renew(action_id, work), name=f"claim-{action_id}")
        try:
            await work  # a stop cancelling this pass cancels the work too
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the stop: the row stays running and resumes after the restart
            # The renewal found the row claimed by another instance, which runs it again with
            # the same Idempotency-Key: this instance stopped its call and records nothing.
        finally:
            renewing.cancel()
            self._rows.drop_alerts(action_id)
        return 1

    async def _run_row(self, action_id: int, row: dict[str, Any], deposit: Deposit | None) -> None:
        """Run one claimed row on its runner; a crash is recorded as the row's failure."""
        params = json.loads(row["params"] or "{}")
        attempts = int(row["attempts"]) + 1
        runner = self._runners.get(row["action"])
        try:
            if runner is None:
                await self._rows.finish(action_id, "skipped", f"nothing to run for {row['action']}")
            else:
                await runner.run(action_id, row, deposit, params, attempts)
        except StorageError as exc:
            # The database unavailable: nothing can be recorded; the row stays claimed and is
            # run again (same Idempotency-Key) once the claim lapses.
            log.error(
                "action outcome not recorded",
                actionId=action_id,
                action=row["action"],
                error=str(exc),
            )
        except Exception as exc:  # a bug must not stop the runner; the row shows it
            log.exception("action crashed", actionId=action_id, action=row["action"])
            await self._rows.finish(
                action_id, "failed", f"internal error: {type(exc).__name__}: {exc}"
            )
