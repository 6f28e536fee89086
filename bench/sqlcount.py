"""The SQL statements `depositd serve` runs per event in the realistic configuration.

Not a test. Runs serve (main process) with every SQLite connection traced, sends `--count`
credited-deposit notifications, waits until they are processed, stops serve and prints each
statement's count per event (statements the scheduler runs on its own included).

    .venv/bin/python bench/sqlcount.py [--count 3000]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import sqlite3
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def traced_serve(out: str, argv: list[str]) -> None:
    """`worker ARGV` with every sqlite3 connection's statements counted into `out` at exit."""
    counts: Counter[str] = Counter()
    connect = sqlite3.connect

    def count(sql: str) -> None:
        # The callback sees the statement with its values filled in: put the ? back.
        text = re.sub(r"'(?:[^']|'')*'|\bX'[0-9A-F]*'|\b\d+(?:\.\d+)?\b", "?", sql)
        counts[re.sub(r"\s+", " ", text.strip())[:110]] += 1

    def traced(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)  # type: ignore[arg-type]
        conn.set_trace_callback(count)
        return conn

    sqlite3.connect = traced  # type: ignore[assignment]
    atexit.register(lambda: Path(out).write_text(json.dumps(counts)))
    from worker.commands.cli import main

    code = main(argv)
    Path(out).write_text(json.dumps(counts))
    sys.exit(code)


def main() -> None:
    """Send the events, then print the statements per event."""
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        traced_serve(sys.argv[2], sys.argv[3:])
        return
    import realistic as rl
    from ingest import write_requests
    from load import run_load

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="depositd-sql-"))
    config, port, db, sport = rl.write_config(tmp, "depositd", light=False)
    sandbox = rl.start_sandbox(config, sport, tmp / "sandbox.log")
    out = tmp / "counts.json"
    serve = rl.spawn(
        [__file__, "serve", str(out), "serve", "--config", str(config)],
        tmp / "serve.log",
        env={"PYTHONPATH": os.pathsep.join([str(rl.ROOT), str(Path(__file__).parent)])},
    )
    try:
        rl.wait_url(f"http://127.0.0.1:{port}/healthz", serve)
        reqs = tmp / "requests.tsv"
        write_requests(reqs, 0, args.count, 1)
        run_load(port, reqs, 50, max(2.0, args.count / 2000), tmp)
        rl.drain(db)
        rl.stop(serve)
        counts: dict[str, int] = json.loads(out.read_text())
        conn = sqlite3.connect(db)
        events = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        conn.close()
        total = sum(counts.values())
        print(f"{events} events processed; {total / events:.1f} SQL statements per event")
        for sql, n in sorted(counts.items(), key=lambda kv: -kv[1])[:30]:
            print(f"{n / events:6.2f}  {sql}")
    finally:
        rl.stop(serve)
        rl.stop(sandbox)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
