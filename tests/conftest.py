"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

PROVIDER_NAMES = ("Binance", "OKX", "Coinbase")

ProfileFactory = Callable[..., dict[str, Any]]


@pytest.fixture
def provider_names() -> tuple[str, ...]:
    """Provider names as the options endpoint would list them."""
    return PROVIDER_NAMES


@pytest.fixture
def entity_payer() -> ProfileFactory:
    """A factory of valid ENTITY payer details; keyword arguments override (None drops a key)."""

    def make(**changes: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "correspondentType": "ENTITY",
            "fullName": "Acme Trading Ltd",
            "countryCode": "SG",
            "companyAddress": "1 Raffles Place, Singapore",
            "walletType": "VASP",
            "provider": "Binance",
            "walletLabel": "Acme hot wallet",
            "addressType": "STANDARD",
        }
        return _apply(base, changes)

    return make


@pytest.fixture
def individual_payer() -> ProfileFactory:
    """A factory of valid INDIVIDUAL payer details; keyword arguments override (None drops)."""

    def make(**changes: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "correspondentType": "INDIVIDUAL",
            "firstName": "Ada",
            "lastName": "Lovelace",
            "birthday": "1990-02-28",
            "residentialAddress": "12 St James's Square, London",
            "countryCode": "GB",
            "walletType": "SELF_HOSTED",
        }
        return _apply(base, changes)

    return make


def _apply(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return base
