"""The virtual account and partner calls: e-mail verification, onboarding (KYC/KYB sharing),
quotes and the daily settlement report; the interface's "Send e-mail verification code",
"Share KYC/KYB for onboarding", "Quote (partner)" and "Daily settlement records".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any

from pydantic import BaseModel

from worker.logs import get_logger
from worker.provider.answers import Envelope
from worker.provider.paging import DEFAULT_MAX_PAGES
from worker.provider.resources import (
    OnboardingResponse,
    QuoteResponse,
    SettlementDaily,
    SettlementQuery,
    SettlementRecord,
)
from worker.provider.transport import Transport

log = get_logger(__name__)


class PartnerCalls(Transport):
    """E-mail verification, onboarding, quotes and the settlement report."""

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
