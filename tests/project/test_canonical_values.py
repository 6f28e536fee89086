"""Every provider value that money code compares enters in its canonical form
(docs/design.md, "Provider values at the boundary"): each field of every provider model that
names a txHash, an address, a currency, a network or an amount is read through
`worker.provider.canonical` (or the amount reader), and the code that compares them
re-spells nothing on its own."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from pydantic import BaseModel, BeforeValidator

from worker.provider import canonical, models, resources

ROOT = Path(__file__).resolve().parents[2]
# The wire names of the values money code compares.
COMPARED = {
    "transactionHash",
    "txHash",
    "tx_hash",
    "fromAddress",
    "toAddress",
    "from_address",
    "to_address",
    "walletAddress",
    "currency",
    "network",
    "asset",
    "fee_asset",
    "sourceCurrency",
    "targetCurrency",
    "transactionId",
}
# Request bodies and queries are written by depositd, not read from the provider.
WRITTEN_HERE = {"AbnormalFundListRequest", "SettlementQuery", "QuoteRequest", "BankAccount"}
READERS = {
    canonical.text,
    canonical.tx_hash,
    canonical.address,
    canonical.code,
    canonical.amount,
    canonical.deposit_amount,
}
# The places money code compares provider values; none may trim, fold or upper-case a value
# itself (`.strip()`, `.lower()`, `.upper()`, `.casefold()`): what it compares is canonical.
COMPARING = [
    "worker/track/tracker.py",
    "worker/track/conflicts.py",
    "worker/act/kinds/book.py",
    "worker/store/ledger.py",
    "worker/reconcile/matching.py",
    "worker/reconcile/reconciler.py",
    "worker/reconcile/abnormal.py",
    "worker/store/findings.py",
]
# Text that is not a provider value: a person's typed decision, an outcome's words.
ALLOWED = {
    ("worker/track/conflicts.py", "decided_value"),
    ("worker/reconcile/reconciler.py", "_describe"),
}


def _provider_models() -> list[type[BaseModel]]:
    found = []
    for module in (models, resources):
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseModel) and obj.__module__ == module.__name__:
                found.append(obj)
    return found


def test_every_compared_provider_field_is_read_in_its_canonical_form() -> None:
    """A model field holding a compared value without a canonical reader is named."""
    raw = []
    for model in _provider_models():
        if model.__name__ in WRITTEN_HERE:
            continue
        for name, info in model.model_fields.items():
            if name not in COMPARED:
                continue
            funcs = {m.func for m in info.metadata if isinstance(m, BeforeValidator)}
            if not funcs & READERS:
                raw.append(f"{model.__name__}.{name}")
    assert raw == []


def test_money_code_re_spells_no_provider_value() -> None:
    """No comparing module trims or folds a value itself (it would compare raw text)."""
    found = []
    for rel in COMPARING:
        tree = ast.parse((ROOT / rel).read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (rel, func.name) in ALLOWED:
                continue
            for node in ast.walk(func):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("strip", "lower", "upper", "casefold")
                ):
                    found.append(f"{rel}:{node.lineno} {func.name}: .{node.func.attr}()")
    assert found == []
