"""Webhook-to-submit latency: from the moment depositd receives a DEPOSIT_WHITELIST_REQUIRED
webhook to the moment the provider receives the payer details the rules submit for it.

Not a test. The realistic configuration (bench/realistic.py) against the embedded sandbox: the
bench injects deposits into the sandbox from an address with a stored profile; the sandbox
delivers DEPOSIT_WHITELIST_REQUIRED; the rule `submit_profile` sends the profile. Arrival is the
event's `received_at` in depositd's database (ms); receipt is the sandbox order's `updateTime`
(ms), which the sandbox sets when it accepts the submission. Same clock, one machine.

    .venv/bin/python bench/latency.py [--count 30] [--duration 4] [--rate 10] [--connections 50]

First `--count` deposits one at a time (the next once the previous one is submitted), then
deposits at `--rate`/s while wrk sends credited-deposit notifications at `--connections` for
`--duration` seconds (as bench/ingest.py does).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import realistic as rl
from ingest import write_requests
from load import run_load, summary


def inject(base: str) -> str:
    """One deposit into wallet 1001 from the profiled address; its transactionId."""
    body = {
        "walletId": 1001,
        "currency": "USDT",
        "network": "TRON",
        "amount": "100",
        "fromAddress": rl.FROM_ADDRESS,
    }
    req = urllib.request.Request(
        f"{base}/_sandbox/deposits",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        tx: str = json.loads(r.read())["transactionId"]
        return tx


def submitted(base: str) -> dict[str, int]:
    """transactionId -> updateTime (ms) of every order whose details the sandbox received."""
    with urllib.request.urlopen(f"{base}/_sandbox/state", timeout=30) as r:
        orders: list[dict[str, Any]] = json.loads(r.read())["orders"]
    return {
        o["transactionId"]: o["updateTime"] for o in orders if o["whiteListStatus"] == "pending"
    }


def wait_submitted(base: str, txs: list[str], limit_s: float = 300) -> dict[str, int]:
    """Wait until every one of `txs` was submitted (or the limit); their receipt times."""
    deadline = time.monotonic() + limit_s
    while True:
        seen = submitted(base)
        if all(tx in seen for tx in txs) or time.monotonic() > deadline:
            return {tx: seen[tx] for tx in txs if tx in seen}
        time.sleep(0.005 if len(txs) == 1 else 0.2)


def arrivals(db: Path, txs: list[str]) -> dict[str, float]:
    """transactionId -> received_at (epoch ms) of its DEPOSIT_WHITELIST_REQUIRED event."""
    import sqlite3

    conn = sqlite3.connect(db, timeout=30)
    try:
        rows = conn.execute(
            "SELECT transaction_id, received_at FROM events "
            "WHERE event_type='DEPOSIT_WHITELIST_REQUIRED'"
        ).fetchall()
    finally:
        conn.close()
    wanted = set(txs)
    return {
        tx: 1000 * datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
        for tx, at in rows
        if tx in wanted
    }


def report(label: str, db: Path, receipts: dict[str, int], txs: list[str]) -> None:
    """p50/p99/max of arrival -> receipt for `txs`."""
    came = arrivals(db, txs)
    ms = sorted(receipts[tx] - came[tx] for tx in txs if tx in receipts and tx in came)
    if not ms:
        print(f"{label}: no deposit was submitted")
        return
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(
        f"| {label} | {len(ms)}/{len(txs)} | {statistics.median(ms):.0f} ms | {p99:.0f} ms "
        f"| {ms[-1]:.0f} ms |"
    )


def main() -> None:
    """The two measurements."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=30, help="deposits one at a time")
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--rate", type=float, default=10.0, help="deposits/s under load")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "EXTRA"])
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="depositd-latency-"))
    config, port, db, sport = rl.write_config(
        tmp, "depositd", light=False, synchronous=args.synchronous
    )
    base = f"http://127.0.0.1:{sport}"
    sandbox = rl.start_sandbox(config, sport, tmp / "sandbox.log")
    serve = rl.start_serve(config, port, tmp / "serve.log")
    try:
        print(
            "realistic configuration, synchronous="
            f"{args.synchronous}; webhook arrival (depositd received_at) -> submission "
            "received (sandbox updateTime)"
        )
        print("| case | submitted | p50 | p99 | max |\n|---|---|---|---|---|")
        quiet: list[str] = []
        receipts: dict[str, int] = {}
        for _ in range(args.count):
            tx = inject(base)
            quiet.append(tx)
            receipts.update(wait_submitted(base, [tx], 30))
        report("one deposit at a time", db, receipts, quiet)
        reqs = tmp / "requests.tsv"
        write_requests(reqs, 0, 25000 * int(args.duration + 1), 1)
        loaded: list[str] = []
        stop = time.monotonic() + args.duration

        def trickle() -> None:
            while time.monotonic() < stop:
                loaded.append(inject(base))
                time.sleep(1 / args.rate)

        thread = threading.Thread(target=trickle)
        thread.start()
        load = summary(run_load(port, reqs, args.connections, args.duration, tmp))
        thread.join()
        pending = rl.lag(db)[0]
        receipts = wait_submitted(base, loaded)
        report(
            f"under load ({load['rate']:.0f} notifications/s acked at {args.connections} "
            f"connections, {pending} pending at the end)",
            db,
            receipts,
            loaded,
        )
    finally:
        rl.stop(serve)
        rl.stop(sandbox)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
