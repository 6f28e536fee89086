"""The known-address flow: `register(...)`, `depositd register-address` and the addresses table."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.configs import make_config, write_config
from tests.support.processes import Processes
from worker.commands.registration import register, register_body, save_address
from worker.dev.harness import Stack, shipped_profiles
from worker.dev.sandbox.records import Address
from worker.errors import ConfigError
from worker.provider.client import ProviderClient
from worker.provider.codes import code_rule
from worker.provider.models import AddressStatus, SourceAddress

REPO = Path(__file__).resolve().parents[2]
PROFILE = "demo-entity"  # rules/profiles.yaml
# The demo-entity profile's personal data: it must never be printed or alerted.
PAYER_VALUES = ("Demo Trading Ltd", "1 Demo Road, Singapore", "Demo hot wallet")
FAST_POLL_S = 0.05


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    """A running sandbox + worker with the shipped rules and demo profiles."""
    async with Stack(tmp_path / "stack", history_interval_s=0.3, detail_interval_s=0.3) as s:
        yield s


def client_of(stack: Stack) -> ProviderClient:
    """The worker's own provider client."""
    assert stack.runtime.client is not None
    return stack.runtime.client


def register_at(stack: Stack, address: str, **kw: Any) -> Coroutine[Any, Any, SourceAddress]:
    """`register(...)` through the worker's client and store: wallet 1001, TRON, PROFILE."""
    kw.setdefault("profile", PROFILE)
    kw.setdefault("poll_s", FAST_POLL_S)
    return register(
        stack.settings,
        client_of(stack),
        stack.store,
        wallet_id=1001,
        address=address,
        network="TRON",
        **kw,
    )


async def address_rows(stack: Stack) -> dict[str, dict[str, Any]]:
    """The worker's addresses table by record id."""
    return await stack.store.read(
        lambda db: {r["id"]: dict(r) for r in db.query("SELECT * FROM addresses")}
    )


async def new_record(stack: Stack, before: set[str]) -> str:
    """Wait for a source address record the sandbox did not have before; its id."""
    await stack.wait_for(
        lambda: bool(set(stack.sandbox.state.addresses) - before), 10, "a registration"
    )
    (record_id,) = set(stack.sandbox.state.addresses) - before
    return record_id


@dataclass
class Ran:
    """A finished CLI run."""

    code: int
    out: str
    err: str


async def cli(processes: Processes, stack: Stack, *args: str) -> asyncio.subprocess.Process:
    """Start `python -m worker ARGS --config <the stack's config>` without waiting for it."""
    return await cli_with(processes, stack.config_path, *args)


async def cli_with(processes: Processes, config: Path, *args: str) -> asyncio.subprocess.Process:
    """Start `python -m worker ARGS --config CONFIG` without waiting for it."""
    return processes.own(
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "worker",
            *args,
            "--config",
            str(config),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    )


async def finished(proc: asyncio.subprocess.Process, timeout: float = 20) -> Ran:  # noqa: ASYNC109
    """Wait for a CLI run and collect its output."""
    async with asyncio.timeout(timeout):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


def register_args(address: str, *extra: str) -> list[str]:
    """`register-address` arguments for wallet 1001 on TRON with the demo-entity profile."""
    return [
        "register-address",
        "--wallet",
        "1001",
        "--address",
        address,
        "--network",
        "TRON",
        "--profile",
        PROFILE,
        *extra,
    ]


def assert_no_payer_data(*texts: str) -> None:
    """None of the profile's personal values appears in `texts`."""
    for text in texts:
        for value in PAYER_VALUES:
            assert value not in text


async def test_register_polls_until_active_and_sends_the_register_form(
    stack: Stack, register_bodies: list[dict[str, Any]]
) -> None:
    """register() sends payer details plus walletAddress/network, polls, stores ACTIVE."""
    address = "TKnownActive00000000000000000001"
    task = asyncio.create_task(register_at(stack, address))
    record_id = await new_record(stack, set())

    async def stored() -> bool:
        return record_id in await address_rows(stack)

    await stack.wait_for(stored, 5, "the PROCESSING row")
    assert (await address_rows(stack))[record_id]["status"] == "PROCESSING"
    assert not task.done(), "the command must wait for the review"
    stack.sandbox.approve_address(record_id)
    record = await asyncio.wait_for(task, 5)

    assert record.id == record_id and record.status is AddressStatus.ACTIVE
    row = (await address_rows(stack))[record_id]
    assert (row["status"], row["wallet_id"], row["wallet_address"], row["network"]) == (
        "ACTIVE",
        1001,
        address,
        "TRON",
    )
    assert row["profile"] == PROFILE
    [body] = register_bodies
    assert body == {**stack.runtime.profiles.body(PROFILE), **body}, "payer fields missing"
    assert body["walletAddress"] == address and body["network"] == "TRON"
    assert body["walletId"] == 1001
    assert {"correspondentType", "fullName", "countryCode", "companyAddress"} <= set(body)
    assert not {"countryInfo", "submitStatus", "memo", "txHash"} & set(body)
    assert stack.slack == [] and stack.emails == []


def test_register_body_carries_memo_and_tx_hash_only_when_given() -> None:
    """The register body adds memo/txHash when given and keeps the payer details untouched."""
    payer = {"correspondentType": "ENTITY", "fullName": "X Ltd", "countryCode": "SG"}
    plain = register_body(payer, wallet_id=7, address="A1", network="TON")
    assert plain == {**payer, "walletId": 7, "walletAddress": "A1", "network": "TON"}
    full = register_body(payer, wallet_id=7, address="A1", network="TON", memo="m", tx_hash="h")
    assert (full["memo"], full["txHash"]) == ("m", "h")
    assert payer == {"correspondentType": "ENTITY", "fullName": "X Ltd", "countryCode": "SG"}


async def test_unknown_profile_is_a_config_error(stack: Stack) -> None:
    """Naming a profile that does not exist registers nothing and fails as bad configuration."""
    with pytest.raises(ConfigError):
        await register_at(stack, "TNoSuchProfile0000000000000000001", profile="no-such-profile")
    assert stack.sandbox.state.addresses == {}


async def test_failed_alerts_then_replace_failed_registers_anew_and_deposits_skip_whitelist(
    stack: Stack, processes: Processes
) -> None:
    """FAILED alerts (exit 1); --replace-failed disables it, registers anew; deposits then book."""
    address = "TKnownFailedFirst000000000000001"
    stack.sandbox.set_fault("address_detail", "5xx", count=1)  # a retry that gets logged
    proc = await cli(processes, stack, *register_args(address))
    failed_id = await new_record(stack, set())
    stack.sandbox.reject_address(failed_id, "payer name does not match the exchange's records")
    first = await finished(proc)
    assert first.code == 1, first.err
    assert json.loads(first.out)["status"] == "FAILED", "stdout must hold only the record"
    assert "retrying" in first.err
    await stack.wait_for(
        lambda: (
            any("address_failed" in json.dumps(p) for p in stack.slack)
            and any(m.get("X-Depositd-Condition") == "address_failed" for m in stack.emails)
        ),
        5,
        "the address_failed alert",
    )
    [slack] = stack.slack
    assert address in json.dumps(slack) and failed_id in json.dumps(slack)
    [mail] = stack.emails
    assert_no_payer_data(first.out, first.err, json.dumps(slack), mail.as_string())
    assert (await address_rows(stack))[failed_id]["status"] == "FAILED"

    proc = await cli(processes, stack, *register_args(address, "--replace-failed"))
    active_id = await new_record(stack, {failed_id})
    stack.sandbox.approve_address(active_id)
    second = await finished(proc)
    assert second.code == 0, second.err
    assert json.loads(second.out) == {**json.loads(second.out), "id": active_id, "status": "ACTIVE"}
    assert_no_payer_data(second.out, second.err)
    assert stack.sandbox.state.address(failed_id).status is AddressStatus.DISABLED
    rows = await address_rows(stack)
    assert {i: r["status"] for i, r in rows.items()} == {
        failed_id: "DISABLED",
        active_id: "ACTIVE",
    }
    assert len(stack.slack) == 1, "an ACTIVE registration raises no alert"

    # A deposit from the ACTIVE address: no whitelist step, booked on completion.
    order = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "250.75", address)
    tx = str(order["transactionId"])
    stack.sandbox.finish_sweep(tx)  # wallet 1001 sweeps: SUCCESS after the sweep
    await stack.wait_for(lambda: bool(stack.sandbox.deliverer.history), 5, "the webhook")
    await stack.settle()

    assert [e["event_type"] for e in await stack.events(tx)] == ["DEPOSIT_ORDER_NOTIFICATION"]
    assert [(r["transaction_id"], r["amount"]) for r in await stack.ledger()] == [(tx, "250.75")]
    assert {a["action"] for a in await stack.actions(tx)} == {"book"}
    deposit = await stack.deposit(tx)
    assert deposit is not None and deposit.white_list_status is None


async def test_replacing_twice_registers_a_new_record_each_time(stack: Stack) -> None:
    """A second --replace-failed after another FAILED registers again, not a replay of the first."""
    address = "TKnownFailedTwice000000000000001"
    seen: set[str] = set()
    for replace in (False, True, True):
        task = asyncio.create_task(register_at(stack, address, replace_failed=replace))
        record_id = await new_record(stack, seen)
        seen.add(record_id)
        stack.sandbox.reject_address(record_id, "rejected again")
        record = await asyncio.wait_for(task, 5)
        assert (record.id, record.status) == (record_id, AddressStatus.FAILED)
    statuses = {i: r["status"] for i, r in (await address_rows(stack)).items()}
    assert sorted(statuses.values()) == ["DISABLED", "DISABLED", "FAILED"]
    assert len(seen) == 3


async def test_wallet_address_updated_webhooks_update_the_addresses_table(stack: Stack) -> None:
    """WALLET_ADDRESS_UPDATED moves a registered record to ACTIVE or FAILED without any polling."""
    ids = []
    for address in ("TKnownHookActive000000000000001", "TKnownHookFailed000000000000001"):
        record = await register_at(stack, address, wait=False)
        assert record.status is AddressStatus.PROCESSING
        ids.append(record.id)
    active_id, failed_id = ids
    stack.sandbox.approve_address(active_id)
    stack.sandbox.reject_address(failed_id, "unknown exchange account")
    await stack.settle()

    rows = await address_rows(stack)
    assert (rows[active_id]["status"], rows[active_id]["profile"]) == ("ACTIVE", PROFILE)
    assert (rows[failed_id]["status"], rows[failed_id]["fail_message"]) == (
        "FAILED",
        "unknown exchange account",
    )
    events = await stack.events()
    assert [(e["event_type"], e["status"]) for e in events] == [
        ("WALLET_ADDRESS_UPDATED", "processed")
    ] * 2


async def test_addresses_command_lists_active_records(stack: Stack, processes: Processes) -> None:
    """`depositd addresses --json` prints the registered records with their status."""
    address = "TKnownListed0000000000000000001"
    task = asyncio.create_task(register_at(stack, address))
    record_id = await new_record(stack, set())
    stack.sandbox.approve_address(record_id)
    await asyncio.wait_for(task, 5)

    ran = await finished(await cli(processes, stack, "addresses", "--json"))
    assert ran.code == 0, ran.err
    [line] = [json.loads(line) for line in ran.out.splitlines() if line.strip()]
    assert {k: line[k] for k in ("id", "walletId", "walletAddress", "network", "status")} == {
        "id": record_id,
        "walletId": 1001,
        "walletAddress": address,
        "network": "TRON",
        "status": "ACTIVE",
    }
    assert line["profile"] == PROFILE
    assert_no_payer_data(ran.out, ran.err)


def json_logs(stderr: str) -> list[dict[str, Any]]:
    """The JSON log lines of a CLI run's stderr (its progress lines are plain text)."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


async def test_refusal_prints_code_meaning_and_field_names_never_the_message(
    tmp_path: Path, processes: Processes
) -> None:
    """A refused registration prints the code, its meaning and the payer fields named, no values."""
    secret = "Secret Payer VASP Ltd"
    data = yaml.safe_load(shipped_profiles().read_text(encoding="utf-8"))
    data["profiles"][PROFILE]["provider"] = secret  # not in the options list: 10000103
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(yaml.safe_dump(data), encoding="utf-8")
    async with Stack(tmp_path / "stack", profiles=profiles) as stack:
        ran = await finished(
            await cli(processes, stack, *register_args("TKnownRefused0000000000000001"))
        )
        assert stack.sandbox.state.addresses == {}
    assert ran.code == 1 and ran.out == ""
    rule = code_rule("10000103")
    assert rule is not None
    assert f"code 10000103 ({rule.meaning})" in ran.err
    assert "names provider" in ran.err
    assert secret not in ran.err
    assert_no_payer_data(ran.err)


async def test_printed_record_holds_only_the_declared_address_fields(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, processes: Processes
) -> None:
    """An answer that echoes payer details prints the record's own fields only."""
    real = Address.wire
    payer = stack.runtime.profiles.body(PROFILE)

    def echoing(self: Address) -> dict[str, Any]:
        return {**real(self), **payer}

    monkeypatch.setattr(Address, "wire", echoing)
    ran = await finished(
        await cli(processes, stack, *register_args("TKnownEchoing0000000000000001", "--no-wait"))
    )
    assert ran.code == 0, ran.err
    printed = json.loads(ran.out)
    assert printed["status"] == "PROCESSING"
    assert set(printed) <= set(SourceAddress.model_fields)
    assert_no_payer_data(ran.out, ran.err)


async def test_rerun_after_rejection_prints_and_keeps_failed(
    stack: Stack, processes: Processes
) -> None:
    """The same --no-wait command re-run after a rejection reports FAILED and keeps it stored."""
    address = "TKnownRerun00000000000000000001"
    first = await finished(await cli(processes, stack, *register_args(address, "--no-wait")))
    assert first.code == 0, first.err
    record_id = json.loads(first.out)["id"]
    stack.sandbox.reject_address(record_id, "payer name does not match the exchange's records")

    async def stored_failed() -> bool:
        return (await address_rows(stack))[record_id]["status"] == "FAILED"

    await stack.wait_for(stored_failed, 5, "the FAILED webhook")

    again = await finished(await cli(processes, stack, *register_args(address, "--no-wait")))
    assert again.code == 1, again.err
    printed = json.loads(again.out)
    assert (printed["id"], printed["status"]) == (record_id, "FAILED")
    assert set(stack.sandbox.state.addresses) == {record_id}, "nothing registered anew"
    row = (await address_rows(stack))[record_id]
    assert (row["status"], row["profile"]) == ("FAILED", PROFILE)


async def test_save_address_never_moves_a_record_back(stack: Stack) -> None:
    """An older answer (an earlier status) never overwrites the stored status."""
    record = SourceAddress(
        id="A-order",
        walletId=1001,
        walletAddress="TKnownOrder000000000000000001",
        network="TRON",
        status=AddressStatus.PROCESSING,
    )
    steps = [
        (AddressStatus.FAILED, "rejected", "FAILED"),
        (AddressStatus.PROCESSING, None, "FAILED"),
        (AddressStatus.DISABLED, "rejected", "DISABLED"),
        (AddressStatus.FAILED, "rejected", "DISABLED"),
    ]
    await stack.store.write(lambda db: save_address(db, record, None))
    for status, fail, expected in steps:
        answer = record.model_copy(update={"status": status, "failMessage": fail})
        await stack.store.write(lambda db, a=answer: save_address(db, a, PROFILE))
        row = (await address_rows(stack))[record.id]
        assert (row["status"], row["profile"]) == (expected, PROFILE)
    assert row["fail_message"] == "rejected"


async def test_failed_without_notify_is_logged_without_payer_data(
    tmp_path: Path, processes: Processes
) -> None:
    """With `notify` absent a FAILED address is logged as a warning (alerts logged only)."""
    address = "TKnownQuietFailed00000000000001"
    async with Stack(tmp_path / "stack", notify=False) as stack:
        proc = await cli(processes, stack, *register_args(address))
        record_id = await new_record(stack, set())
        stack.sandbox.reject_address(record_id, "fullName does not match the exchange's records")
        ran = await finished(proc)
    assert ran.code == 1, ran.err
    [alert] = [line for line in json_logs(ran.err) if line.get("event") == "alert"]
    assert alert["level"] == "warning"
    assert (alert["condition"], alert["addressId"], alert["profile"]) == (
        "address_failed",
        record_id,
        PROFILE,
    )
    assert (alert["walletAddress"], alert["network"]) == (address, "TRON")
    assert alert["failFields"] == ["fullName"]
    assert "does not match" not in json.dumps(alert), "the provider's message is not logged"
    assert_no_payer_data(ran.err)


@pytest.mark.parametrize(
    ("with_profiles", "problem"),
    [
        (True, "no profile named 'nope'"),
        (False, "profiles: no profiles file is configured, so there is no profile named 'nope'"),
    ],
)
async def test_a_refused_profile_creates_no_database(
    tmp_path: Path, with_profiles: bool, problem: str, processes: Processes
) -> None:
    """An unknown profile (or no profiles file) exits 2 before the database or its folder exist."""
    data_dir = tmp_path / "data"
    profiles = str(shipped_profiles()) if with_profiles else None
    config_path = write_config(tmp_path, make_config(data_dir / "depositd.db", profiles=profiles))
    args = register_args("TKnownNoProfile000000000000001")
    args[args.index(PROFILE)] = "nope"

    ran = await finished(await cli_with(processes, config_path, *args))
    assert ran.code == 2, ran.err
    assert problem in ran.err
    assert "None" not in ran.err
    assert not data_dir.exists()
