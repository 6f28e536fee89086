"""The end-to-end harness: sandbox + worker + SMTP + Slack in one process."""

from __future__ import annotations

import socket
from decimal import Decimal
from pathlib import Path

import aiohttp
import pytest

from worker.config.settings import load_settings
from worker.dev.harness import Stack
from worker.provider.models import WhiteListStatus
from worker.track.tracker import State

KNOWN_PAYER = "TDemoKnownPayer1111111111111111111"  # demo-entity in rules/profiles.yaml


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def test_start_and_stop_cleanly(tmp_path: Path) -> None:
    """The stack serves a ready worker and sandbox, writes a loadable config, frees its ports."""
    stack = Stack(tmp_path)
    await stack.start()
    try:
        settings = load_settings(stack.config_path)
        assert settings.provider.base_url == stack.sandbox_url
        assert settings.storage.path == stack.db_path
        assert settings.profiles == stack.profiles_path
        assert settings.notify.slack is not None and settings.notify.email is not None
        async with aiohttp.ClientSession() as http:
            async with http.get(stack.worker_url + "/readyz") as resp:
                assert resp.status == 200, await resp.text()
            async with http.get(stack.sandbox_url + "/v1/wallet/list") as resp:
                assert resp.status == 401  # unsigned: the sandbox checks signatures
        ports = [settings.webhook.port, int(stack.sandbox_url.rsplit(":", 1)[1]), stack.smtp_port]
    finally:
        await stack.stop()
    assert all(_refused(port) for port in ports)
    await stack.stop()  # a second stop is harmless


async def test_known_payer_deposit_flows_end_to_end(tmp_path: Path) -> None:
    """A deposit from an address with a stored profile is submitted, approved and booked once."""
    async with Stack(tmp_path) as stack:
        order = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "250.50", KNOWN_PAYER)
        tx = order["transactionId"]
        await stack.wait_for(
            lambda: stack.sandbox.state.orders[tx].white_list_status is WhiteListStatus.PENDING,
            what="the stored profile submitted",
        )
        stack.sandbox.approve_review(tx)
        await stack.settle()

        deposit = await stack.deposit(tx)
        assert deposit is not None and deposit.state is State.COMPLETED
        ledger = [row for row in await stack.ledger() if row["transaction_id"] == tx]
        assert len(ledger) == 1
        assert Decimal(ledger[0]["amount"]) == Decimal("250.50")
        submits = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
        assert [(a["status"], a["params"]["profile"]) for a in submits] == [("done", "demo-entity")]
        assert [e["event_type"] for e in await stack.events(tx)] == [
            "DEPOSIT_WHITELIST_REQUIRED",
            "DEPOSIT_WHITELIST_CREDITED",
            "DEPOSIT_ORDER_NOTIFICATION",
        ]
        assert stack.slack == [] and stack.emails == []


@pytest.mark.parametrize(
    "signature",
    [{}, {"signature": "method-path-v1", "signature_encoding": "base64"}],
    ids=["default", "method-path-v1-base64"],
)
async def test_the_stack_runs_the_configured_scheme_end_to_end(
    tmp_path: Path, signature: dict[str, str]
) -> None:
    """The sandbox checks requests and signs deliveries with the scheme the config selects
    (the published one by default): the deposit's webhooks are stored and its profile is
    submitted, and unsigned or otherwise-signed calls are refused."""
    async with Stack(tmp_path, signature=signature) as stack:
        scheme = stack.settings.provider.scheme
        assert stack.sandbox.cfg.signature == scheme == stack.settings.webhook.scheme
        assert stack.sandbox.cfg.webhook_signature == scheme
        assert scheme.name == signature.get("signature", "published")
        order = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "7", KNOWN_PAYER)
        tx = order["transactionId"]
        await stack.wait_for(
            lambda: stack.sandbox.state.orders[tx].white_list_status is WhiteListStatus.PENDING,
            what="the stored profile submitted",
        )
        assert [e["event_type"] for e in await stack.events(tx)] == ["DEPOSIT_WHITELIST_REQUIRED"]


async def test_alert_reaches_slack_and_email(tmp_path: Path) -> None:
    """A deposit without a profile raises one warning in Slack and one e-mail."""
    async with Stack(tmp_path) as stack:
        tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "10", "TNoProfile1")[
            "transactionId"
        ]
        await stack.settle()
        assert len(stack.slack_for(tx, "needs_details")) == 1
        assert len(stack.emails_for(tx, "needs_details")) == 1
        assert not [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]


async def test_restart_worker_keeps_database_and_port(tmp_path: Path) -> None:
    """After restart_worker, webhooks reach the new worker, which sees the old deposits."""
    async with Stack(tmp_path, scheduler=False) as stack:
        first = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "1", "TNoProfile2")
        await stack.settle()
        old_store = stack.store
        await stack.restart_worker()
        assert stack.store is not old_store
        assert await stack.deposit(first["transactionId"]) is not None
        second = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "2", "TNoProfile3")
        await stack.settle()
        assert await stack.deposit(second["transactionId"]) is not None


async def test_rewrite_profiles_reloads_without_touching_the_source(tmp_path: Path) -> None:
    """rewrite_profiles changes the copy in the work folder and the runtime's profiles."""
    source = tmp_path / "src-profiles.yaml"
    source.write_text("profiles: {}\n", encoding="utf-8")
    async with Stack(tmp_path / "stack", profiles=source, scheduler=False) as stack:
        assert stack.runtime.profiles.names() == set()
        text = (
            "profiles:\n  p1:\n    correspondentType: INDIVIDUAL\n    firstName: A\n"
            "    lastName: B\n    birthday: '1980-02-03'\n    residentialAddress: X\n"
            "    countryCode: GB\n    walletType: SELF_HOSTED\nwallets:\n  1001: p1\n"
        )
        assert await stack.rewrite_profiles(text) is True
        assert stack.runtime.profiles.names() == {"p1"}
    assert source.read_text(encoding="utf-8") == "profiles: {}\n"


async def test_wait_for_names_what_it_waited_for(tmp_path: Path) -> None:
    """wait_for raises TimeoutError naming the awaited condition."""
    async with Stack(tmp_path, notify=False, scheduler=False) as stack:
        with pytest.raises(TimeoutError, match="the impossible"):
            await stack.wait_for(lambda: False, timeout=0.1, what="the impossible")

        async def later() -> bool:
            return True

        await stack.wait_for(later, timeout=1)
