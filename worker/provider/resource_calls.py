"""The provider calls beyond the deposit whitelist and wallet: abnormal funds, stable and
collection orders, e-mail verification, onboarding, quotes, the daily settlement report and the
deposit Travel Rule link, each returning its typed model; and paging helpers that hold one page
in memory at a time.

`ResourceCalls` is a base of `worker.provider.client.ProviderClient`, which supplies the
transport (`_call`) and answer reading (`_model`); every envelope form's failure is the same
`ProviderBusinessError` with code, message and trace id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from worker.logs import get_logger
from worker.provider.answers import Envelope, first_problem
from worker.provider.models import CollectionOrderStatus, Page, TravelRuleLink
from worker.provider.paging import DEFAULT_MAX_PAGES, pages
from worker.provider.resources import (
    AbnormalFund,
    AbnormalFundPage,
    OnboardingResponse,
    QuoteResponse,
    SettlementDaily,
    SettlementQuery,
    SettlementRecord,
    StableOrderDetail,
)

log = get_logger(__name__)


def _abnormal_page(model: Callable[[str, type[Any], Any], Any], data: Any) -> AbnormalFundPage:
    """An abnormal-fund page; a record without a readable id (or amount) is logged (its index
    and the problem only: a record carries payer data) and left out, the rest is read."""
    page = model("abnormal_funds", Page[dict[str, Any]], data)
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


M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class ResourceCalls:
    """Typed calls of the stable, virtual account and partner operations."""

    async def _call(
        self,
        endpoint: str,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | BaseModel | None = None,
        idempotency_key: str | None = None,
        envelope: Envelope = Envelope.WALLET,
        retry: bool = True,
        parse: Callable[[Any], T] = ...,
    ) -> T:
        """One logical call (supplied by `ProviderClient`)."""
        raise NotImplementedError

    @staticmethod
    def _model(endpoint: str, model: type[M], data: Any) -> M:
        """An answer's data as `model` (supplied by `ProviderClient`)."""
        raise NotImplementedError

    async def abnormal_funds(self, body: Mapping[str, Any] | BaseModel) -> AbnormalFundPage:
        """One page of abnormal-fund records (a read, though the interface uses POST)."""
        return await self._call(
            "abnormal_funds",
            "POST",
            "/v1/stable/collect/abnormal-fund/list",
            body=body,
            parse=partial(_abnormal_page, self._model),
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

    async def send_email_verify_code(self, email: str) -> None:
        """Ask the provider to e-mail a verification code (virtual accounts, pixKeyType EMAIL)."""
        # Not retried: a repeated send would mail a second code and void the first.
        await self._call(
            "send_email_verify_code",
            "POST",
            "/v1/virtual-account/email/send-verify-code",
            body={"email": email},
            envelope=Envelope.EMAIL,
            retry=False,
        )

    async def onboarding_kyc_share(self, body: Mapping[str, Any] | BaseModel) -> OnboardingResponse:
        """Share KYC/KYB for onboarding; request_id in the body makes a retry the same request."""
        return await self._call(
            "onboarding_kyc_share",
            "POST",
            "/api/v1/onboarding/kyc-share",
            body=body,
            envelope=Envelope.PARTNER,
            parse=partial(self._model, "onboarding_kyc_share", OnboardingResponse),
        )

    async def quote(self, body: Mapping[str, Any] | BaseModel) -> QuoteResponse:
        """A partner quote (valid until its expires_at)."""
        return await self._call(
            "quote",
            "POST",
            "/api/v1/quotes",
            body=body,
            envelope=Envelope.PARTNER,
            parse=partial(self._model, "quote", QuoteResponse),
        )

    async def settlement_daily_records(
        self, query: SettlementQuery | None = None, **params: Any
    ) -> SettlementDaily:
        """One page of the daily settlement report; query keys as the provider spells them
        (settlement_date, timezone, asset, network, business_type, record_type,
        reconciliation_status, page, page_size), as a `SettlementQuery` or keywords."""
        merged = {**(query.to_query() if query is not None else {}), **params}
        return await self._call(
            "settlement_daily_records",
            "GET",
            "/api/v1/settlement/daily-records",
            query=merged,
            envelope=Envelope.PARTNER,
            parse=partial(self._model, "settlement_daily_records", SettlementDaily),
        )

    async def iter_settlement_records(
        self, *, page_size: int = 100, max_pages: int = DEFAULT_MAX_PAGES, **params: Any
    ) -> AsyncIterator[SettlementRecord]:
        """Every record of a day's settlement report, one page in memory at a time."""
        previous: list[SettlementRecord] | None = None
        page = 1
        while True:
            daily = await self.settlement_daily_records(
                **{**params, "page": page, "page_size": page_size}
            )
            if previous is not None and daily.records == previous:
                log.warning("paging stopped: page repeats the previous one", paged="settlement")
                return
            for record in daily.records:
                yield record
            if not daily.records or page * daily.page_size >= daily.total:
                return
            if page >= max_pages:
                log.warning("paging stopped at the page cap", paged="settlement", pages=page)
                return
            previous = daily.records
            page += 1

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
