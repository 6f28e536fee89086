"""The deposit flow's calls: the deposit whitelist (source addresses, payer details submitted
for a received deposit), the deposit readings (history, transaction detail) and the hosted
deposit Travel Rule page; the interface's "Deposit whitelist and deposit reading" and "Hosted
deposit Travel Rule page".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any

from pydantic import ValidationError

from worker.errors import ProviderAnswerMismatch
from worker.logs import get_logger
from worker.provider.answers import first_problem
from worker.provider.models import (
    DepositOrder,
    Options,
    Page,
    SourceAddress,
    SubmitResult,
    TravelRuleLink,
)
from worker.provider.paging import DEFAULT_MAX_PAGES, pages
from worker.provider.transport import Transport, build_target, model_of, segment

log = get_logger(__name__)


def _history_page(data: Any) -> Page[DepositOrder]:
    """A history page; a record that is not a valid deposit order (an impossible amount, a
    missing field) is logged and left out, the rest of the page is read."""
    page = model_of("history", Page[dict[str, Any]], data)
    orders: list[DepositOrder] = []
    for index, record in enumerate(page.records):
        try:
            orders.append(DepositOrder.model_validate(record))
        except ValidationError as exc:
            tx = record.get("transactionId")
            log.warning(
                "history record refused; poll goes on",
                transactionId=tx[:80] if isinstance(tx, str) else None,
                record=index,
                pageNumber=page.pageNumber,
                error=first_problem(exc),
            )
    return Page[DepositOrder](
        pageNumber=page.pageNumber,
        pageSize=page.pageSize,
        totalPage=page.totalPage,
        totalRow=page.totalRow,
        records=orders,
        refused=len(page.records) - len(orders),
    )


class DepositCalls(Transport):
    """The deposit whitelist and deposit reading calls."""

    async def options(self) -> list[str]:
        """Provider (VASP) names from the options endpoint."""

        def names(data: Any) -> list[str]:
            if isinstance(data, list):
                data = {"providers": data}
            return self._model("options", Options, data).names()

        return await self._call(
            "options", "GET", "/v1/wallet/deposit-whitelist/options", parse=names
        )

    async def register_address(
        self, body: Mapping[str, Any], *, idempotency_key: str
    ) -> SourceAddress:
        """Register a source address with payer details; the record starts PROCESSING."""
        return await self._call(
            "register_address",
            "POST",
            "/v1/wallet/deposit-whitelist/addresses",
            body=body,
            idempotency_key=idempotency_key,
            parse=partial(self._model, "register_address", SourceAddress),
        )

    async def list_addresses(
        self, *, page_num: int = 1, page_size: int = 50, status: str | None = None
    ) -> Page[SourceAddress]:
        """One page of registered source addresses, optionally of one status."""
        return await self._call(
            "list_addresses",
            "GET",
            "/v1/wallet/deposit-whitelist/addresses",
            query={"pageNum": page_num, "pageSize": page_size, "status": status},
            parse=partial(self._model, "list_addresses", Page[SourceAddress]),
        )

    async def address_detail(self, address_id: str) -> SourceAddress:
        """One source address record."""
        path = f"/v1/wallet/deposit-whitelist/addresses/{segment(address_id)}"
        return await self._call(
            "address_detail",
            "GET",
            path,
            parse=partial(self._model, "address_detail", SourceAddress),
        )

    async def disable_address(
        self, address_id: str, *, idempotency_key: str
    ) -> SourceAddress | None:
        """Disable a source address; the record if the provider returns one."""
        path = f"/v1/wallet/deposit-whitelist/addresses/{segment(address_id)}/disable"

        # An empty JSON object rather than no body: servers that always parse JSON accept it.
        def record(data: Any) -> SourceAddress | None:
            return None if data is None else self._model("disable_address", SourceAddress, data)

        return await self._call(
            "disable_address", "POST", path, body={}, idempotency_key=idempotency_key, parse=record
        )

    async def submit_payer(
        self, transaction_id: str, body: Mapping[str, Any], *, idempotency_key: str
    ) -> SubmitResult:
        """Submit payer details for a received deposit (whiteListStatus becomes pending)."""
        path = f"/v1/wallet/deposit-whitelist/transactions/{segment(transaction_id)}/submit"
        return await self._call(
            "submit_payer",
            "POST",
            path,
            body=body,
            idempotency_key=idempotency_key,
            parse=partial(self._model, "submit_payer", SubmitResult),
        )

    async def transaction_detail(
        self, transaction_id: str, *, alt_path: bool = False
    ) -> DepositOrder:
        """Transaction detail (the only reading that carries creditStatus)."""
        if alt_path:
            path = build_target("/v1/wallet/transaction/detail", {"transactionId": transaction_id})
        else:
            path = f"/v1/wallet/transactions/{segment(transaction_id)}"
        order: DepositOrder = await self._call(
            "transaction_detail",
            "GET",
            path,
            parse=partial(self._model, "transaction_detail", DepositOrder),
        )
        if order.transactionId != transaction_id:
            # Another deposit's record (even one differing only in case) must never be taken
            # for this one: it would be tracked, and booked, as a deposit of its own.
            raise ProviderAnswerMismatch("transaction_detail", transaction_id, order.transactionId)
        return order

    async def history(
        self,
        *,
        white_list_status: str | None = None,
        page_num: int = 1,
        page_size: int = 50,
        wallet_id: int | None = None,
        currency: str | None = None,
        start_time: int | None = None,
        end_time: int | None = None,
        alt_path: bool = False,
    ) -> Page[DepositOrder]:
        """One page of deposit history (the work queue with whiteListStatus init/rejected)."""
        path = "/v1/wallet/transaction/list" if alt_path else "/v1/wallet/history"
        query = {
            "whiteListStatus": white_list_status,
            "pageNum": page_num,
            "pageSize": page_size,
            "walletId": wallet_id,
            "currency": currency,
            "startTime": start_time,
            "endTime": end_time,
        }
        return await self._call(
            "history",
            "GET",
            path,
            query=query,
            parse=_history_page,
        )

    async def history_records(
        self,
        *,
        page_num: int = 1,
        page_size: int = 50,
        wallet_id: int | None = None,
        start_time: int | None = None,
        end_time: int | None = None,
    ) -> Page[dict[str, Any]]:
        """One page of the full transaction history (no whiteListStatus filter), its records
        as sent: the caller reads each one, so one unreadable record does not lose its page."""
        query = {
            "pageNum": page_num,
            "pageSize": page_size,
            "walletId": wallet_id,
            "startTime": start_time,
            "endTime": end_time,
        }
        return await self._call(
            "history",
            "GET",
            "/v1/wallet/history",
            query=query,
            parse=partial(self._model, "history", Page[dict[str, Any]]),
        )

    async def iter_history(
        self,
        *,
        white_list_status: str,
        page_size: int = 50,
        max_pages: int = DEFAULT_MAX_PAGES,
        **filters: Any,
    ) -> AsyncIterator[DepositOrder]:
        """Every deposit of the history filter, fetching one page at a time as consumed (at
        most `max_pages` pages; see `pages`)."""

        async def fetch(page_num: int) -> Page[DepositOrder]:
            return await self.history(
                white_list_status=white_list_status,
                page_num=page_num,
                page_size=page_size,
                **filters,
            )

        async for order in pages(fetch, max_pages, what=f"history {white_list_status}"):
            yield order

    async def iter_addresses(
        self, *, status: str | None = None, page_size: int = 50, max_pages: int = DEFAULT_MAX_PAGES
    ) -> AsyncIterator[SourceAddress]:
        """Every registered source address (of one status), one page at a time as consumed."""

        async def fetch(page_num: int) -> Page[SourceAddress]:
            return await self.list_addresses(page_num=page_num, page_size=page_size, status=status)

        async for record in pages(fetch, max_pages, what=f"addresses {status or 'all'}"):
            yield record

    async def travel_rule_link(
        self, wallet_id: int, *, transaction_id: str | None = None, lng: str = "en"
    ) -> TravelRuleLink:
        """A short-lived URL of the hosted deposit Travel Rule page (deep link to one deposit
        with `transaction_id`)."""
        body: dict[str, Any] = {"walletId": wallet_id, "lng": lng}
        if transaction_id is not None:
            body["transactionId"] = transaction_id
        return await self._call(
            "travel_rule_link",
            "POST",
            "/v1/wallet/deposit-whitelist/travel-rule-link",
            body=body,
            parse=partial(self._model, "travel_rule_link", TravelRuleLink),
        )
