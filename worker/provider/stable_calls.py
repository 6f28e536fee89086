"""The stable calls: abnormal funds (money that matched no order), stable order detail and
collection order status; the interface's "Abnormal funds list", "Stable order detail" and the
collection order among its other named operations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any

from pydantic import BaseModel, ValidationError

from worker.logs import get_logger
from worker.provider.answers import first_problem
from worker.provider.models import CollectionOrderStatus, Page
from worker.provider.paging import DEFAULT_MAX_PAGES, pages
from worker.provider.resources import AbnormalFund, AbnormalFundPage, StableOrderDetail
from worker.provider.transport import Transport, model_of

log = get_logger(__name__)


def abnormal_page(data: Any) -> AbnormalFundPage:
    """An abnormal-fund page; a record without a readable id (or amount) is logged (its index
    and the problem only: a record carries payer data) and left out, the rest is read."""
    page = model_of("abnormal_funds", Page[dict[str, Any]], data)
    funds: list[AbnormalFund] = []
    for index, record in enumerate(page.records):
        try:
            funds.append(AbnormalFund.model_validate(record))
        except ValidationError as exc:
            log.warning(
                "abnormal fund record skipped; poll goes on",
                record=index,
                pageNumber=page.pageNumber,
                error=first_problem(exc),
            )
    return AbnormalFundPage(
        pageNumber=page.pageNumber,
        pageSize=page.pageSize,
        totalPage=page.totalPage,
        totalRow=page.totalRow,
        records=funds,
        refused=len(page.records) - len(funds),
    )


class StableCalls(Transport):
    """Abnormal funds, stable orders and collection orders."""

    async def abnormal_funds(self, body: Mapping[str, Any] | BaseModel) -> AbnormalFundPage:
        """One page of abnormal-fund records (a read, though the interface uses POST)."""
        return await self._call(
            "abnormal_funds",
            "POST",
            "/v1/stable/collect/abnormal-fund/list",
            body=body,
            parse=abnormal_page,
        )

    async def iter_abnormal_funds(
        self, *, page_size: int = 50, max_pages: int = DEFAULT_MAX_PAGES, **filters: Any
    ) -> AsyncIterator[AbnormalFund]:
        """Every abnormal fund matching `filters` (the list body's keys: statuses, network,
        currency, searchKeyword, startTime, endTime), one page in memory at a time."""

        async def fetch(page_num: int) -> AbnormalFundPage:
            return await self.abnormal_funds(
                {**filters, "pageNum": page_num, "pageSize": page_size}
            )

        async for record in pages(fetch, max_pages, what="abnormal funds"):
            yield record

    async def stable_order_detail(
        self, *, merchant_order_id: str | None = None, order_id: str | None = None
    ) -> StableOrderDetail:
        """A stable order by merchantOrderId or orderId (success false is a business error)."""
        if merchant_order_id is None and order_id is None:
            raise ValueError("stable_order_detail needs merchant_order_id or order_id")
        query = {"merchantOrderId": merchant_order_id, "orderId": order_id}
        return await self._call(
            "stable_order_detail",
            "GET",
            "/v1/stable/order/query-detail",
            query=query,
            parse=partial(self._model, "stable_order_detail", StableOrderDetail),
        )

    async def collection_order_status(self, **query: Any) -> CollectionOrderStatus:
        """Collection order status (carries whiteListStatus), by the provider's query keys."""
        return await self._call(
            "collection_order_status",
            "GET",
            "/v2/stable/collect/order-status",
            query=query,
            parse=partial(self._model, "collection_order_status", CollectionOrderStatus),
        )
