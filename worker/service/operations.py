"""What the operator console asks of the runtime (`worker.console.state.Operations`): a
deposit's detail read now, a day reconciled again, a Travel Rule link, the outbox woken, what
webhooks passed at receipt.

`ConsoleOperations` is a part of `worker.service.runtime.Runtime`, which sets the attributes it
names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from worker.act.outbox import Outbox
from worker.config.settings import Settings
from worker.errors import ProviderError
from worker.ingest.receipt import checks_at_receipt
from worker.poll.poller import Observe, Poller
from worker.provider.client import ProviderClient
from worker.reconcile.reconciler import Reconciler
from worker.rules import RuleBook
from worker.store.sqlitestore import Store


class ConsoleOperations:
    """The runtime's answers to the operator console."""

    settings: Settings
    store: Store | None
    client: ProviderClient | None
    outbox: Outbox | None
    poller: Poller | None
    _reader: Poller | None
    _jobs_args: tuple[Observe, list[Callable[[], None]]] | None
    _poll_backoff_s: float

    if TYPE_CHECKING:

        @property
        def rules(self) -> RuleBook: ...

        async def alert(self, condition: str, severity: str, detail: str) -> None: ...

    async def read_detail(self, transaction_id: str) -> bool:
        """Read one deposit's detail now and feed it to the tracker, as the detail poll does;
        False when it failed (the log says why)."""
        return await self._detail_reader().read_detail(transaction_id)

    def _detail_reader(self) -> Poller:
        """The leader's poller; on a follower a poller of its own that only reads details on
        demand (never scheduled): a read and a fact through the store, safe on any instance."""
        if not self.settings.scheduler.enabled:
            raise ProviderError("the provider is not polled here (scheduler.enabled: false)")
        if self.poller is not None:
            return self.poller
        if self._jobs_args is None or self.client is None or self.store is None:
            raise ProviderError("the service is still starting; try again in a moment")
        if self._reader is None:
            self._reader = Poller(
                self.client,
                self.store,
                self._jobs_args[0],
                self.settings.scheduler,
                alert=self.alert,
                backoff_s=self._poll_backoff_s,
            )
        return self._reader

    def webhook_checks(self) -> dict[str, Any]:
        """What every stored webhook passed at receipt, with the settings in force now."""
        return checks_at_receipt(self.settings.webhook)

    async def reconcile(self, day: dt.date) -> str:
        """Reconcile one day again now, as `depositd reconcile --date` does; the outcome."""
        assert self.client is not None and self.store is not None
        wake = self.outbox.wake if self.outbox is not None else None
        reconciler = Reconciler(
            self.client,
            self.store,
            lambda: self.rules,
            after_commit=wake,
            drift_after_s=self.settings.scheduler.detail_interval_s,
        )
        result = await reconciler.run(day)
        if result.outcome == "failed":
            return f"failed: {result.error}"
        return f"{result.outcome} ({len(result.findings)} finding(s))"

    async def travel_rule_link(self, wallet_id: int, transaction_id: str, lng: str) -> str:
        """A fresh URL of the provider's hosted Travel Rule page, deep-linked to one deposit."""
        if self.client is None:
            raise ProviderError("the provider client is not running")
        link = await self.client.travel_rule_link(wallet_id, transaction_id=transaction_id, lng=lng)
        return link.url

    def wake(self) -> None:
        """Rows set back to pending: run them now rather than at the next sweep."""
        if self.outbox is not None:
            self.outbox.wake()
