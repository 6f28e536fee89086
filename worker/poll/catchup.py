"""Catch-up reads: the provider's full transaction history, window by window, as facts.

The history without a whiteListStatus filter is the wallet's whole transaction history. Read
between two times (`startTime`/`endTime`, every page), each record becomes a fact through the
same path as the polls (`fact_from_order`, then the tracker and the reactor in one write
transaction per page), so what is already known changes nothing and what is new acts once.

The covered-until mark (`meta` key `history_covered_until`) says up to when the history was
read completely. It only moves forward, and only to the end of a window that was read to its
last page and that starts at or before the mark: an outage mid-window, a page cap, a repeating
page or a total that keeps changing leave it where it was, and the next read starts there again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from pydantic import ValidationError

from worker.clock import iso_from_ms, ms_from_iso, now_ms
from worker.errors import ProviderError
from worker.logs import LogLine, get_logger
from worker.provider.client import ProviderClient
from worker.provider.models import DepositOrder, Page
from worker.provider.paging import pages
from worker.store.db import Database, Db
from worker.store.deposits import get_deposit_row
from worker.store.errors import StoreBusy, StoreUnavailable
from worker.store.meta import get_meta, set_meta
from worker.store.sqlitestore import Store
from worker.store.tx import savepoint
from worker.track.facts import fact_from_order
from worker.track.processor import Reactor, apply_fact
from worker.track.tracker import Deposit, Fact, Transition

log = get_logger(__name__)

COVERED_KEY = "history_covered_until"
# A window whose total changes while it is paged is read again this many times at most.
REREADS = 3
# A window whose pages pass the page cap is halved down to this size (ms) before giving up.
MIN_WINDOW_MS = 1000


def windows(start_ms: int, end_ms: int, window_ms: int) -> Iterator[tuple[int, int]]:
    """The windows [start, end] of `window_ms` (the last one shorter) covering [start_ms,
    end_ms], oldest first, made one at a time as they are read: memory stays flat whatever
    the span."""
    step = max(1, window_ms)
    start = start_ms
    while start < end_ms:
        end = min(start + step, end_ms)
        yield start, end
        start = end


def covered_until(db: Db) -> int | None:
    """The covered-until mark in epoch ms, or None before the first complete read."""
    value = get_meta(db, COVERED_KEY)
    return ms_from_iso(value) if value else None


def advance_mark(db: Db, start_ms: int, end_ms: int, *, may_start: bool) -> bool:
    """Move the mark to `end_ms` after the window [start_ms, end_ms] was read completely: only
    forward, and only when the window leaves no gap after the mark (`may_start`: set a first
    mark when none exists). True when it moved."""
    mark = covered_until(db)
    if mark is None and not may_start:
        return False
    if mark is not None and (start_ms > mark or end_ms <= mark):
        return False
    set_meta(db, COVERED_KEY, iso_from_ms(end_ms))
    return True


@dataclass
class Applied:
    """What applying one page of facts did."""

    new_deposits: int = 0
    new_facts: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    lines: list[LogLine] = field(default_factory=list)
    transitions: list[tuple[str, Transition]] = field(default_factory=list)


def apply_facts(db: Database, facts: list[Fact], reactor: Reactor | None) -> Applied:
    """Apply each fact as the processor does, each under its own savepoint (one that fails is
    undone alone and counted); call inside a write transaction."""
    done = Applied()
    conn = db.conn
    for fact in facts:
        try:
            with savepoint(conn, "fact"):
                row = get_deposit_row(db, fact.transaction_id)
                after, transitions, lines = apply_fact(db, fact, reactor)
        except (StoreBusy, StoreUnavailable):
            raise  # the store itself is failing: give the page back
        except Exception as exc:
            if not conn.in_transaction:
                raise  # SQLite dropped the transaction: give the page back
            done.errors.append((fact.transaction_id, f"{type(exc).__name__}: {exc}"))
            continue
        if row is None:
            done.new_deposits += 1
            done.new_facts += 1
        elif Deposit.from_row(row) != after:
            done.new_facts += 1
        done.lines.extend(lines)
        done.transitions.extend((fact.transaction_id, t) for t in transitions)
    return done


class _Split(Exception):
    """The window has more pages than the cap: read it as two halves."""


@dataclass
class ReadStats:
    """Figures of one read (a catch-up, a sweep, a backfill)."""

    pages: int = 0
    records: int = 0
    new_deposits: int = 0
    new_facts: int = 0
    skipped: int = 0  # records without a transactionId, or unreadable
    failed: int = 0  # records whose fact could not be applied
    windows: int = 0  # windows read completely
    complete: bool = True
    error: str | None = None


class Progress(Protocol):
    """Called after every page applied."""

    def __call__(self, stats: ReadStats) -> None: ...


@dataclass
class _Track:
    """What paging one window saw: enough to tell a complete read from one cut short."""

    pages: int = 0
    last: Page[dict[str, Any]] | None = None
    previous: list[dict[str, Any]] | None = None
    total: int | None = None
    total_changed: bool = False

    def see(self, page: Page[dict[str, Any]]) -> None:
        self.pages += 1
        self.previous = self.last.records if self.last is not None else None
        self.last = page
        if self.total is None:
            self.total = page.totalRow
        elif page.totalRow != self.total:
            self.total_changed = True

    def complete(self) -> bool:
        page = self.last
        if page is None or (self.previous is not None and page.records == self.previous):
            return False
        return not page.records or self.pages >= page.totalPage


class HistoryReader:
    """Reads the full history between two times, window by window, into the store."""

    def __init__(
        self,
        client: ProviderClient,
        store: Store,
        reactor: Callable[[], Reactor | None],
        *,
        page_size: int | Callable[[], int],
        max_pages: int,
        after_commit: Callable[[], None] | None = None,
        on_applied: Callable[[Applied], None] | None = None,
    ) -> None:
        self._client = client
        self._store = store
        self._reactor = reactor
        # A callable: the setting as it is at each window (serve's settings may change).
        self._page_size = page_size if callable(page_size) else lambda: page_size
        self._max_pages = max_pages
        self._after_commit = after_commit
        self._on_applied = on_applied
        self._stopping = False

    def stop(self) -> None:
        """End a read in flight after the page in hand (its window stays unread)."""
        self._stopping = True

    async def read(
        self,
        start_ms: int,
        end_ms: int,
        window_ms: int,
        *,
        wallet_id: int | None = None,
        move_mark: bool = True,
        may_start: bool = False,
        progress: Progress | None = None,
    ) -> ReadStats:
        """Read [start_ms, end_ms] in windows of `window_ms`, oldest first; the mark follows
        each complete window (never with `wallet_id`: one wallet is not the whole history)."""
        stats = ReadStats()
        ahead = windows(start_ms, end_ms, window_ms)
        # Halves of a split window and a window to read again, read before the next of `ahead`.
        todo: list[tuple[int, int]] = []
        while not self._stopping:
            if not todo:
                nxt = next(ahead, None)
                if nxt is None:
                    break
                todo.append(nxt)
            start, end = todo.pop()
            try:
                outcome = await self._window(start, end, wallet_id, stats, progress)
            except ProviderError as exc:
                stats.complete, stats.error = False, str(exc)
                log.warning(
                    "history read stopped; the window is read again next time",
                    start=iso_from_ms(start),
                    end=iso_from_ms(end),
                    error=str(exc),
                )
                return stats
            if outcome == "split":
                middle = (start + end) // 2
                todo += [(middle, end), (start, middle)]
                continue
            if outcome == "stopped":
                todo.append((start, end))
                break
            if outcome != "complete":
                # Later windows are still read (what they hold acts now), but the mark stays
                # before this one: the next read starts with it again.
                log.warning(
                    "history window not read completely; the mark stays before it",
                    start=iso_from_ms(start),
                    end=iso_from_ms(end),
                    why=outcome,
                )
                if stats.complete:
                    stats.complete, stats.error = False, outcome
                continue
            stats.windows += 1
            if move_mark and wallet_id is None and stats.complete:
                await self._store.write(
                    partial(advance_mark, start_ms=start, end_ms=end, may_start=may_start)
                )
        if (todo or next(ahead, None) is not None) and stats.complete:  # stopped before the end
            stats.complete, stats.error = False, "stopped"
        return stats

    async def _window(
        self,
        start: int,
        end: int,
        wallet_id: int | None,
        stats: ReadStats,
        progress: Progress | None,
    ) -> str:
        """One window: "complete", "split" (too many pages for the cap) or why it is not."""
        for attempt in range(1, REREADS + 1):
            track = _Track()

            async def fetch(page_num: int, track: _Track = track) -> Page[dict[str, Any]]:
                page = await self._client.history_records(
                    page_num=page_num,
                    page_size=self._page_size(),
                    wallet_id=wallet_id,
                    start_time=start,
                    end_time=end,
                )
                track.see(page)
                stats.pages += 1
                splittable = end - start > MIN_WINDOW_MS
                if page_num == 1 and page.totalPage > self._max_pages and splittable:
                    raise _Split
                return page

            batch: list[Fact] = []
            # Every record of the window is dated when its first page was asked for: what
            # it says held then or later (`fact_from_order`).
            sent_at = now_ms()
            try:
                async for record in pages(fetch, self._max_pages, what="history (full)"):
                    fact = self._fact(record, stats, sent_at)
                    if fact is not None:
                        batch.append(fact)
                    if len(batch) >= self._page_size():
                        await self._apply(batch, stats, progress)
                        batch = []
                    if self._stopping:
                        await self._apply(batch, stats, progress)
                        return "stopped"
            except _Split:
                return "split"
            await self._apply(batch, stats, progress)
            if not track.total_changed:
                return "complete" if track.complete() else "paging cut short"
            log.warning(
                "history total changed while paging; reading the window again",
                start=iso_from_ms(start),
                end=iso_from_ms(end),
                attempt=attempt,
            )
        return "history total kept changing while paging"

    @staticmethod
    def _fact(record: dict[str, Any], stats: ReadStats, sent_at: int) -> Fact | None:
        stats.records += 1
        tx = record.get("transactionId")
        if not isinstance(tx, str) or not tx:
            stats.skipped += 1
            log.warning(
                "history record without a transactionId skipped",
                walletId=record.get("walletId"),
                createTime=record.get("createTime"),
            )
            return None
        try:
            order = DepositOrder.model_validate(record)
        except ValidationError as exc:
            stats.skipped += 1
            log.error(
                "unreadable history record skipped", transactionId=tx, problems=exc.error_count()
            )
            return None
        return fact_from_order(order, source="poll", sent_at=sent_at)

    async def _apply(self, facts: list[Fact], stats: ReadStats, progress: Progress | None) -> None:
        if facts:
            reactor = self._reactor()
            done = await self._store.write(partial(apply_facts, facts=facts, reactor=reactor))
            for message, fields in done.lines:
                log.info(message, **fields)
            for tx, error in done.errors:
                log.warning("history record not applied", transactionId=tx, error=error)
            stats.new_deposits += done.new_deposits
            stats.new_facts += done.new_facts
            stats.failed += len(done.errors)
            if done.new_deposits:
                log.info("found by catch-up", deposits=done.new_deposits)
            if self._on_applied is not None:
                self._on_applied(done)
            if self._after_commit is not None and done.new_facts:
                self._after_commit()
        if progress is not None:
            progress(stats)
