"""The provider-name check (daily and on reload): one alert while a profile's provider is gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from worker.dev.harness import Stack

PROFILE = "demo-entity"  # rules/profiles.yaml; its provider is Binance


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    """A running sandbox + worker with the shipped rules and demo profiles, no polling."""
    async with Stack(tmp_path / "stack", scheduler=False) as s:
        yield s


async def provider_alerts(stack: Stack) -> list[str]:
    """Conditions of the provider-unknown alerts queued so far."""
    return [
        a["params"]["condition"]
        for a in await stack.actions()
        if a["action"] == "alert" and a["params"]["condition"].startswith("provider_unknown")
    ]


async def test_unknown_provider_alerts_once_until_offered_again(stack: Stack) -> None:
    """Checks while the provider stays unknown add no alert; dropped again, it alerts again."""
    offered = stack.sandbox.cfg.providers
    kept = list(offered)
    offered[:] = [p for p in kept if p != "Binance"]
    for _ in range(3):
        await stack.runtime.check_providers()
    assert await provider_alerts(stack) == [f"provider_unknown:{PROFILE}"]

    offered[:] = kept
    await stack.runtime.check_providers()
    assert len(await provider_alerts(stack)) == 1

    offered[:] = [p for p in kept if p != "Binance"]
    await stack.runtime.check_providers()
    assert len(await provider_alerts(stack)) == 2
