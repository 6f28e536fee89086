"""Network codes depositd knows before it has seen them (assumed: the interface names a
`network` field everywhere and lists no values; its examples and the sandbox's use TRON and
ETH). `register-address --from-csv` refuses a line whose network is neither one of these nor
one depositd has seen from the provider (a deposit, a registered address): a typo in a file of
many lines must not reach the provider (docs/commands.md)."""

from __future__ import annotations

KNOWN_NETWORKS: tuple[str, ...] = (
    "TRON",
    "ETH",
    "BSC",
    "POLYGON",
    "ARBITRUM",
    "OPTIMISM",
    "BASE",
    "AVAXC",
    "SOL",
    "BTC",
    "LTC",
    "BCH",
    "DOGE",
    "TON",
    "XRP",
    "XLM",
    "ALGO",
    "NEAR",
    "APT",
    "SUI",
)
