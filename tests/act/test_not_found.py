"""10000100 on a submission: the history queues (init, then rejected) are read again, then the
detail; only a deposit in neither queue and unknown to the detail is gone (sandbox, worker, SMTP
and Slack on loopback through worker.dev.harness)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.stacks import MakeStack
from worker.dev.harness import Stack
from worker.errors import WalletCodeError

PAYER_ADDRESS = "TNotFoundPayer000000000000000001"
ENTITY = {
    "correspondentType": "ENTITY",
    "fullName": "Quillon Ferry Traders Ltd",
    "countryCode": "SG",
    "companyAddress": "9 Ferry Lane, Singapore",
    "walletType": "VASP",
    "provider": "Binance",
}

Recorded = list[dict[str, Any]]


def profiles_yaml(**changes: str) -> str:
    """A profiles file with one entity profile for PAYER_ADDRESS."""
    profile = {**ENTITY, **changes}
    return json.dumps({"profiles": {"nf": profile}, "addresses": {PAYER_ADDRESS: "nf"}})


@pytest.fixture
def make_stack(tmp_path: Path, start_stack: MakeStack) -> MakeStack:
    """A Stack without polls (every provider read is the submission's) and the test profile."""

    async def make() -> Stack:
        path = tmp_path / "profiles-source.yaml"
        path.write_text(profiles_yaml())
        return await start_stack(profiles=path, scheduler=False)

    return make


def reads_after_last_submit(recorded: Recorded, tx: str) -> list[str]:
    """The provider reads made after the last submit of `tx`: `init`, `rejected` (history
    queues) and `detail`, in order."""
    last = max(i for i, r in enumerate(recorded) if r["path"].endswith(f"/{tx}/submit"))
    out = []
    for r in recorded[last + 1 :]:
        if r["method"] != "GET":
            continue
        if r["path"].startswith("/v1/wallet/history"):
            out.append("init" if "whiteListStatus=init" in r["path"] else "rejected")
        elif r["path"].startswith(f"/v1/wallet/transactions/{tx}"):
            out.append("detail")
    return out


async def submit_rows(stack: Stack, tx: str) -> list[dict[str, Any]]:
    """The deposit's submit_profile rows."""
    return [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]


async def row_ends(stack: Stack, tx: str, n: int) -> dict[str, Any]:
    """Wait until the deposit's `n`th submission row has ended; that row."""

    async def ended() -> bool:
        rows = await submit_rows(stack, tx)
        return len(rows) >= n and rows[n - 1]["status"] not in ("pending", "running")

    await stack.wait_for(ended, what=f"submission {n} to end")
    await stack.settle()
    return (await submit_rows(stack, tx))[n - 1]


def severities(stack: Stack) -> list[str]:
    """The severity word of every Slack alert received."""
    return [str(p["text"]).split()[0] for p in stack.slack]


async def test_10000100_deposit_in_the_init_queue_is_not_gone(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000100 while the init queue still lists the deposit (its detail answering 10000100 too):
    the queue is read first, then the detail; a warning that it waits, not a critical 'gone'."""
    stack = await make_stack()
    stack.sandbox.set_fault("submit", "code", count=1, code="10000100")
    stack.sandbox.set_fault("detail", "code", count=1, code="10000100")
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "70.5", PAYER_ADDRESS)["transactionId"]
    row = await row_ends(stack, tx, 1)

    assert reads_after_last_submit(recorded, tx) == ["init", "detail"]
    assert row["status"] == "failed"
    assert "listed in the init queue" in row["outcome"] and "gone" not in row["outcome"]
    assert len(stack.slack) == 1 and len(stack.emails) == 1
    assert "WARNING" in stack.slack[0]["text"]
    assert "still waits for payer details" in json.dumps(stack.slack[0])
    assert len(await submit_rows(stack, tx)) == 1


async def test_10000100_deposit_in_the_rejected_queue_is_not_gone(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000100 on a resubmission after a rejection: init then rejected queue read, then the
    detail; found rejected, so no 'gone' alert and no new submission."""
    stack = await make_stack()
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "70.5", PAYER_ADDRESS)["transactionId"]
    await row_ends(stack, tx, 1)
    stack.sandbox.reject_review(tx, "company address mismatch")
    await stack.settle()
    alerts_before = len(stack.slack)
    stack.sandbox.set_fault("submit", "code", count=1, code="10000100")
    stack.sandbox.set_fault("detail", "code", count=1, code="10000100")
    assert await stack.rewrite_profiles(profiles_yaml(companyAddress="10 Ferry Lane, Singapore"))
    row = await row_ends(stack, tx, 2)

    assert reads_after_last_submit(recorded, tx) == ["init", "rejected", "detail"]
    assert row["status"] == "failed" and "listed in the rejected queue" in row["outcome"]
    assert "CRITICAL" not in " ".join(severities(stack))
    assert len(stack.slack) == alerts_before  # moved on: the rejection was alerted already
    assert len(await submit_rows(stack, tx)) == 2


async def test_10000100_deposit_really_gone_alerts_critical(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """The provider no longer has the deposit (no queue lists it, the detail answers 10000100):
    one critical alert saying so, no retry."""
    stack = await make_stack()
    original = stack.sandbox.submit

    def forgotten(tx_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        stack.sandbox.state.orders.pop(tx_id)  # the provider forgets the deposit
        return original(tx_id, body)  # answers 10000100: transaction not found

    stack.sandbox.submit = forgotten  # type: ignore[method-assign]
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "70.5", PAYER_ADDRESS)["transactionId"]
    row = await row_ends(stack, tx, 1)

    assert reads_after_last_submit(recorded, tx) == ["init", "rejected", "detail"]
    assert row["status"] == "failed" and "deposit gone" in row["outcome"]
    assert len(stack.slack) == 1 and len(stack.emails) == 1
    assert "CRITICAL" in stack.slack[0]["text"]
    assert "no longer has it" in json.dumps(stack.slack[0])
    assert len(await submit_rows(stack, tx)) == 1
    with pytest.raises(WalletCodeError):
        original(tx, {})
