"""`depositd backfill --since ISO [--until ISO] [--wallet ID]`: the catch-up read on demand.

The command reads the full history of the window (every page, one page in memory at a time)
and applies each record through the tracker and the rules in its own write transactions on
the database, exactly as `serve`'s catch-up does. SQLite serialises those transactions with the
running service's, and a fact that changes nothing acts on nothing, so the command is safe
beside `serve` and running it twice changes nothing the second time. It never runs actions: the
rows it records (alerts, submissions) are run by `serve`'s outbox, at once when it runs, else at
its next start. Bookings are written in the same transaction as the fact that caused them.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING, TextIO

from worker.clock import HISTORY_FLOOR, iso_from_ms, ms_from_iso, now_ms
from worker.commands.read import parse_since
from worker.config.settings import Settings, load_settings
from worker.logs import configure
from worker.service.bundle import load_bundle
from worker.store.servelock import serving

if TYPE_CHECKING:
    from worker.poll.catchup import ReadStats

PLAIN_EVERY_PAGES = 100  # not a terminal: one progress line per this many pages
REDRAW_S = 0.1  # a terminal: the progress line is redrawn at most this often


class ProgressLine:
    """Pages, records, new deposits and new facts: one line redrawn with `\\r` on a terminal,
    plain lines now and then when not."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._tty = out.isatty()
        self._drawn = 0.0
        self._printed_pages = 0
        self._dirty = False

    @staticmethod
    def text(stats: ReadStats) -> str:
        """The figures as one line."""
        return (
            f"pages {stats.pages}  records {stats.records}  new deposits {stats.new_deposits}"
            f"  new facts {stats.new_facts}"
        )

    def __call__(self, stats: ReadStats) -> None:
        if self._tty:
            now = time.monotonic()
            self._dirty = True
            if now - self._drawn >= REDRAW_S:
                self._drawn = now
                self._dirty = False
                self._out.write("\r\x1b[K" + self.text(stats))
                self._out.flush()
        elif stats.pages - self._printed_pages >= PLAIN_EVERY_PAGES:
            self._printed_pages = stats.pages
            print(self.text(stats), file=self._out, flush=True)

    def end(self, stats: ReadStats) -> None:
        """The last figures, and the line ended on a terminal."""
        if self._tty:
            self._out.write("\r\x1b[K" + self.text(stats) + "\n")
            self._out.flush()


def window(args: argparse.Namespace) -> tuple[int, int] | str:
    """(since, until) in epoch ms, or what is wrong with them."""
    try:
        since = ms_from_iso(parse_since(args.since))
    except ValueError as exc:
        return f"--since {exc}"
    until = now_ms()
    if args.until is not None:
        try:
            until = ms_from_iso(parse_since(args.until))
        except ValueError as exc:
            return f"--until {exc}"
    if since < ms_from_iso(HISTORY_FLOOR):
        return f"--since must not be before {HISTORY_FLOOR} (no deposit is older)"
    if since >= until:
        return "--since must be before --until (default: now)"
    return since, until


def summary(stats: ReadStats, since: int, until: int, mark: int | None) -> str:
    """The closing report."""
    state = "complete" if stats.complete else f"INCOMPLETE ({stats.error})"
    return (
        f"backfill {iso_from_ms(since)} .. {iso_from_ms(until)}: {state}\n"
        f"  pages {stats.pages}, records {stats.records}, new deposits {stats.new_deposits},"
        f" new facts {stats.new_facts}, skipped records {stats.skipped},"
        f" failed records {stats.failed}\n"
        f"  history covered until: {iso_from_ms(mark) if mark is not None else 'not yet'}"
    )


async def backfill(
    settings: Settings,
    since: int,
    until: int,
    *,
    wallet_id: int | None = None,
    out: TextIO | None = None,
    retries: int = 3,
) -> int:
    """Read [since, until] into the store with progress and a summary on `out`; the exit
    status: 0 when every window was read and every record applied, else 1."""
    from worker.act.reactor import RuleReactor  # the whole tracking stack: not at start-up
    from worker.poll.catchup import HistoryReader, covered_until
    from worker.provider.client import ProviderClient
    from worker.store.pgstore import serving as pg_serving
    from worker.store.writelock import command_store

    out = out if out is not None else sys.stdout
    bundle = load_bundle(settings)  # ConfigError: exit 2, nothing read
    reactor = RuleReactor(lambda: bundle.rules, lambda: bundle.profiles)
    s = settings.scheduler
    storage = settings.storage
    running = serving(storage.path) if storage.path is not None else pg_serving(storage)
    where = "the running serve" if running else "serve at its next start"
    print(f"backfill: actions this records are run by {where}", file=sys.stderr)
    progress = ProgressLine(out)
    async with command_store(storage) as store:
        async with ProviderClient.from_settings(settings.provider, retries=retries) as client:
            reader = HistoryReader(
                client, store, lambda: reactor, page_size=s.page_size, max_pages=s.max_pages
            )
            stats = await reader.read(
                since,
                until,
                int(s.catchup_window_s * 1000),
                wallet_id=wallet_id,
                progress=progress,
            )
        mark = await store.read(covered_until)
    progress.end(stats)
    print(summary(stats, since, until, mark), file=out, flush=True)
    return 0 if stats.complete and not stats.failed else 1


def run(args: argparse.Namespace) -> int:
    """`depositd backfill`."""
    settings = load_settings(args.config)
    configure(settings.log.format, "warning")  # stderr; stdout holds progress and summary
    bounds = window(args)
    if isinstance(bounds, str):
        print(f"depositd: backfill: {bounds}", file=sys.stderr)
        return 2
    since, until = bounds
    return asyncio.run(backfill(settings, since, until, wallet_id=args.wallet))
