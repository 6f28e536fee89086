"""The console's shared objects and what it needs from the running service."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from worker.config.profiles import Profiles
from worker.config.settings import ConsoleSettings
from worker.console.auth import Sessions, Throttle, TokenFile, origin_of
from worker.rules import RuleBook
from worker.store.sqlitestore import Store


class Operations(Protocol):
    """What the console asks of the running service (`worker.service.runtime.Runtime`)."""

    async def read_detail(self, transaction_id: str) -> bool:
        """Read one deposit's detail now and feed it to the tracker; False when it failed."""

    async def reconcile(self, day: dt.date) -> str:
        """Reconcile one day now; a short outcome."""

    async def travel_rule_link(self, wallet_id: int, transaction_id: str, lng: str) -> str:
        """A fresh URL of the hosted Travel Rule page for one deposit."""

    def webhook_checks(self) -> dict[str, Any]:
        """What every stored webhook passed at receipt (an evidence bundle states it)."""

    @property
    def profiles(self) -> Profiles:
        """The payer profiles in force (the console shows their names only)."""

    @property
    def rules(self) -> RuleBook:
        """The rules in force (the overview reads their deadlines)."""

    def wake(self) -> None:
        """Rows were set back to pending: run them now."""


class Console:
    """The console's shared objects, held by its app under `CONSOLE`."""

    def __init__(
        self,
        settings: ConsoleSettings,
        store: Store,
        ops: Operations,
        wake_processor: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.ops = ops
        self.wake_processor = wake_processor
        self.sessions = Sessions(settings.session_ttl_s)
        self.throttle = Throttle()
        self.tokens = TokenFile(settings.token_file)
        self.hosted_origin = origin_of(settings.hosted_url) if settings.hosted_url else None
        # What is being run for an operator now ("reconcile:DAY", "detail:TX"): a second
        # request for the same (a double click, a second tab) is refused, not run twice.
        self.running: set[str] = set()


CONSOLE = web.AppKey("console", Console)
