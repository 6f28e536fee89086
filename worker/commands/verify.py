"""`depositd verify`: the journal and the rows it describes (docs/audit.md, "How to verify").

`verify [--anchor SEQ:HASH] [--json]` recomputes the chain and checks each entry against the
ledger and the kept submissions, and every one of those rows against its entry; exit 0 and a
one-line summary when everything holds, 3 naming the first entry or row that does not (as
`reconcile` exits 3 with findings). The outcome is kept as the last verification (`status` and
the console show it); nothing else is written. `verify --head` prints the head, `SEQ HASH`
(`--anchor` takes it so, or as `SEQ:HASH`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from worker.clock import utc_now
from worker.config.settings import Settings, load_settings
from worker.logs import configure
from worker.store import journal
from worker.store import verification as checks
from worker.store.journal import Head
from worker.store.writelock import command_store

EXIT_DOES_NOT_VERIFY = 3


def _no_database(settings: Settings) -> bool:
    """A SQLite database that does not exist yet (opening the store would create it)."""
    if settings.storage.url is None and not settings.storage.file.exists():
        print(
            f"depositd: no database at {settings.storage.file} (has `depositd serve` run yet?)",
            file=sys.stderr,
        )
        return True
    return False


async def _head(settings: Settings) -> int:
    async with command_store(settings.storage) as store:
        head = await store.read(journal.head)
    print("the journal is empty (no entry yet)" if head is None else head.spaced())
    return 0


async def _verify(settings: Settings, anchor: Head | None, as_json: bool) -> int:
    async with command_store(settings.storage) as store:
        outcome = await checks.verify(store.read, at=utc_now(), anchor=anchor)
        await store.write(lambda db: checks.record(db, outcome))
    print(json.dumps(outcome.as_json()) if as_json else outcome.summary())
    return 0 if outcome.verified else EXIT_DOES_NOT_VERIFY


def run(args: argparse.Namespace) -> int:
    """`depositd verify`."""
    settings = load_settings(args.config)
    configure(settings.log.format, "warning")
    anchor = None
    if args.head and (args.anchor is not None or args.json):
        print(
            "depositd: verify: --head prints the head alone; leave --anchor and --json out",
            file=sys.stderr,
        )
        return 2
    if args.anchor is not None:
        try:
            anchor = Head.parse(args.anchor)
        except ValueError as exc:
            print(f"depositd: verify: --anchor: {exc}", file=sys.stderr)
            return 2
        if anchor.seq < 1:
            print("depositd: verify: --anchor: entries are numbered from 1", file=sys.stderr)
            return 2
    if _no_database(settings):
        return 1
    if args.head:
        return asyncio.run(_head(settings))
    return asyncio.run(_verify(settings, anchor, args.json))
