"""Processing cost alone: the processor working off a stored backlog, in this process.

Not a test. Stores `--count` credited-deposit notifications (as bench/ingest.py sends them)
in a fresh database with the realistic configuration's rules and profiles, then times
`Processor.run_until_idle` (CPU seconds of this process / events) with the serve defaults.
Steadier than the CPU per event of bench/ingest.py (no load generator, no other process), so
fit for comparing two versions of the processing path; `--profile FILE` writes cProfile stats.

    .venv/bin/python bench/process.py [--count 20000] [--rounds 3] [--profile FILE]
                                      [--store postgres [--statements]]

`--store postgres` runs the same on PostgreSQL (a throwaway cluster started like the tests',
tests/support/pgcluster.py; a fresh database each round); `--statements` also counts the
statements the processor sends per event there and the round trips it waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests.support.pgcluster

import realistic as rl
from ingest import event

from worker.act.kinds import SPECS
from worker.act.reactor import RuleReactor
from worker.clock import utc_now
from worker.config.profiles import Profiles
from worker.logs import configure
from worker.rules import RuleBook
from worker.store.pgstore import PgStore
from worker.store.sqlitestore import Store, event_row
from worker.track.processor import Processor


class Statements:
    """What the PostgreSQL connections send: statements by text (an `executemany` counts once
    per parameter set; a statement of many rows once, its rows in brackets) and the round trips
    waited for (a statement run outside pipeline mode, a pipeline's sync)."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.rows: Counter[str] = Counter()
        self.waits: Counter[str] = Counter()
        self.on = False

    def install(self) -> None:
        import psycopg

        execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
        sync = psycopg.Pipeline.sync
        stats = self

        def counted_execute(cursor: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            if stats.on:
                text = _short(query)
                stats.sent[text] += 1
                stats.rows[text] += text.count("), (") + 1
                if cursor.connection._pipeline is None:
                    stats.waits[text] += 1
            return execute(cursor, query, params, **kw)

        def counted_executemany(cursor: Any, query: Any, seq: Any, **kw: Any) -> Any:
            seq = list(seq)
            if stats.on:
                text = _short(query)
                stats.sent[text] += len(seq)
                stats.rows[text] += len(seq)
                if cursor.connection._pipeline is None:
                    stats.waits[text] += 1
            return executemany(cursor, query, seq, **kw)

        def counted_sync(pipeline: Any) -> None:
            if stats.on:
                caller = sys._getframe(1)
                stats.waits[f"(pipeline sync) {caller.f_code.co_name}"] += 1
            sync(pipeline)

        psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
        psycopg.Cursor.executemany = counted_executemany  # type: ignore[method-assign]
        psycopg.Pipeline.sync = counted_sync  # type: ignore[method-assign]

    def show(self, events: int) -> None:
        for title, counts in (("sent", self.sent), ("waited for", self.waits)):
            print(f"  statements {title} per event: {sum(counts.values()) / events:.2f}")
            for text, n in counts.most_common(25):
                rows = f" [{self.rows[text] / n:.0f} rows]" if self.rows[text] > n else ""
                print(f"    {n / events:7.3f}  {text[:90]}{rows}")


def server_cpu_s(port: int) -> float:
    """CPU seconds the PostgreSQL server listening on `port` has used so far: its postmaster
    and the processes it started (those alive, and the ended ones it has reaped)."""
    stats: dict[str, tuple[str, list[str]]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_text().split("\0")
        except OSError:
            continue
        name, _, rest = text.partition("(")[2].rpartition(")")
        if name == "postgres":
            stats[stat.parent.name] = (" ".join(cmdline), rest.split())
    main = [pid for pid, (cmd, _) in stats.items() if f"-p {port} " in f"{cmd} "]
    ticks = sum(
        sum(int(f) for f in fields[11:15])
        for pid, (_, fields) in stats.items()
        if pid in main or fields[1] in main
    )
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu(url: str | None) -> float:
    """`server_cpu_s` of the server of `url` (0 for SQLite)."""
    if url is None:
        return 0.0
    return server_cpu_s(int(url.rpartition(":")[2].partition("/")[0]))


def _short(sql: Any) -> str:
    text = sql.decode() if isinstance(sql, bytes) else str(sql)
    return re.sub(r"\s+", " ", text.strip())


async def one_round(
    tmp: Path,
    count: int,
    start: int,
    profile: cProfile.Profile | None,
    url: str | None = None,
    statements: Statements | None = None,
) -> float:
    """CPU microseconds per event to process `count` stored events."""
    rules = tmp / "rules"
    profiles = Profiles.load(tmp / "profiles.yaml")
    book = RuleBook.load(rules, specs=SPECS, profile_names=profiles.names())
    store = Store(tmp / "bench.db", synchronous="FULL") if url is None else PgStore(url)
    await store.open()
    try:
        rows = []
        for n in range(start, start + count):
            body = event(f"ev-{n}", n)
            tx = f"bench-tx-{n}"
            kind = "DEPOSIT_ORDER_NOTIFICATION"
            rows.append(event_row(f"ev-{n}", kind, tx, tx, body, {}, utc_now()))
        for i in range(0, len(rows), 500):
            await asyncio.gather(*(store.queue_event(r) for r in rows[i : i + 500]))
        processor = Processor(store, reactor=RuleReactor(lambda: book, lambda: profiles))
        cpu, wall, server = time.process_time(), time.perf_counter(), server_cpu(url)
        if profile is not None:
            profile.enable()
        if statements is not None:
            statements.on = True
        done = await processor.run_until_idle()
        if statements is not None:
            statements.on = False
        if profile is not None:
            profile.disable()
        took, wall = time.process_time() - cpu, time.perf_counter() - wall
        server = server_cpu(url) - server
        assert done == count, (done, count)
        wal = tmp / "bench.db-wal"
        if url is None:
            print(f"  WAL {wal.stat().st_size / 1e6:.0f} MB" if wal.exists() else "  no WAL")
        print(f"  {count / wall:.0f} events/s")
        if url is not None:
            print(f"  PostgreSQL server: {server / count * 1e6:.0f} us CPU per event")
        if statements is not None:
            statements.show(count)
            statements.sent.clear()
            statements.rows.clear()
            statements.waits.clear()
        return took / count * 1e6
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="write cProfile stats of the last round here")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--statements",
        action="store_true",
        help="with --store postgres: count the statements sent and the round trips waited for",
    )
    args = parser.parse_args()
    configure("json", "info", stream=open(os.devnull, "w"))  # noqa: SIM115 (as serve: JSON at info)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "rules").mkdir()
        shipped = (rl.ROOT / "rules" / "default.yaml").read_bytes()
        (tmp / "rules" / "default.yaml").write_bytes(shipped)
        (tmp / "rules" / "wallet-1001.yaml").write_text(rl.WALLET_RULES)
        (tmp / "profiles.yaml").write_text(rl.PROFILES)
        cluster = contextlib.ExitStack()
        pg = None
        if args.store == "postgres":
            from tests.support.pgcluster import running_cluster

            pg = cluster.enter_context(running_cluster())
        statements = Statements() if args.statements and pg is not None else None
        if statements is not None:
            statements.install()
        costs = []
        for r in range(args.rounds):
            prof = cProfile.Profile() if args.profile and r == args.rounds - 1 else None
            url = pg.create_database() if pg is not None else None
            costs.append(
                asyncio.run(one_round(tmp, args.count, r * args.count, prof, url, statements))
            )
            print(f"round {r + 1}: {costs[-1]:.0f} us CPU per event")
            if prof is not None:
                prof.dump_stats(args.profile)
        cluster.close()
        costs.sort()
        median = costs[len(costs) // 2]
        print(f"median: {median:.0f} us CPU per event ({args.count} events a round)")


if __name__ == "__main__":
    main()
