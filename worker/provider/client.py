"""`ProviderClient`: every call of the provider's interface, over one signed, retrying
transport (`worker.provider.transport`, where the errors each call may raise are listed).

The calls are grouped as the interface groups them: the deposit flow (`deposit_calls`), wallets
(`wallet_calls`), stable orders and abnormal funds (`stable_calls`), virtual accounts and the
partner's settlement, onboarding and quotes (`partner_calls`). Paths and payload shapes are those
of the provider interface and docs/design.md (see `worker.provider.models`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from worker.provider.budget import RequestBudget
from worker.provider.deposit_calls import DepositCalls
from worker.provider.partner_calls import PartnerCalls
from worker.provider.stable_calls import StableCalls
from worker.provider.transport import OUTCOMES, Envelope, OnCall
from worker.provider.wallet_calls import WalletCalls

if TYPE_CHECKING:
    from worker.config.settings import ProviderSettings

__all__ = ["OUTCOMES", "Envelope", "OnCall", "ProviderClient"]


class ProviderClient(DepositCalls, WalletCalls, StableCalls, PartnerCalls):
    """Signed, retrying client of the provider's wallet, stable and partner endpoints."""

    @classmethod
    def from_settings(
        cls,
        settings: ProviderSettings,
        *,
        retries: int = 3,
        on_call: OnCall | None = None,
        on_wait: Callable[[str, float], None] | None = None,
    ) -> ProviderClient:
        """A client for the configured provider (base URL, credentials, scheme, timeout,
        request budget; `on_wait(endpoint, seconds)` after a poll's call waited on it)."""
        return cls(
            settings.base_url,
            settings.api_key.get_secret_value(),
            settings.api_secret.get_secret_value(),
            scheme=settings.scheme,
            timeout_s=settings.timeout_s,
            retries=retries,
            on_call=on_call,
            max_answer_bytes=settings.max_answer_bytes,
            budget=RequestBudget(settings.max_requests_per_s, on_wait=on_wait),
        )

    async def __aenter__(self) -> ProviderClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
