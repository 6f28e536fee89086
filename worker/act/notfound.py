"""10000100 on a submission ("transaction not found, or not owned by the caller"): is it gone?

The interface's answer to 10000100 is to re-read the history queue: a deposit still waiting for
payer details is listed with whiteListStatus `init` (and, after a rejection, `rejected`). So the
two queues are read first (every page, narrowed to the deposit's wallet when known), then the
transaction detail; only a deposit found in neither queue whose detail also answers 10000100 is
really gone. Whatever was found is fed to the tracker like a poll.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from worker.clock import now_ms
from worker.errors import StorageError
from worker.logs import get_logger
from worker.provider.client import ProviderClient
from worker.provider.models import DepositOrder, WhiteListStatus
from worker.track.facts import fact_from_order
from worker.track.tracker import Fact

log = get_logger(__name__)

QUEUES = ("init", "rejected")


@dataclass(frozen=True)
class Reread:
    """What the history queues and the detail said about a deposit after 10000100."""

    queue: str | None  # the history queue listing it (init or rejected); None: neither
    detail: DepositOrder | None  # its transaction detail; None: the detail answered 10000100

    @property
    def gone(self) -> bool:
        """Listed in no queue and unknown to the detail: the provider no longer has it."""
        return self.queue is None and self.detail is None

    @property
    def waits_for_details(self) -> bool:
        """Still waiting for a first submission (init queue, or a detail reading init)."""
        if self.detail is not None and self.detail.whiteListStatus is not None:
            return self.detail.whiteListStatus is WhiteListStatus.INIT
        return self.queue == "init"

    def describe(self) -> str:
        """Where it was found, for the row's outcome and the alert."""
        if self.gone:
            return (
                "not in the history queues (init, rejected) and its detail answers 10000100:"
                " the provider no longer has it"
            )
        where = f"listed in the {self.queue} queue" if self.queue else "in no history queue"
        if self.detail is None:
            return f"{where}; its detail answers 10000100"
        status = self.detail.whiteListStatus
        shown = status.value if status is not None else "null"
        return f"{where}; its detail reads whiteListStatus {shown}"


async def find_in_queues(
    client: ProviderClient,
    transaction_id: str,
    *,
    wallet_id: int | None,
    observe: Callable[[Fact], Awaitable[Any]],
) -> str | None:
    """The history queue (init, then rejected) that lists the deposit, or None; a record found
    is fed to the tracker. Provider errors propagate (gone or not cannot be told then)."""
    filters: dict[str, Any] = {} if wallet_id is None else {"wallet_id": wallet_id}
    for queue in QUEUES:
        found: DepositOrder | None = None
        sent_at = now_ms()  # what the queue lists held then or later (`fact_from_order`)
        async for order in client.iter_history(white_list_status=queue, **filters):
            if order.transactionId == transaction_id:
                found = order
                break
        if found is None:
            continue
        try:
            await observe(fact_from_order(found, source="poll", sent_at=sent_at))
        except StorageError as exc:  # the database unavailable: one line, no traceback
            log.error(
                "history record read; its fact not recorded now",
                transactionId=transaction_id,
                error=str(exc),
            )
        except Exception:
            # What was read still decides the submission's row; the polls record it later.
            log.exception(
                "history record read; its fact not recorded now", transactionId=transaction_id
            )
        return queue
    return None
