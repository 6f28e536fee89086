"""Resident memory of `depositd serve` (its main process; the ingress process apart) after it
tracks 100k deposits, and after it polls a 100k-record history.

Not a test. The realistic configuration (bench/realistic.py), two fresh runs:

- webhooks: `--count` credited-deposit notifications (as bench/ingest.py sends) from wrk, then
  the processor works them off; RSS once nothing is pending.
- history: a provider (the sandbox's application, its state filled with `--count` deposit orders
  waiting for payer details, from an address no profile covers) answers the scheduler's work-queue
  poll; page size 500 and as many pages per run as the history holds (with the default cap, 100
  pages, every run re-reads the first 50k records and never reaches the rest). RSS once every
  order is tracked and the pending events are processed.

    .venv/bin/python bench/memory.py [--count 100000] [--only webhooks|history]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import realistic as rl
from ingest import write_requests
from load import run_load, summary


def provider(config: str, count: int) -> None:
    """The sandbox's app with `count` deposit orders in wallet 1001 waiting for payer details."""
    from aiohttp import web

    from worker.config.settings import load_settings
    from worker.dev.sandbox.app import SANDBOX_KEY, create_app
    from worker.dev.sandbox.cli import listen_address, sandbox_config
    from worker.dev.sandbox.records import Order
    from worker.provider.models import CreditStatus, OrderStatus, WhiteListStatus

    settings = load_settings(Path(config))
    app = create_app(sandbox_config(settings))
    orders = app[SANDBOX_KEY].state.orders
    now = int(time.time() * 1000)
    for n in range(count):
        tx = f"hist-{n:07d}"
        orders[tx] = Order(
            transaction_id=tx,
            transaction_hash=f"0x{n:064x}",
            wallet_id=1001,
            wallet_name="Main USDT",
            currency="USDT",
            network="TRON",
            amount=Decimal("250.5"),
            from_address=f"TUnknownPayer{n:021d}",
            to_address="TXYZmerchantDepositAddress0000000001",
            status=OrderStatus.PROCESSING,
            white_list_status=WhiteListStatus.INIT,
            credit_status=CreditStatus.PENDING,
            create_time=now - count + n,
            update_time=now - count + n,
        )
    host, port = listen_address(settings.provider.base_url)
    web.run_app(app, host=host, port=port, print=None, access_log=None)


def tracked(db: Path) -> int:
    """Deposits in depositd's database."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM deposits").fetchone()[0])
    finally:
        conn.close()


def settle(db: Path, want: int, limit_s: float) -> float:
    """Wait until `want` deposits are tracked and no event is pending; seconds taken."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if tracked(db) >= want and not rl.lag(db)[0]:
            break
        time.sleep(0.5)
    return time.monotonic() - t0


def webhooks(tmp: Path, count: int) -> None:
    """RSS after tracking `count` deposits from webhooks."""
    config, port, db, sport = rl.write_config(tmp, "hooks", light=False)
    sandbox = rl.start_sandbox(config, sport, tmp / "hooks-sandbox.log")
    serve = rl.start_serve(config, port, tmp / "hooks.log")
    try:
        start = rl.rss_mb(serve.pid)
        reqs = tmp / "requests.tsv"
        write_requests(reqs, 0, count, 1)
        sent = 0
        while tracked(db) < count and sent < 5:  # wrk wraps around: unique ids are sent once
            d = summary(run_load(port, reqs, 50, max(5.0, count / 3000), tmp))
            sent += 1
            if d["wraps"]:
                break
        took = settle(db, count, 900)
        print(
            f"| after tracking {tracked(db)} deposits from webhooks | {start:.0f} MB "
            f"| {rl.rss_mb(serve.pid):.0f} MB | settled {took:.0f} s after the load |"
        )
    finally:
        rl.stop(serve)
        rl.stop(sandbox)


def history(tmp: Path, count: int) -> None:
    """RSS after polling a `count`-record history."""
    config, port, db, sport = rl.write_config(tmp, "hist", light=False)
    cfg = json.loads(config.read_text())
    # Each history run reads at most max_pages pages from the first: let one run reach them all.
    cfg["scheduler"]["page_size"] = 500
    cfg["scheduler"]["max_pages"] = max(100, -(-count // 500))
    config.write_text(json.dumps(cfg))
    fake = rl.spawn([__file__, "provider", str(config), str(count)], tmp / "provider.log")
    rl.wait_url(f"http://127.0.0.1:{sport}/_sandbox/webhooks/idle", fake, 120)
    serve = rl.start_serve(config, port, tmp / "hist.log")
    try:
        start = rl.rss_mb(serve.pid)
        took = settle(db, count, 1200)
        print(
            f"| after polling a {count}-record history ({tracked(db)} tracked) | {start:.0f} MB "
            f"| {rl.rss_mb(serve.pid):.0f} MB | settled {took:.0f} s after start |"
        )
    finally:
        rl.stop(serve)
        rl.stop(fake)


def main() -> None:
    """Both measurements (or one)."""
    if len(sys.argv) > 1 and sys.argv[1] == "provider":
        provider(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--only", choices=["webhooks", "history"])
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="depositd-memory-"))
    try:
        print("realistic configuration; RSS of the main serve process (VmRSS)")
        print("| case | RSS at start | RSS after | |\n|---|---|---|---|")
        if args.only in (None, "webhooks"):
            webhooks(tmp, args.count)
        if args.only in (None, "history"):
            history(tmp, args.count)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
