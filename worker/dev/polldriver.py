"""The leader's polls on a virtual clock against the sandbox, counting provider calls.

`PollDriver` runs what `serve` runs on the provider (the catch-up at start, the history, detail,
blocked and abnormal-fund polls at their intervals) one after another on a clock that jumps from
one due run to the next, so an hour of polling takes seconds: the sandbox, the store, the
tracker and the rules are the real ones, and the request budget waits on the same clock. For
`bench/provload.py` and the project's tests of what depositd asks of the provider
(docs/polling.md).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from worker.act.kinds import SPECS
from worker.act.reactor import RuleReactor
from worker.clock import now_ms
from worker.config.profiles import Profiles
from worker.config.settings import SchedulerSettings
from worker.dev.sandbox.app import SANDBOX_KEY, create_app
from worker.dev.sandbox.config import SandboxConfig
from worker.dev.sandbox.handle import Sandbox
from worker.dev.sandbox.testing import ENTITY_PAYER
from worker.poll.catchup import HistoryReader
from worker.poll.poller import Poller
from worker.provider.budget import RequestBudget
from worker.provider.client import ProviderClient
from worker.reconcile.abnormal import AbnormalPoll
from worker.rules import RuleBook
from worker.schedule.catchup import CatchUp
from worker.store.ledger import all_booked
from worker.store.sqlitestore import Store
from worker.track.processor import Processor

API_KEY = "polldriver-key"
API_SECRET = "polldriver-secret"
# Books every credited deposit; nothing else acts (no submission, no alert).
BOOK_RULES = "wallet: '*'\nrules:\n  - {name: book, on: [credited, completed], then: [book]}\n"
WALLET = 1001


@dataclass
class VirtualClock:
    """Epoch milliseconds that move only when told (or when the budget sleeps)."""

    ms: int = field(default_factory=now_ms)

    def __call__(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        """The same clock in seconds, for the request budget."""
        return self.ms / 1000

    async def sleep(self, seconds: float) -> None:
        """The budget's wait: the clock moves on by it."""
        self.ms += max(1, int(seconds * 1000 + 0.999))
        await asyncio.sleep(0)


@dataclass
class Calls:
    """Provider calls by endpoint and outcome."""

    seen: Counter[tuple[str, str]] = field(default_factory=Counter)

    def __call__(self, endpoint: str, outcome: str) -> None:
        self.seen[(endpoint, outcome)] += 1

    def by_endpoint(self) -> dict[str, int]:
        """Calls per endpoint, every outcome."""
        out: Counter[str] = Counter()
        for (endpoint, _), n in self.seen.items():
            out[endpoint] += n
        return dict(out)

    def total(self) -> int:
        """Every call."""
        return sum(self.seen.values())


class PollDriver:
    """A sandbox on loopback and one serve's polls on a virtual clock (see the module)."""

    def __init__(
        self,
        folder: Path,
        settings: SchedulerSettings,
        *,
        max_requests_per_s: float = 5.0,
    ) -> None:
        self.folder = folder
        self.settings = settings
        self.clock = VirtualClock()
        self.calls = Calls()
        self.budget = RequestBudget(
            max_requests_per_s, clock=self.clock.monotonic, sleep=self.clock.sleep
        )
        self._rate = max_requests_per_s
        self._runner: web.AppRunner | None = None
        self.sandbox: Sandbox | None = None
        self.client: ProviderClient | None = None
        self.store: Store | None = None
        self.poller: Poller | None = None
        self.catchup: CatchUp | None = None
        self.abnormal: AbnormalPoll | None = None

    async def start(self) -> None:
        """Start the sandbox and build the polls (nothing runs yet)."""
        app = create_app(
            SandboxConfig(api_key=API_KEY, api_secret=API_SECRET, fault_timeout_s=1),
            clock=self.clock,
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.sandbox = app[SANDBOX_KEY]
        self.sandbox.drop_webhooks(10**9)  # every webhook is lost: only the polls find things
        self.client = ProviderClient(
            f"http://127.0.0.1:{port}",
            API_KEY,
            API_SECRET,
            retries=0,
            timeout_s=30,
            on_call=self.calls,
            budget=self.budget,
        )
        self.store = Store(self.folder / "depositd.db")
        await self.store.open()
        rules_file = self.folder / "book.yaml"
        rules_file.write_text(BOOK_RULES, encoding="utf-8")
        rulebook = RuleBook.load(rules_file, specs=SPECS)
        reactor = RuleReactor(lambda: rulebook, Profiles.empty)
        processor = Processor(self.store, reactor=reactor)
        s = self.settings
        polls = self.client.for_polls()  # every read below waits for the budget, as serve's
        self.poller = Poller(self.client, self.store, processor.observe_fact, s, clock=self.clock)
        reader = HistoryReader(
            polls, self.store, lambda: reactor, page_size=s.page_size, max_pages=s.max_pages
        )
        self.catchup = CatchUp(reader, self.store, s, clock=self.clock)
        self.abnormal = AbnormalPoll(
            polls,
            self.store,
            lambda: rulebook,
            page_size=s.page_size,
            max_pages=s.max_pages,
            clock=self.clock,
        )

    async def stop(self) -> None:
        """Close the client, the store and the sandbox."""
        if self.client is not None:
            await self.client.close()
        if self.store is not None:
            await self.store.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- the provider's side ----------------------------------------------------------------

    def inject(self, n: int, prefix: str) -> list[str]:
        """`n` deposits from unknown sources (they wait with whiteListStatus init)."""
        assert self.sandbox is not None
        return [
            str(
                self.sandbox.inject_deposit(
                    WALLET, "USDT", "TRON", f"{i + 1}.25", f"T{prefix}{i:08d}"
                )["transactionId"]
            )
            for i in range(n)
        ]

    def submitted(self, n: int, prefix: str) -> list[str]:
        """`n` deposits whose details were sent (pending, under review: in motion)."""
        assert self.sandbox is not None
        ids = self.inject(n, prefix)
        for tx in ids:
            self.sandbox.submit(tx, ENTITY_PAYER)
        return ids

    async def booked(self) -> set[str]:
        """The transactionIds in the ledger."""
        assert self.store is not None
        rows = await self.store.read(all_booked)
        return {str(r["transaction_id"]) for r in rows}

    # --- the polls ----------------------------------------------------------------------------

    def _jobs(self) -> list[tuple[str, float, Callable[[], Awaitable[Any]]]]:
        assert self.poller is not None and self.catchup is not None
        assert self.abnormal is not None
        s = self.settings
        abnormal = self.abnormal
        return [
            ("catchup", s.catchup_interval_s, self.catchup.catch_up),
            ("history", s.history_interval_s, self.poller.poll_history),
            ("detail", s.detail_interval_s, self.poller.poll_detail),
            ("blocked", s.blocked_interval_s, self.poller.poll_blocked),
            ("abnormal", s.abnormal_interval_s, abnormal.run),
        ]

    async def run(
        self,
        seconds: float,
        *,
        at: dict[float, Callable[[], Any]] | None = None,
        after_run: Callable[[str, float], Awaitable[None]] | None = None,
    ) -> None:
        """Run the polls for `seconds` of virtual time from now, each at start and every
        interval, in the order `serve` starts them; `at` holds the provider's own moves
        (seconds from the start -> a call), `after_run(job, elapsed_s)` is awaited after each
        poll's run."""
        start = self.clock.ms
        end = start + int(seconds * 1000)
        moves = sorted((at or {}).items())
        due = {name: start for name, _, _ in self._jobs()}
        while True:
            jobs = self._jobs()
            next_ms = min(due.values())
            while moves and start + int(moves[0][0] * 1000) <= min(next_ms, end):
                offset, move = moves.pop(0)
                self.clock.ms = max(self.clock.ms, start + int(offset * 1000))
                move()
            if next_ms >= end:
                break
            self.clock.ms = max(self.clock.ms, next_ms)
            for name, interval_s, job in jobs:
                if due[name] <= self.clock.ms:
                    await job()
                    due[name] += int(interval_s * 1000)
                    if after_run is not None:
                        await after_run(name, (self.clock.ms - start) / 1000)
        self.clock.ms = max(self.clock.ms, end)
