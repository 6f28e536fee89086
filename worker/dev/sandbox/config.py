"""What a sandbox instance is told at start: credentials, webhook target, wallets, timings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from worker.provider.signing import DEFAULT, Scheme

DEFAULT_PROVIDERS = ("Binance", "Coinbase", "Kraken", "OKX", "Bybit")
DEFAULT_RATES = {
    "USD/USDT": "0.9985",
    "USD/USDC": "0.9990",
    "USDT/USD": "0.9980",
    "HKD/USDT": "0.1279",
}


@dataclass(frozen=True)
class WalletSpec:
    """A wallet the sandbox starts with."""

    wallet_id: int
    name: str
    auto_collection: bool
    wallet_type: str = "collection_prime"


MAIN_WALLET_ID = 1000


def default_wallets() -> list[WalletSpec]:
    """1000 "Main account" (where auto-collection sweeps to), 1001 "Main USDT" with
    auto-collection, 1002 "Ops" without."""
    return [
        WalletSpec(MAIN_WALLET_ID, "Main account", False, "operation_prime"),
        WalletSpec(1001, "Main USDT", True, "collection_prime"),
        WalletSpec(1002, "Ops", False, "operation_prime"),
    ]


def wallets_with(auto_collection: Mapping[int, bool]) -> list[WalletSpec]:
    """The default wallets with auto-collection set per wallet as given; a wallet id not among
    them is added as a collection wallet."""
    wallets = {w.wallet_id: w for w in default_wallets()}
    for wallet_id, auto in auto_collection.items():
        known = wallets.get(wallet_id)
        wallets[wallet_id] = WalletSpec(
            wallet_id,
            known.name if known else f"Wallet {wallet_id}",
            auto,
            known.wallet_type if known else "collection_prime",
        )
    return list(wallets.values())


@dataclass
class SandboxConfig:
    """Settings of one sandbox instance; every timing is in seconds."""

    api_key: str
    api_secret: str
    webhook_url: str | None = None
    webhook_api_key: str = ""
    webhook_secret: str = ""
    # How requests are checked (`provider.signature...`) and deliveries signed (`webhook.`).
    signature: Scheme = DEFAULT
    webhook_signature: Scheme = DEFAULT
    state_path: Path | None = None
    providers: list[str] = field(default_factory=lambda: list(DEFAULT_PROVIDERS))
    wallets: list[WalletSpec] = field(default_factory=default_wallets)
    # The main account auto-collection sweeps into (None, or not a wallet: funds stay put).
    main_wallet_id: int | None = MAIN_WALLET_ID
    delivery_retry_base_s: float = 0.5
    delivery_retry_max_s: float = 30
    delivery_timeout_s: float = 5
    # True: every submission and address registration passes review on its own, shortly after.
    auto_review: bool = False
    auto_review_delay_s: float = 0.05
    tolerance_s: float = 300
    # The settlement report's zone when the request names none (the interface says UTC), and a
    # zone every report is answered in whatever the request asks (None: the one asked): stand-ins
    # for a provider whose reports are not in UTC.
    report_default_timezone: str = "UTC"
    report_timezone: str | None = None
    # How long a "timeout" fault holds a request: longer than any sane client timeout.
    fault_timeout_s: float = 30
    # Where the hosted deposit Travel Rule page lives (None: this sandbox's /hosted).
    hosted_url: str | None = None
    travel_rule_link_ttl_s: float = 900
    # One e-mail verification code per address per interval.
    email_code_interval_s: float = 60
    # Quote rates per "FROM/TO" pair and how long a quote is valid.
    quote_rates: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_RATES))
    quote_ttl_s: float = 30
