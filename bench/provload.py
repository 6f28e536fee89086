"""Provider calls per hour by endpoint, by the number of deposits waiting on a person.

Not a test. For each row: the sandbox with N deposits from unknown senders waiting for payer
details (`init`, no profile) plus 100 deposits in motion (details sent, under review), every
webhook lost; then one hour of what `serve` asks of the provider from its start (the first-start
catch-up, the history, detail, blocked and abnormal-fund polls at the default intervals, the
default request budget), on a virtual clock (worker.dev.polldriver): the sandbox, store, tracker
and rules are the real ones, the hour takes seconds. The 100 in motion stay young (under
`detail_young_s`) the whole hour: their detail is read every `detail_interval_s`, the worst case.

    .venv/bin/python bench/provload.py [--waiting 0 100 1000 10000] [--moving 100] [--hours 1]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.config.settings import ProviderSettings, SchedulerSettings
from worker.dev.polldriver import PollDriver

ENDPOINTS = ("history", "transaction_detail", "abnormal_funds")


async def one_row(waiting: int, moving: int, hours: float) -> tuple[dict[str, int], float]:
    """Calls by endpoint over `hours` from a start with these deposits; and the real seconds."""
    settings = SchedulerSettings()
    rate = ProviderSettings.model_fields["max_requests_per_s"].default
    with tempfile.TemporaryDirectory(prefix="provload-") as folder:
        driver = PollDriver(Path(folder), settings, max_requests_per_s=rate)
        await driver.start()
        try:
            driver.inject(waiting, "Waiting")
            driver.submitted(moving, "Moving")
            began = time.perf_counter()
            await driver.run(hours * 3600)
            took = time.perf_counter() - began
            return driver.calls.by_endpoint(), took
        finally:
            await driver.stop()


def main() -> None:
    """Print the table (Markdown) and the configuration it ran."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, nargs="+", default=[0, 100, 1000, 10_000])
    parser.add_argument("--moving", type=int, default=100)
    parser.add_argument("--hours", type=float, default=1.0)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    s = SchedulerSettings()
    rate = ProviderSettings.model_fields["max_requests_per_s"].default
    print(
        f"defaults: history_interval_s={s.history_interval_s:g} "
        f"detail_interval_s={s.detail_interval_s:g} detail_young_s={s.detail_young_s:g} "
        f"abnormal_interval_s={s.abnormal_interval_s:g} catchup_interval_s="
        f"{s.catchup_interval_s:g} page_size={s.page_size} "
        f"provider.max_requests_per_s={rate:g}; {args.moving} in motion; {args.hours:g} h"
    )
    print()
    print("| waiting on a person | history | transaction_detail | abnormal_funds | total / h |")
    print("|---:|---:|---:|---:|---:|")
    totals: dict[int, float] = {}
    for waiting in args.waiting:
        calls, took = asyncio.run(one_row(waiting, args.moving, args.hours))
        per_hour = {e: calls.get(e, 0) / args.hours for e in ENDPOINTS}
        total = sum(calls.values()) / args.hours
        totals[waiting] = total
        cells = " | ".join(f"{per_hour[e]:,.0f}" for e in ENDPOINTS)
        print(f"| {waiting:,} | {cells} | {total:,.0f} |  <!-- {took:.1f} s -->", flush=True)
    if 1000 in totals and 10_000 in totals:
        print(f"\n10,000 / 1,000 waiting: {totals[10_000] / totals[1000]:.2f}x the calls per hour")


if __name__ == "__main__":
    main()
