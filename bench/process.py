"""Processing cost alone: the processor working off a stored backlog, in this process.

Not a test. Stores `--count` credited-deposit notifications (as bench/ingest.py sends them)
in a fresh database with the realistic configuration's rules and profiles, then times
`Processor.run_until_idle` (CPU seconds of this process / events) with the serve defaults.
Steadier than the CPU per event of bench/ingest.py (no load generator, no other process), so
fit for comparing two versions of the processing path; `--profile FILE` writes cProfile stats.

    .venv/bin/python bench/process.py [--count 20000] [--rounds 3] [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import realistic as rl
from ingest import event

from worker.act.kinds import SPECS
from worker.act.reactor import RuleReactor
from worker.clock import utc_now
from worker.config.profiles import Profiles
from worker.logs import configure
from worker.rules import RuleBook
from worker.store.sqlitestore import Store, event_row
from worker.track.processor import Processor


async def one_round(tmp: Path, count: int, start: int, profile: cProfile.Profile | None) -> float:
    """CPU microseconds per event to process `count` stored events."""
    rules = tmp / "rules"
    profiles = Profiles.load(tmp / "profiles.yaml")
    book = RuleBook.load(rules, specs=SPECS, profile_names=profiles.names())
    store = Store(tmp / "bench.db", synchronous="FULL")
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
        cpu = time.process_time()
        if profile is not None:
            profile.enable()
        done = await processor.run_until_idle()
        if profile is not None:
            profile.disable()
        took = time.process_time() - cpu
        assert done == count, (done, count)
        wal = tmp / "bench.db-wal"
        print(f"  WAL {wal.stat().st_size / 1e6:.0f} MB" if wal.exists() else "  no WAL")
        return took / count * 1e6
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="write cProfile stats of the last round here")
    args = parser.parse_args()
    configure("json", "info", stream=open(os.devnull, "w"))  # noqa: SIM115 (as serve: JSON at info)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "rules").mkdir()
        shipped = (rl.ROOT / "rules" / "default.yaml").read_bytes()
        (tmp / "rules" / "default.yaml").write_bytes(shipped)
        (tmp / "rules" / "wallet-1001.yaml").write_text(rl.WALLET_RULES)
        (tmp / "profiles.yaml").write_text(rl.PROFILES)
        costs = []
        for r in range(args.rounds):
            prof = cProfile.Profile() if args.profile and r == args.rounds - 1 else None
            costs.append(asyncio.run(one_round(tmp, args.count, r * args.count, prof)))
            print(f"round {r + 1}: {costs[-1]:.0f} us CPU per event")
            if prof is not None:
                prof.dump_stats(args.profile)
        costs.sort()
        median = costs[len(costs) // 2]
        print(f"median: {median:.0f} us CPU per event ({args.count} events a round)")


if __name__ == "__main__":
    main()
