"""The polls, the fallback for lost webhooks: the history queues, the transaction detail of the
deposits not yet final, and of those blocked (their jobs: `worker.schedule.polls`).

Polls only produce facts: history records and transaction details go through the same
`observe(fact)` entry point as webhooks, so a deposit found by a poll acts exactly once, as if
its webhook had come. Transaction detail is the only place `creditStatus` BLOCKED shows.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

from worker.act.queue import alert_detail_failing, alert_gone, alert_mismatch
from worker.clock import now_ms
from worker.config.settings import SchedulerSettings
from worker.errors import (
    ProviderAnswerMismatch,
    ProviderAuthError,
    ProviderBusinessError,
    ProviderError,
    ProviderRetryLater,
    ProviderUnavailable,
    StorageError,
)
from worker.logs import get_logger
from worker.poll.backoff import poll_backoff
from worker.poll.detailplan import DetailPlan, Listing
from worker.provider.client import ProviderClient
from worker.provider.models import DepositOrder, Page
from worker.provider.paging import pages
from worker.store.deposits import blocked_since, detail_candidates, get_deposit_rows
from worker.store.sqlitestore import Store
from worker.track.facts import fact_from_order
from worker.track.tracker import Deposit, Fact, State, conflicts, observe

log = get_logger(__name__)

# The tracker never leaves these (creditStatus' terminal values never change either), so their
# detail has nothing left to tell; except blocked, which support may release: its detail is read
# by its own, slower poll (`Poller.poll_blocked`) for a while.
FINAL_STATES = frozenset({State.COMPLETED, State.FAILED, State.BLOCKED})
# Every other tracked state may still change, needs_details and rejected included: a deposit can
# leave the history queues (submitted on the provider's hosted page, a lost webhook, a crash
# between the outbox's two commits) and then only its detail shows CREDITED or BLOCKED. Which
# of them a run reads is `DetailPlan`'s choice (worker.poll.detailplan).
DETAIL_STATES = tuple(s.value for s in State if s not in FINAL_STATES)
FAILING_ALERT_AFTER = 3
# Errors that say "not now" for the whole provider, not "no" for one deposit: they end the detail
# run and back off the poll. Any other failure reading or applying one deposit is that deposit's.
PROVIDER_WIDE = (ProviderAuthError, ProviderUnavailable, ProviderRetryLater)
# The page size the interface's own example uses: the work queues fall back to it when the
# provider refuses a larger `scheduler.page_size`.
SAFE_PAGE_SIZE = 50
QUEUES = ("init", "rejected")

Observe = Callable[[Fact], Awaitable[Any]]


def says_nothing_new(deposit: Deposit, fact: Fact) -> bool:
    """True when applying `fact` would change nothing: no field it states contradicts the
    deposit, and the tracker's fold leaves the deposit as it is."""
    if conflicts(deposit, fact):
        return False
    after, transitions = observe(deposit, fact)
    return after == deposit and not transitions


class PollStats:
    """Figures for /metrics and `status`."""

    def __init__(self) -> None:
        self.last_success: dict[str, float] = {}
        self.failures: dict[str, int] = {}
        self.found_by_poll = 0
        # Deposits whose detail could not be read or applied, summed over runs.
        self.detail_failed = 0


class Poller:
    """The polls (history, detail, blocked), each with its own back-off on provider errors."""

    def __init__(
        self,
        client: ProviderClient,
        store: Store,
        observe: Observe,
        settings: SchedulerSettings,
        *,
        alert: Callable[[str, str, str], Awaitable[None]] | None = None,
        on_poll: Callable[[str, str], None] | None = None,
        backoff_s: float = 1.0,
        backoff_max_s: float = 600.0,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        # Operator reads (`read_detail`) through the client; the polls' own reads through its
        # polls' view, which waits for the request budget (docs/polling.md).
        self._client = client
        self._polls = client.for_polls()
        self._store = store
        self._observe = observe
        self._settings = settings
        self._alert = alert
        self._on_poll = on_poll
        # Public so that tests and the demo can shorten the back-off of a running poller.
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._not_before: dict[str, float] = {}
        self._alerted: set[str] = set()
        # Detail poll, per deposit: consecutive runs that failed to read or apply it (read
        # after the others; `plan` keeps when each was last attempted, least recent first).
        self._detail_failing: dict[str, int] = {}
        self._clock = clock
        self.plan = DetailPlan(settings, clock())
        self._queue_page_cap: int | None = None  # 50 once the provider refused page_size
        self._stopping = False
        self.stats = PollStats()

    def stop(self) -> None:
        """Make a poll in flight end after the record in hand (shutdown must not wait for pages)."""
        self._stopping = True

    async def poll_history(self) -> int:
        """Feed every record of the init and rejected queues to the tracker; returns the count."""
        return await self._guard("history", self._history)

    async def poll_detail(self) -> int:
        """Read the detail of the deposits not yet final whose read is due (`DetailPlan`);
        returns the count."""
        return await self._guard("detail", self._detail)

    async def poll_blocked(self) -> int:
        """Read the detail of every deposit blocked less than `blocked_watch_days` ago (support
        may release it: the tracker then moves it to credited, trigger released)."""
        return await self._guard("blocked", self._blocked)

    async def read_detail(self, transaction_id: str) -> bool:
        """Read and apply one deposit's detail now (an operator asked; the hosted page closed);
        False when it could not be read or applied (logged and counted as the poll's)."""
        return await self._detail_one(transaction_id, self._client)

    async def _blocked(self) -> int:
        rows = await self._store.write(blocked_since)
        horizon = now_ms() - int(self._settings.blocked_watch_days * 86_400_000)
        attempted = 0
        for tx, since in rows:
            if self._stopping:
                break
            if since < horizon:
                continue  # watched long enough: a release now is found by `backfill` or a webhook
            attempted += 1
            await self._detail_one(tx, self._polls)
        return attempted

    async def _history(self) -> int:
        seen = 0
        started = self._clock()
        listed: set[str] = set()
        # Each queue has its own page cap (scheduler.max_pages), so a queue that pages on and
        # on cannot keep the other from being read in the same run.
        tracked: dict[str, dict[str, Any]] = {}  # the page in hand's deposits, as stored
        for status in QUEUES:
            # A queue's records are dated when its first page was asked for (`fact_from_order`).
            sent_at = now_ms()
            async for order in self._queue(status, tracked):
                tx = order.transactionId
                listed.add(tx)
                seen += 1
                fact: Fact | None = fact_from_order(order, source="poll", sent_at=sent_at)
                row = tracked.get(tx)
                if row is None:
                    self.stats.found_by_poll += 1
                    log.info("found by poll", transactionId=tx, poll="history")
                elif fact is not None and says_nothing_new(Deposit.from_row(row), fact):
                    # Listed as it was last time: the tracker would change nothing (the
                    # queues list thousands of waiting deposits every run).
                    fact = None
                if fact is not None:
                    await self._observe(fact)
                if self._stopping:
                    return seen  # the rest is found by the next run after the restart
        self.plan.listed(Listing(started, self._clock(), frozenset(listed)))
        return seen

    def _queue(
        self, status: str, tracked: dict[str, dict[str, Any]]
    ) -> AsyncIterator[DepositOrder]:
        """Every deposit of one work queue, a page at a time, at the largest page size the
        provider takes: `scheduler.page_size`, or 50 once it refused that; `tracked` holds the
        stored rows of each page's deposits while its records are read."""

        async def fetch(page_num: int) -> Page[DepositOrder]:
            page = await fetch_page(page_num)
            ids = [order.transactionId for order in page.records]
            rows = await self._store.read(lambda db: get_deposit_rows(db, ids))
            tracked.clear()
            tracked.update(rows)
            return page

        async def fetch_page(page_num: int) -> Page[DepositOrder]:
            size = min(self._settings.page_size, self._queue_page_cap or self._settings.page_size)
            try:
                return await self._polls.history(
                    white_list_status=status, page_num=page_num, page_size=size
                )
            except ProviderBusinessError as exc:
                if page_num != 1 or size <= SAFE_PAGE_SIZE:
                    raise
                log.warning(
                    "provider refused the page size; the work queues are read at 50",
                    pageSize=size,
                    error=str(exc),
                )
                self._queue_page_cap = SAFE_PAGE_SIZE
                return await fetch_page(page_num)

        return pages(fetch, self._settings.max_pages, what=f"history {status}")

    async def _detail(self) -> int:
        # A completed deposit whose txHash is not known yet is read too: its booking waits
        # for the txHash (docs/reconciliation.md).
        rows = await self._store.write(
            lambda db: detail_candidates(
                db, DETAIL_STATES, without_tx_hash=(State.COMPLETED.value,)
            )
        )
        tracked = {tx for tx, _, _ in rows}
        for tx in [t for t in self._detail_failing if t not in tracked]:
            del self._detail_failing[tx]  # final now, or gone: nothing more to remember
        due = self.plan.due(rows, self._clock())
        # Deposits failing on their own go last, then the least recently attempted first; the
        # sort is stable, so ties keep the stalest-first order of the query.
        due.sort(key=lambda t: (t in self._detail_failing, self.plan.last_read(t) or -1))
        attempted = 0
        for tx in due:
            if self._stopping:
                break
            self.plan.read(tx, self._clock())
            attempted += 1
            await self._detail_one(tx, self._polls)
        return attempted

    async def _detail_one(self, tx: str, client: ProviderClient) -> bool:
        """Read and apply one deposit's detail through `client` (False: it failed, logged and
        counted); raises only what ends the whole run."""
        sent_at = now_ms()
        try:
            order = await client.transaction_detail(tx)
        except PROVIDER_WIDE:
            raise
        except ProviderBusinessError as exc:
            if exc.code == "10000100":
                self._detail_failing.pop(tx, None)
                log.warning("deposit not found by detail poll", transactionId=tx)
                await self._store.write(partial(alert_gone, transaction_id=tx))
                return False
            await self._deposit_failed(tx, str(exc))
            return False
        except ProviderAnswerMismatch as exc:
            # A protocol error, not this deposit's state: nothing is recorded, a human is told.
            await self._store.write(partial(alert_mismatch, transaction_id=tx, detail=str(exc)))
            await self._deposit_failed(tx, str(exc))
            return False
        except ProviderError as exc:  # an answer that is no readable record of this deposit
            await self._deposit_failed(tx, str(exc))
            return False
        try:
            await self._observe(fact_from_order(order, source="poll", sent_at=sent_at))
        except Exception as exc:
            if isinstance(exc, StorageError) and self._store.outage.note("pollsFailed"):
                return False  # counted in the outage's lines; the next run reads it again
            await self._deposit_failed(tx, f"{type(exc).__name__}: {exc}", trace=True)
            return False
        self._detail_failing.pop(tx, None)
        return True

    async def _deposit_failed(self, tx: str, error: str, *, trace: bool = False) -> None:
        """Log and count one deposit's failure; alert once when it keeps failing run after run."""
        runs = self._detail_failing.get(tx, 0) + 1
        self._detail_failing[tx] = runs
        self.stats.detail_failed += 1
        # Only the transactionId and the error: a detail carries no payer data, nor does this.
        log.warning(
            "deposit detail failed; poll goes on",
            transactionId=tx,
            failedRuns=runs,
            error=error,
            exc_info=trace,
        )
        if runs < FAILING_ALERT_AFTER:
            return
        detail = f"transaction detail failed on {runs} polls in a row: {error}"
        try:
            # Deduplicated in the actions table: one alert per deposit, however long it fails.
            await self._store.write(partial(alert_detail_failing, transaction_id=tx, detail=detail))
        except Exception as exc:
            log.warning(
                "could not queue detail_failing alert; next run tries again",
                transactionId=tx,
                error=f"{type(exc).__name__}: {exc}",
            )

    async def _guard(self, name: str, poll: Callable[[], Coroutine[Any, Any, int]]) -> int:
        now = time.monotonic()
        if now < self._not_before.get(name, 0.0):
            return 0
        try:
            count = await poll()
        except ProviderError as exc:
            kind = "auth" if isinstance(exc, ProviderAuthError) else "error"
            await self._failed(name, kind, str(exc))
            return 0
        except Exception as exc:
            if isinstance(exc, StorageError) and self._store.outage.note("pollsFailed"):
                return 0  # counted in the outage's lines; the next turn tries again
            # Storage or a bug: the poll task must not die with an unretrieved exception.
            log.exception("poll crashed", poll=name)
            await self._failed(name, "error", f"{type(exc).__name__}: {exc}")
            return 0
        if self.stats.failures.get(name):
            log.info("poll recovered", poll=name, after=self.stats.failures[name])
        self.stats.failures[name] = 0
        self._alerted.discard(name)
        self.stats.last_success[name] = time.time()
        if self._on_poll is not None:
            self._on_poll(name, "ok")
        return count

    async def _failed(self, name: str, kind: str, error: str) -> None:
        failures = self.stats.failures.get(name, 0) + 1
        self.stats.failures[name] = failures
        delay = poll_backoff(failures, self.backoff_s, self.backoff_max_s)
        self._not_before[name] = time.monotonic() + delay
        log.warning(
            "poll failed; backing off",
            poll=name,
            failures=failures,
            backoffSeconds=round(delay, 3),
            error=error,
        )
        if self._on_poll is not None:
            self._on_poll(name, kind)
        if failures < FAILING_ALERT_AFTER or name in self._alerted:
            return
        if self._alert is not None:
            try:
                await self._alert(
                    f"poll_failing:{name}",
                    "critical" if kind == "auth" else "warning",
                    f"{name} poll failed {failures} times in a row: {error}",
                )
            except Exception as exc:
                # Often the poll's own cause (storage failing): it must not kill the poll task,
                # and it is not marked as alerted, so the next failed run tries again.
                log.warning(
                    "could not queue poll_failing alert; next failure tries again",
                    poll=name,
                    error=f"{type(exc).__name__}: {exc}",
                )
                return
        self._alerted.add(name)
