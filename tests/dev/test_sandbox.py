"""The sandbox's provider API: error codes, idempotency, authentication, faults, persistence,
history paging and filters, the control API over HTTP, and the `depositd sandbox` command."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.configs import HOOK_KEY, HOOK_SECRET, PROVIDER_KEY, PROVIDER_SECRET
from tests.support.processes import Processes
from tests.support.sandboxes import StartSandbox, sandbox_settings
from worker.clock import now_ms
from worker.commands.cli import main as cli_main
from worker.config.settings import load_settings
from worker.dev.sandbox import Sandbox
from worker.dev.sandbox.cli import listen_address, sandbox_config
from worker.dev.sandbox.testing import ENTITY_PAYER, INDIVIDUAL_PAYER, WebhookRecorder
from worker.errors import (
    ProviderAuthError,
    ProviderBusinessError,
    ProviderRateLimited,
    ProviderRetryLater,
    ProviderUnavailable,
)
from worker.provider import jsonio
from worker.provider.client import ProviderClient
from worker.provider.models import WhiteListStatus
from worker.provider.signing import DEFAULT, METHOD_PATH_V1, signed_headers

SOURCE = "0x9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"
ROOT = str(Path(__file__).resolve().parents[2])
SUBMIT = "/v1/wallet/deposit-whitelist/transactions/{}/submit"


@dataclass
class Running:
    sandbox: Sandbox
    server: TestServer
    client: ProviderClient
    clock: list[int] = field(default_factory=lambda: [1_800_000_000_000])

    def deposit(self, wallet_id: int = 1001, currency: str = "USDT", amount: str = "10") -> str:
        self.clock[0] += 1000
        order = self.sandbox.inject_deposit(wallet_id, currency, "ETH", amount, SOURCE)
        return str(order["transactionId"])

    async def call(
        self,
        method: str,
        target: str,
        body: Any = None,
        *,
        secret: str = PROVIDER_SECRET,
        extra: dict[str, str] | None = None,
        signed: bool = True,
        ts: int | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """A raw request (to see envelopes, headers and HTTP statuses the client hides)."""
        raw = b"" if body is None else jsonio.dumpb(body)
        headers = signed_headers(PROVIDER_KEY, secret, method, target, raw, timestamp_ms=ts)
        if not signed:
            headers = {}
        headers.update(extra or {})
        if body is not None:
            headers["Content-Type"] = "application/json"
        url = f"http://{self.server.host}:{self.server.port}{target}"
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, url, data=raw, headers=headers) as resp,
        ):
            return resp.status, jsonio.loads(await resp.read())


Factory = Callable[..., Awaitable[Running]]


@pytest.fixture
def start(start_sandbox: StartSandbox) -> Factory:
    async def make(**overrides: Any) -> Running:
        s = await start_sandbox(clock=1_800_000_000_000, client_timeout_s=5, **overrides)
        assert s.clock is not None
        return Running(s.sandbox, s.server, s.client, s.clock)

    return make


@pytest.fixture
async def sbx(start: Factory) -> Running:
    return await start()


async def code_of(call: Awaitable[Any]) -> str | None:
    with pytest.raises(ProviderBusinessError) as info:
        await call
    return info.value.code


# --- error codes ---------------------------------------------------------------------------------


async def test_10000100_unknown_transaction(sbx: Running) -> None:
    """Detail and submit of an unknown transaction answer 10000100."""
    assert await code_of(sbx.client.transaction_detail("nope")) == "10000100"
    assert await code_of(sbx.client.transaction_detail("nope", alt_path=True)) == "10000100"
    submit = sbx.client.submit_payer("nope", ENTITY_PAYER, idempotency_key="k")
    assert await code_of(submit) == "10000100"


async def test_10000101_submit_after_review_completed(sbx: Running) -> None:
    """Submitting for an approved deposit answers 10000101."""
    tx = sbx.deposit()
    await sbx.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="a")
    sbx.sandbox.approve_review(tx)
    again = sbx.client.submit_payer(tx, INDIVIDUAL_PAYER, idempotency_key="b")
    assert await code_of(again) == "10000101"


async def test_10000102_missing_fields_and_missing_key(sbx: Running) -> None:
    """Missing payer fields answer 10000102 naming the gap; a missing Idempotency-Key is a plain
    HTTP 400 with the wallet envelope naming the header."""
    tx = sbx.deposit()
    body = {k: v for k, v in ENTITY_PAYER.items() if k != "companyAddress"}
    with pytest.raises(ProviderBusinessError) as info:
        await sbx.client.submit_payer(tx, body, idempotency_key="k")
    assert info.value.code == "10000102" and "companyAddress" in info.value.msg
    status, env = await sbx.call("POST", SUBMIT.format(tx), ENTITY_PAYER)
    assert (status, env["status"], env["code"]) == (400, 400, None)
    assert "Idempotency-Key" in env["msg"] and env["data"] is None


@pytest.mark.parametrize(
    "change", [{"countryCode": "XX"}, {"provider": "NotAnExchange"}], ids=["country", "provider"]
)
async def test_10000103_bad_value(sbx: Running, change: dict[str, str]) -> None:
    """An invalid countryCode or a provider not in the options list answers 10000103."""
    tx = sbx.deposit()
    submit = sbx.client.submit_payer(tx, {**ENTITY_PAYER, **change}, idempotency_key="k")
    assert await code_of(submit) == "10000103"
    assert (await sbx.client.transaction_detail(tx)).whiteListStatus is WhiteListStatus.INIT


async def test_10000104_submit_while_pending(sbx: Running) -> None:
    """A second submission while under review answers 10000104 (retry later)."""
    tx = sbx.deposit()
    await sbx.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="a")
    with pytest.raises(ProviderRetryLater) as info:
        await sbx.client.submit_payer(tx, INDIVIDUAL_PAYER, idempotency_key="b")
    assert info.value.code == "10000104"


async def test_10000105_same_key_other_body_and_replay(sbx: Running) -> None:
    """Same key + same body replays the first answer; same key + other body is 10000105."""
    tx = sbx.deposit()
    headers = {"Idempotency-Key": "key-1"}
    first = await sbx.call("POST", SUBMIT.format(tx), ENTITY_PAYER, extra=headers)
    replay = await sbx.call("POST", SUBMIT.format(tx), dict(ENTITY_PAYER), extra=headers)
    assert first == replay
    assert first[1]["data"] == {"transactionId": tx, "whiteListStatus": "pending"}
    other = sbx.client.submit_payer(tx, INDIVIDUAL_PAYER, idempotency_key="key-1")
    assert await code_of(other) == "10000105"


async def test_10000106_source_fields_in_submit(sbx: Running) -> None:
    """walletAddress, network, memo, symbol or txHash in a submission answer 10000106."""
    tx = sbx.deposit()
    for key in ("walletAddress", "network", "memo", "symbol", "txHash"):
        body = {**ENTITY_PAYER, key: "x"}
        assert await code_of(sbx.client.submit_payer(tx, body, idempotency_key=key)) == "10000106"


async def test_10000107_unknown_wallet(sbx: Running) -> None:
    """Register, balance and deposit-address on an unknown walletId answer 10000107."""
    body = {**ENTITY_PAYER, "walletId": 4242, "walletAddress": SOURCE, "network": "ETH"}
    assert await code_of(sbx.client.register_address(body, idempotency_key="r")) == "10000107"
    assert await code_of(sbx.client.asset_balance(4242, "USDT")) == "10000107"
    assert await code_of(sbx.client.deposit_address(4242, "USDT", "ETH")) == "10000107"


# --- authentication ------------------------------------------------------------------------------


async def test_unsigned_and_wrongly_signed_requests_are_401(sbx: Running) -> None:
    """No headers, a wrong secret or a stale timestamp: HTTP 401 with the wallet envelope."""
    target = "/v1/wallet/deposit-whitelist/options"
    status, env = await sbx.call("GET", target, signed=False)
    assert (status, env["status"], env["code"]) == (401, 401, None)
    assert env["msg"].startswith("unauthorized") and env["traceId"]
    status, env = await sbx.call("GET", target, secret="wrong")
    assert (status, env["msg"].split()[0]) == (401, "signature")
    status, env = await sbx.call("GET", target, ts=now_ms() - 600_000)
    assert (status, env["msg"].split()[0]) == (401, "timestamp")
    bad = ProviderClient(str(sbx.server.make_url("/")), PROVIDER_KEY, "wrong", retries=0)
    with pytest.raises(ProviderAuthError):
        await bad.options()
    await bad.close()
    assert await sbx.client.options() == ["Binance", "Coinbase", "Kraken", "OKX", "Bybit"]


# --- faults --------------------------------------------------------------------------------------


async def test_fault_5xx_counts_down(sbx: Running) -> None:
    """A 5xx fault answers 503 for `count` matching calls, then the endpoint works again."""
    tx = sbx.deposit()
    sbx.sandbox.set_fault("detail", kind="5xx", count=2)
    for alt in (False, True):
        with pytest.raises(ProviderUnavailable):
            await sbx.client.transaction_detail(tx, alt_path=alt)
    assert await sbx.client.options()  # other endpoints are untouched
    assert (await sbx.client.transaction_detail(tx)).transactionId == tx


async def test_fault_timeout_until_cleared(sbx: Running) -> None:
    """A timeout fault holds requests past the caller's timeout until faults are cleared."""
    url = str(sbx.server.make_url("/"))
    client = ProviderClient(url, PROVIDER_KEY, PROVIDER_SECRET, retries=0, timeout_s=0.2)
    sbx.sandbox.set_fault("/v1/wallet/history", kind="timeout", count=None)
    with pytest.raises(ProviderUnavailable, match="timeout"):
        await client.history(white_list_status="init")
    sbx.sandbox.clear_faults()
    assert (await client.history(white_list_status="init")).totalRow == 0
    await client.close()


async def test_fault_code_and_latency(sbx: Running) -> None:
    """A code fault answers that wallet code; a latency fault delays but answers."""
    tx = sbx.deposit()
    sbx.sandbox.set_fault("submit", kind="code", code="10000104")
    with pytest.raises(ProviderRetryLater):
        await sbx.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k")
    sbx.sandbox.set_fault("options", kind="latency", latency_s=0.3)
    began = time.monotonic()
    assert await sbx.client.options()
    assert time.monotonic() - began >= 0.3
    result = await sbx.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k")
    assert result.whiteListStatus is WhiteListStatus.PENDING


async def test_faults_over_control_api(sbx: Running) -> None:
    """POST /_sandbox/faults applies a fault; DELETE /_sandbox/faults clears it."""
    status, fault = await sbx.call(
        "POST", "/_sandbox/faults", {"endpoint": "history", "kind": "5xx", "count": None}
    )
    assert (status, fault["count"]) == (201, None)
    for _ in range(3):
        with pytest.raises(ProviderUnavailable):
            await sbx.client.history(white_list_status="init", alt_path=True)
    assert (await sbx.call("DELETE", "/_sandbox/faults"))[0] == 200
    assert (await sbx.client.history(white_list_status="init")).records == []
    status, err = await sbx.call("POST", "/_sandbox/faults", {"endpoint": "x", "kind": "boom"})
    assert status == 409 and "kind" in err["error"]


async def test_rate_limit_fault_answers_429_or_503_with_retry_after(sbx: Running) -> None:
    """A rate_limit fault (control API) answers HTTP 429, or 503 naming the rate limit, with
    its Retry-After header when one is given; the client reads it as a rate limit."""
    body = {"endpoint": "history", "kind": "rate_limit", "retryAfterSeconds": 7, "count": 1}
    status, fault = await sbx.call("POST", "/_sandbox/faults", body)
    assert (status, fault["httpStatus"], fault["retryAfterSeconds"]) == (201, 429, 7)
    url = f"http://{sbx.server.host}:{sbx.server.port}/v1/wallet/history"
    headers = signed_headers(PROVIDER_KEY, PROVIDER_SECRET, "GET", "/v1/wallet/history", b"")
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as resp:
        assert (resp.status, resp.headers.get("Retry-After")) == (429, "7")
        assert "rate limit" in (await resp.json())["msg"]
    sbx.sandbox.set_fault("history", kind="rate_limit", http_status=503, count=1)
    with pytest.raises(ProviderRateLimited) as caught:
        await sbx.client.history(white_list_status="init")
    assert (caught.value.http_status, caught.value.retry_after) == (503, None)
    assert (await sbx.client.history(white_list_status="init")).records == []
    bad = {"endpoint": "history", "kind": "rate_limit", "httpStatus": 500}
    status, err = await sbx.call("POST", "/_sandbox/faults", bad)
    assert status == 409 and "httpStatus" in err["error"]


# --- persistence ---------------------------------------------------------------------------------


async def test_state_survives_restart(start: Factory, aiohttp_server: Any, tmp_path: Path) -> None:
    """With state_path, orders, balances, idempotency and pending webhooks survive a restart."""
    hooks = WebhookRecorder(HOOK_KEY, HOOK_SECRET)
    hooks.fail_with.extend([500] * 1000)
    hook_server = await aiohttp_server(hooks.app())
    cfg: dict[str, Any] = {
        "state_path": tmp_path / "sandbox.db",
        "webhook_url": str(hook_server.make_url(hooks.path)),
        "delivery_retry_base_s": 0.01,
        "delivery_retry_max_s": 0.02,
    }
    first = await start(**cfg)
    tx = first.deposit(amount="12.345")
    await first.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="persist-1")
    await first.server.close()
    assert hooks.events == [] and hooks.attempts

    hooks.fail_with.clear()
    second = await start(**cfg)
    order = await second.client.transaction_detail(tx)
    assert (order.whiteListStatus, order.amount) == (WhiteListStatus.PENDING, Decimal("12.345"))
    (row,) = await second.client.asset_balance(1001, "USDT")
    assert row.unavailable == Decimal("12.345")
    again = await second.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="persist-1")
    assert again.whiteListStatus is WhiteListStatus.PENDING
    await second.sandbox.delivered_idle()
    assert hooks.types(tx) == ["DEPOSIT_WHITELIST_REQUIRED"]
    # Sent after the restart as it would have been before: the amount a JSON number.
    assert hooks.events[-1]["data"]["amount"] == Decimal("12.345")


# --- history -------------------------------------------------------------------------------------


async def test_history_paging(sbx: Running) -> None:
    """Pages of pageSize records, oldest first, with totalPage and totalRow; both spellings."""
    txs = [sbx.deposit() for _ in range(5)]
    seen: list[str] = []
    for page_num in (1, 2, 3):
        page = await sbx.client.history(white_list_status="init", page_num=page_num, page_size=2)
        assert (page.pageNumber, page.pageSize, page.totalPage, page.totalRow) == (
            page_num,
            2,
            3,
            5,
        )
        seen += [o.transactionId for o in page.records]
    assert seen == txs
    alt = await sbx.client.history(white_list_status="init", page_size=2, alt_path=True)
    assert [o.transactionId for o in alt.records] == txs[:2]
    beyond = await sbx.client.history(white_list_status="init", page_num=4, page_size=2)
    assert beyond.records == []


async def test_history_filters(sbx: Running) -> None:
    """whiteListStatus, walletId, currency and the startTime/endTime window each filter."""
    a = sbx.deposit(1001, "USDT")
    b = sbx.deposit(1002, "USDC")
    c = sbx.deposit(1001, "USDC")
    await sbx.client.submit_payer(c, ENTITY_PAYER, idempotency_key="c")
    sbx.sandbox.reject_review(c, "mismatch")

    async def ids(**filters: Any) -> list[str]:
        return [o.transactionId for o in (await sbx.client.history(**filters)).records]

    assert await ids(white_list_status="init") == [a, b]
    assert await ids(white_list_status="rejected") == [c]
    assert await ids(wallet_id=1001) == [a, c]
    assert await ids(currency="USDC") == [b, c]
    detail_b = await sbx.client.transaction_detail(b)
    assert detail_b.createTime is not None
    assert await ids(start_time=detail_b.createTime, end_time=detail_b.createTime) == [b]
    assert await code_of(sbx.client.history(white_list_status="pending")) == "10000103"
    assert await code_of(sbx.client.history(page_size=501)) == "10000103"


# --- other provider endpoints --------------------------------------------------------------------


async def test_wallet_endpoints(sbx: Running) -> None:
    """Wallet list, deposit address, sub-wallet creation and withdraw whitelist answer."""
    sbx.deposit(1002, "USDT", "1.5")
    groups = {g.walletId: g for g in await sbx.client.list_wallets()}
    assert groups[1001].autoCollection is True and groups[1002].autoCollection is False
    (usdt,) = groups[1002].wallets
    assert (usdt.currency, usdt.available, usdt.unavailable) == ("USDT", 0, Decimal("1.5"))
    address = await sbx.client.deposit_address(1001, "USDT", "ETH")
    assert address["address"] and address["network"] == "ETH"
    created = await sbx.client.create_sub_wallet({"name": "Sub"}, idempotency_key="sub-1")
    assert created["walletId"] == 1003 and created["name"] == "Sub"
    entry = await sbx.client.add_withdraw_whitelist(
        {"walletId": 1003, "address": SOURCE, "network": "ETH"}, idempotency_key="w-1"
    )
    assert entry["address"] == SOURCE
    assert [g.walletId for g in await sbx.client.list_wallets(1003)] == [1003]


async def test_address_list_and_duplicate(sbx: Running) -> None:
    """Source addresses list with a status filter; re-registering a live address is 10000105."""
    body = {**ENTITY_PAYER, "walletId": 1001, "walletAddress": SOURCE, "network": "ETH"}
    record = await sbx.client.register_address(body, idempotency_key="r1")
    assert await code_of(sbx.client.register_address(body, idempotency_key="r2")) == "10000105"
    page = await sbx.client.list_addresses(status="PROCESSING")
    assert [r.id for r in page.records] == [record.id]
    assert (await sbx.client.list_addresses(status="ACTIVE")).records == []
    assert await code_of(sbx.client.address_detail("missing")) == "10000100"


# --- control API over HTTP -----------------------------------------------------------------------


async def test_control_api_drives_a_deposit(sbx: Running) -> None:
    """The control endpoints inject, decide, report state, and refuse impossible steps."""
    status, order = await sbx.call(
        "POST",
        "/_sandbox/deposits",
        {
            "walletId": 1002,
            "currency": "USDT",
            "network": "TRON",
            "amount": "2.5",
            "fromAddress": SOURCE,
        },
        signed=False,
    )
    assert status == 201 and order["whiteListStatus"] == "init"
    tx = order["transactionId"]
    status, err = await sbx.call("POST", f"/_sandbox/deposits/{tx}/approve", signed=False)
    assert status == 409 and "not under review" in err["error"]
    assert (await sbx.call("POST", "/_sandbox/deposits/none/approve", signed=False))[0] == 404
    await sbx.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k")
    status, order = await sbx.call(
        "POST", f"/_sandbox/deposits/{tx}/reject", {"failMessage": "try again"}
    )
    assert (status, order["whiteListStatus"]) == (200, "rejected")
    status, wallet = await sbx.call(
        "POST", "/_sandbox/wallets", {"walletId": 2001, "name": "New", "autoCollection": True}
    )
    assert status == 201 and wallet["autoCollection"] is True
    assert (await sbx.call("POST", "/_sandbox/webhooks/drop", {"count": 2}))[1]["dropsOwed"] == 2
    status, state = await sbx.call("GET", "/_sandbox/state", signed=False)
    assert status == 200 and [o["transactionId"] for o in state["orders"]] == [tx]
    assert {"walletId": 1002, "currency": "USDT", "available": "0", "unavailable": "2.5"} in (
        state["balances"]
    )
    assert state["webhooks"]["dropsOwed"] == 2
    bad = await sbx.call("POST", "/_sandbox/deposits", {"walletId": 1001, "amount": 1.5})
    assert bad[0] == 400


# --- the command ---------------------------------------------------------------------------------


async def test_sandbox_command_serves_and_stops_on_sigterm(
    tmp_path: Path, unused_tcp_port_factory: Callable[[], int], processes: Processes
) -> None:
    """`depositd sandbox --config` answers signed calls and exits 0 on SIGTERM."""
    port = unused_tcp_port_factory()
    config = tmp_path / "depositd.yaml"
    config.write_text(
        "provider:\n"
        "  base_url: http://127.0.0.1:1\n"
        f"  api_key: {PROVIDER_KEY}\n"
        f"  api_secret: {PROVIDER_SECRET}\n"
        "webhook:\n"
        "  listen: 127.0.0.1:9\n"
        f"  api_key: {HOOK_KEY}\n"
        f"  secret: {HOOK_SECRET}\n"
        "storage:\n"
        "  path: depositd.db\n"
        "log:\n"
        "  format: json\n"
    )
    proc = processes.own(
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "worker",
            "sandbox",
            "--config",
            str(config),
            "--port",
            str(port),
            "--state",
            str(tmp_path / "sbx.db"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
    )
    client = ProviderClient(f"http://127.0.0.1:{port}", PROVIDER_KEY, PROVIDER_SECRET, retries=0)
    try:
        for _ in range(100):
            try:
                assert "Binance" in await client.options()
                break
            except ProviderUnavailable:
                await asyncio.sleep(0.1)
        else:
            pytest.fail("sandbox did not start")
    finally:
        await client.close()
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0, stderr.decode()
    assert (tmp_path / "sbx.db").exists()
    assert PROVIDER_SECRET not in stderr.decode()


def test_sandbox_command_refuses_a_bad_or_taken_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A port that is no port is a usage error (2); one that is taken fails with a message (1),
    neither with a traceback."""
    config = tmp_path / "depositd.yaml"
    config.write_text(
        f"provider: {{base_url: 'http://127.0.0.1:1', api_key: {PROVIDER_KEY}, api_secret: x}}\n"
        f"webhook: {{api_key: {HOOK_KEY}, secret: {HOOK_SECRET}}}\n"
        "storage: {path: depositd.db}\n"
        "log: {format: json}\n"
    )
    with pytest.raises(SystemExit) as exited:
        cli_main(["sandbox", "--config", str(config), "--port", "99999"])
    assert exited.value.code == 2
    assert "not a port number (1-65535): '99999'" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli_main(["sandbox", "--config", str(config), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert "sandbox cannot listen" in err and "Traceback" not in err


async def test_auto_review_approves_on_its_own(start: Factory) -> None:
    """With auto_review, a submission and an address registration pass review shortly after."""
    sbx = await start(auto_review=True, auto_review_delay_s=0.01)
    tx = sbx.deposit()
    result = await sbx.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k")
    assert result.whiteListStatus is WhiteListStatus.PENDING
    body = {**ENTITY_PAYER, "walletId": 1002, "walletAddress": SOURCE, "network": "ETH"}
    record = await sbx.client.register_address(body, idempotency_key="r")
    await asyncio.sleep(0.1)
    assert (await sbx.client.transaction_detail(tx)).whiteListStatus is WhiteListStatus.APPROVED
    assert (await sbx.client.address_detail(record.id)).status.value == "ACTIVE"


def test_sandbox_config_from_settings(tmp_path: Path) -> None:
    """The sandbox reads the worker's config: keys, secrets, webhook URL, listen address."""
    config = tmp_path / "depositd.yaml"
    config.write_text(
        "provider:\n"
        "  base_url: http://127.0.0.1:9100\n"
        f"  api_key: {PROVIDER_KEY}\n"
        f"  api_secret: {PROVIDER_SECRET}\n"
        "webhook:\n"
        "  listen: 0.0.0.0:8080\n"
        "  path: /hooks/p\n"
        f"  api_key: {HOOK_KEY}\n"
        f"  secret: [{HOOK_SECRET}, older]\n"
        "storage:\n"
        "  path: depositd.db\n"
    )
    settings = load_settings(config)
    cfg = sandbox_config(settings, tmp_path / "s.db")
    assert (cfg.api_key, cfg.api_secret) == (PROVIDER_KEY, PROVIDER_SECRET)
    assert (cfg.webhook_api_key, cfg.webhook_secret) == (HOOK_KEY, HOOK_SECRET)
    assert cfg.webhook_url == "http://127.0.0.1:8080/hooks/p"
    assert listen_address(settings.provider.base_url) == ("127.0.0.1", 9100)
    assert listen_address(settings.provider.base_url, 7000) == ("127.0.0.1", 7000)
    assert cfg.signature == cfg.webhook_signature == DEFAULT


def test_sandbox_takes_each_section_scheme(tmp_path: Path) -> None:
    """`depositd init --sandbox` writes the published scheme; the sandbox checks requests with
    provider's scheme and signs deliveries with webhook's, each as configured."""
    assert cli_main(["init", "--sandbox", str(tmp_path / "s")]) == 0
    config = tmp_path / "s" / "depositd.yaml"
    text = config.read_text()
    assert text.count("  signature: published ") == 2
    cfg = sandbox_config(load_settings(config))
    assert cfg.signature == cfg.webhook_signature == DEFAULT
    text = text.replace("  signature: published ", "  signature: method-path-v1 ", 1)
    config.write_text(text)
    cfg = sandbox_config(load_settings(config))
    assert (cfg.signature, cfg.webhook_signature) == (METHOD_PATH_V1, DEFAULT)


def test_transaction_hashes_are_written_as_their_chain_writes_them() -> None:
    """A TRON deposit's txHash is 64 hex digits without 0x; an EVM chain's starts with 0x."""
    import re

    sandbox = Sandbox(sandbox_settings())
    tron = sandbox.inject_deposit(1002, "USDT", "TRON", "1.00", "TFromHash000000000000000000000001")
    eth = sandbox.inject_deposit(1002, "USDT", "ETH", "1.00", "0xFromHash00000000000000000000001")
    assert re.fullmatch(r"[0-9a-f]{64}", tron["transactionHash"]), tron["transactionHash"]
    assert re.fullmatch(r"0x[0-9a-f]{64}", eth["transactionHash"]), eth["transactionHash"]
