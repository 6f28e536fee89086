"""`depositd sandbox VERB`: the control calls as commands against a sandbox on loopback, each
printing what it did, and a refused or unreachable call said plainly (exit 1)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import (
    NO_PROVIDER,
    PROVIDER_KEY,
    PROVIDER_SECRET,
    make_config,
    write_config,
)
from tests.support.sandboxes import StartSandbox
from worker.commands.cli import main as cli_main
from worker.dev.sandbox import Sandbox
from worker.dev.sandbox.testing import ENTITY_PAYER
from worker.logs import configure
from worker.provider.client import ProviderClient

SOURCE = "TVerbsPayer000000000000000000001"

Verb = Callable[..., Awaitable[tuple[int, str, str]]]


class Sbx:
    """A sandbox served on loopback and a config whose provider.base_url points at it."""

    def __init__(self, sandbox: Sandbox, url: str, config: Path) -> None:
        self.sandbox, self.url, self.config = sandbox, url, config

    def order(self, tx: str) -> dict[str, Any]:
        return next(o for o in self.sandbox.snapshot()["orders"] if o["transactionId"] == tx)


@pytest.fixture
async def sbx(start_sandbox: StartSandbox, tmp_path: Path) -> Sbx:
    configure("json", "warning")  # the sandbox's own log lines stay out of the verbs' output
    s = await start_sandbox()
    cfg = make_config(Path("depositd.db"), s.url, log={"format": "json"})
    return Sbx(s.sandbox, s.url, write_config(tmp_path, cfg))


@pytest.fixture
def verb(sbx: Sbx, capsys: pytest.CaptureFixture[str]) -> Verb:
    """Run `depositd sandbox ARGS --config CONFIG` beside the running sandbox (in a thread: the
    verbs block); exit status, stdout, stderr."""

    async def run(*argv: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(cli_main, ["sandbox", *argv, "--config", str(sbx.config)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


async def _submitted(sbx: Sbx, amount: str = "40") -> str:
    """A deposit from an unknown address whose payer details were submitted (under review)."""
    tx = str(sbx.sandbox.inject_deposit(1002, "USDT", "TRON", amount, SOURCE)["transactionId"])
    async with ProviderClient(sbx.url, PROVIDER_KEY, PROVIDER_SECRET, retries=0) as client:
        await client.submit_payer(tx, ENTITY_PAYER, idempotency_key=f"k-{tx}")
    return tx


async def test_inject_then_approve_credits_the_deposit(sbx: Sbx, verb: Verb) -> None:
    """`inject` prints the new deposit's transactionId; after a submission `approve` passes its
    review and says so with the order's new statuses."""
    code, out, _ = await verb("inject", "--amount", "125.50", "--from", SOURCE)
    tx = out.split()[1].rstrip(":")
    assert code == 0 and out.startswith(f"deposit {tx}: 125.50 USDT (TRON) into wallet 1002")
    assert sbx.order(tx)["whiteListStatus"] == "init"
    async with ProviderClient(sbx.url, PROVIDER_KEY, PROVIDER_SECRET, retries=0) as client:
        await client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k")
    code, out, _ = await verb("approve", tx)
    assert code == 0
    assert out == (
        f"approved deposit {tx}: status SUCCESS, whiteListStatus approved, creditStatus CREDITED\n"
    )
    assert sbx.order(tx)["creditStatus"] == "CREDITED"


async def test_reject_with_a_message(sbx: Sbx, verb: Verb) -> None:
    """`reject TX --message` rejects the review with that failMessage."""
    tx = await _submitted(sbx)
    code, out, _ = await verb("reject", tx, "--message", "name does not match")
    assert code == 0 and out.startswith(f"rejected deposit {tx}: status PROCESSING")
    assert "whiteListStatus rejected" in out
    assert sbx.order(tx)["failMessage"] == "name does not match"


async def test_block_then_release(sbx: Sbx, verb: Verb) -> None:
    """`block` makes a held deposit BLOCKED; `release` credits it."""
    tx = str(sbx.sandbox.inject_deposit(1002, "USDT", "TRON", "7", SOURCE)["transactionId"])
    code, out, _ = await verb("block", tx)
    assert code == 0 and "creditStatus BLOCKED" in out and out.startswith("blocked deposit")
    code, out, _ = await verb("release", tx)
    assert code == 0 and "creditStatus CREDITED" in out and out.startswith("released deposit")
    assert sbx.order(tx)["status"] == "SUCCESS"


async def test_fail_and_sweep(sbx: Sbx, verb: Verb) -> None:
    """`fail` ends an uncredited order in FAIL; `sweep` ends the sweep of a credited deposit on
    an auto-collection wallet (1001)."""
    tx = str(sbx.sandbox.inject_deposit(1002, "USDT", "TRON", "3", SOURCE)["transactionId"])
    code, out, _ = await verb("fail", tx)
    assert code == 0 and out.startswith(f"failed deposit {tx}: status FAIL")
    swept = str(sbx.sandbox.inject_deposit(1001, "USDT", "TRON", "5", SOURCE)["transactionId"])
    async with ProviderClient(sbx.url, PROVIDER_KEY, PROVIDER_SECRET, retries=0) as client:
        await client.submit_payer(swept, ENTITY_PAYER, idempotency_key="s")
    sbx.sandbox.approve_review(swept)
    assert sbx.order(swept)["status"] == "PROCESSING"
    code, out, _ = await verb("sweep", swept)
    assert code == 0 and out.startswith(f"swept deposit {swept}: status SUCCESS")


async def test_a_refused_step_names_the_reason(sbx: Sbx, verb: Verb) -> None:
    """A step the state does not allow, or an unknown deposit, exits 1 with the sandbox's
    reason and changes nothing."""
    tx = str(sbx.sandbox.inject_deposit(1002, "USDT", "TRON", "3", SOURCE)["transactionId"])
    code, out, err = await verb("approve", tx)
    assert code == 1 and out == ""
    assert f"the sandbox refused approve: deposit {tx} is not under review (init)" in err
    assert sbx.order(tx)["whiteListStatus"] == "init"
    code, _, err = await verb("release", "T-no-such-deposit")
    assert code == 1 and "the sandbox refused release:" in err and "T-no-such-deposit" in err


async def test_abnormal_fund_with_its_notification(sbx: Sbx, verb: Verb) -> None:
    """`abnormal` injects an UNMATCHED abnormal fund and says whether it sent the webhook."""
    code, out, _ = await verb("abnormal", "--amount", "250.75", "--risk", "HIGH")
    assert code == 0
    assert out.startswith("abnormal fund 1: 250.75 USDT (TRON) from T")
    assert "UNMATCHED, risk HIGH" in out and out.endswith("ABNORMAL_FUND_NOTIFICATION sent\n")
    (fund,) = sbx.sandbox.snapshot()["abnormalFunds"]
    assert fund["amount"] == Decimal("250.75") and fund["addressRiskStatus"] == "HIGH"
    code, out, _ = await verb("abnormal", "--amount", "1", "--no-notify")
    assert code == 0 and out.endswith("; no webhook\n")


async def test_settlement_discrepancies(sbx: Sbx, verb: Verb) -> None:
    """`discrepancy drop|amount|extra|status` change one day's report; `clear` removes them."""
    tx = await _submitted(sbx)
    sbx.sandbox.approve_review(tx)
    day = dt.datetime.now(dt.UTC).date().isoformat()
    code, out, _ = await verb("discrepancy", "drop", "--tx", tx)
    assert (code, out) == (0, f"settlement report of {day}: deposit {tx} left out\n")
    code, out, _ = await verb("discrepancy", "amount", "--tx", tx, "--amount", "39.99")
    assert out == f"settlement report of {day}: deposit {tx} reported as 39.99\n"
    code, out, _ = await verb(
        "discrepancy", "extra", "--amount", "42", "--date", "2026-11-22", "--tx-hash", "0xnew"
    )
    assert out == "settlement report of 2026-11-22: extra record 42 USDT (TRON), txHash 0xnew\n"
    code, out, _ = await verb("discrepancy", "status", "--tx", tx, "--status", "MANUAL_REVIEW")
    assert out == f"settlement report of {day}: deposit {tx} MANUAL_REVIEW\n"
    assert len(sbx.sandbox.snapshot()["settlementDiscrepancies"]) == 4
    code, out, err = await verb("discrepancy", "drop")
    assert code == 1 and "needs --tx TX" in err
    code, out, _ = await verb("discrepancy", "clear")
    assert code == 0 and sbx.sandbox.snapshot()["settlementDiscrepancies"] == []


async def test_drop_webhooks(sbx: Sbx, verb: Verb) -> None:
    """`drop-webhooks N` loses the next N webhooks."""
    code, out, _ = await verb("drop-webhooks", "2")
    assert (code, out) == (0, "the next 2 webhook(s) will not be delivered (2 still to drop)\n")
    assert sbx.sandbox.snapshot()["webhooks"]["dropsOwed"] == 2


async def test_address_review_verbs(sbx: Sbx, verb: Verb) -> None:
    """`approve-address ID` and `reject-address ID` decide a source address registration."""
    async with ProviderClient(sbx.url, PROVIDER_KEY, PROVIDER_SECRET, retries=0) as client:
        body = {**ENTITY_PAYER, "walletId": 1002, "walletAddress": SOURCE, "network": "TRON"}
        first = await client.register_address(body, idempotency_key="a")
        other = {**body, "walletAddress": SOURCE[:-1] + "2"}
        second = await client.register_address(other, idempotency_key="b")
    code, out, _ = await verb("approve-address", str(first.id))
    assert (code, out) == (0, f"source address {first.id} ({SOURCE}, TRON): ACTIVE\n")
    code, out, _ = await verb("reject-address", str(second.id), "--message", "unreadable")
    assert code == 0 and out.endswith(": FAILED\n")


async def test_no_sandbox_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With nothing listening at provider.base_url a verb exits 1 naming the command that
    starts the sandbox."""
    path = write_config(
        tmp_path, make_config(Path("depositd.db"), NO_PROVIDER, log={"format": "json"})
    )
    assert await asyncio.to_thread(cli_main, ["sandbox", "block", "T1", "--config", str(path)])
    assert f"start it with `depositd sandbox --config {path}`" in capsys.readouterr().err
