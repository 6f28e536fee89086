"""The wallet calls: wallets and their balances, a wallet's deposit address, sub-wallets and the
withdraw whitelist; the interface's "List wallets" and its other named wallet operations.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from pydantic import BaseModel

from worker.provider.models import AssetBalance
from worker.provider.resources import WalletGroup
from worker.provider.transport import Transport


class WalletCalls(Transport):
    """Wallets, balances, deposit addresses, sub-wallets and the withdraw whitelist."""

    async def deposit_address(
        self, wallet_id: int, currency: str | None = None, network: str | None = None
    ) -> dict[str, Any]:
        """The deposit address of a wallet (payload not shown by the interface: a dict)."""
        query = {"walletId": wallet_id, "currency": currency, "network": network}
        return await self._call(
            "deposit_address",
            "GET",
            "/v1/wallet/deposit-address",
            query=query,
            parse=partial(self._dict, "deposit_address"),
        )

    async def asset_balance(
        self, wallet_id: int, currency: str | None = None
    ) -> list[AssetBalance]:
        """Available and unavailable balances of a wallet, per currency."""
        query = {"walletId": wallet_id, "currency": currency}

        def rows(data: Any) -> list[AssetBalance]:
            if isinstance(data, dict):
                data = [data]
            return [
                self._model("asset_balance", AssetBalance, row)
                for row in self._list("asset_balance", data)
            ]

        return await self._call(
            "asset_balance", "GET", "/v1/wallet/asset-balance", query=query, parse=rows
        )

    async def create_sub_wallet(
        self, body: Mapping[str, Any] | BaseModel, *, idempotency_key: str
    ) -> Any:
        """Create a sub-wallet; the answer's data as given."""
        return await self._call(
            "create_sub_wallet",
            "POST",
            "/v1/wallet/create/sub",
            body=body,
            idempotency_key=idempotency_key,
        )

    async def add_withdraw_whitelist(
        self, body: Mapping[str, Any] | BaseModel, *, idempotency_key: str
    ) -> Any:
        """Add a withdraw whitelist entry; the answer's data as given."""
        return await self._call(
            "add_withdraw_whitelist",
            "POST",
            "/v1/wallet/add-withdraw-whitelist",
            body=body,
            idempotency_key=idempotency_key,
        )

    async def list_wallets(self, wallet_id: int | None = None) -> list[WalletGroup]:
        """Wallet groups (operation_prime, collection_prime) with their balances."""

        def groups(data: Any) -> list[WalletGroup]:
            return [
                self._model("list_wallets", WalletGroup, row)
                for row in self._list("list_wallets", data or [])
            ]

        return await self._call(
            "list_wallets", "GET", "/v1/wallet/list", query={"walletId": wallet_id}, parse=groups
        )
