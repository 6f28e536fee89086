"""`depositd register-address --from-csv FILE [--dry-run]`: every line checked before anything is
sent, then registered through the sandbox as the single command registers; run as the CLI
against a real stack (sandbox, worker), on both engines."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.processes import cli as command
from tests.support.stacks import MakeStack
from tests.support.stores import stack_rows
from worker.dev.harness import Stack

# Every test here runs on SQLite and on PostgreSQL, its stacks too.
pytestmark = pytest.mark.usefixtures("engine")

# Personal values of rules/profiles.yaml's demo profiles: never printed.
PAYER_VALUES = (
    "Demo Trading Ltd",
    "1 Demo Road, Singapore",
    "Demo hot wallet",
    "10 Demo Street",
    "1990-01-31",
)
GOOD = """\
wallet,address,network,profile,memo,tx_hash
1001,TCsvFirst000000000000000000001,TRON,demo-entity,,
1002,0x00000000000000000000000000000000000C5v02,ETH,demo-person,,0xfeed
1001,TCsvThird000000000000000000003,TRON,demo-entity,,
"""


@pytest.fixture
async def stack(start_stack: MakeStack) -> Stack:
    """Sandbox and worker with the shipped rules and demo profiles; no polls needed."""
    return await start_stack(scheduler=False)


@dataclass
class Ran:
    code: int
    out: str
    err: str


async def cli(config: Path, *args: str) -> Ran:
    """`python -m worker ARGS --config CONFIG`, run to its end (at most 60 s)."""
    ran = Ran(*await command(config, *args, within=60))
    for value in PAYER_VALUES:
        assert value not in ran.out + ran.err, "payer data printed"
    return ran


def csv_file(stack: Stack, text: str, name: str = "addresses.csv") -> Path:
    path = stack.workdir / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def address_rows(stack: Stack) -> list[tuple[Any, ...]]:
    """(walletId, address, network, status, profile) of the worker's addresses table."""
    return sorted(
        stack_rows(
            stack,
            "SELECT wallet_id, wallet_address, network, status, profile FROM addresses",
        )
    )


async def test_a_good_file_registers_every_address_and_a_second_run_skips_them(
    stack: Stack, register_bodies: list[dict[str, Any]]
) -> None:
    """Each line is registered at the sandbox with its profile's payer details, reported by
    its line number, and kept in the addresses table; the same file again sends nothing."""
    path = csv_file(stack, GOOD)
    ran = await cli(stack.config_path, "register-address", "--from-csv", str(path))
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert [line.split(": ")[0] for line in lines] == [f"{path}:{n}" for n in (2, 3, 4)]
    assert all(" PROCESSING" in line for line in lines), lines
    assert "3 registered, 0 already registered, 0 failed" in ran.err
    sent = {(b["walletId"], b["walletAddress"], b["network"]) for b in register_bodies}
    assert sent == {
        (1001, "TCsvFirst000000000000000000001", "TRON"),
        (1002, "0x00000000000000000000000000000000000C5v02", "ETH"),
        (1001, "TCsvThird000000000000000000003", "TRON"),
    }
    person = next(b for b in register_bodies if b["network"] == "ETH")
    assert person["correspondentType"] == "INDIVIDUAL" and person["txHash"] == "0xfeed"
    assert "memo" not in person
    assert len(stack.sandbox.state.addresses) == 3
    assert address_rows(stack) == [
        (1001, "TCsvFirst000000000000000000001", "TRON", "PROCESSING", "demo-entity"),
        (1001, "TCsvThird000000000000000000003", "TRON", "PROCESSING", "demo-entity"),
        (1002, "0x00000000000000000000000000000000000C5v02", "ETH", "PROCESSING", "demo-person"),
    ]

    again = await cli(stack.config_path, "register-address", "--from-csv", str(path))
    assert again.code == 0, again.err
    assert [line.endswith("(PROCESSING); skipped") for line in again.out.splitlines()] == [True] * 3
    assert len(register_bodies) == 3 and len(stack.sandbox.state.addresses) == 3


async def test_one_bad_line_sends_nothing_and_is_named(
    stack: Stack, register_bodies: list[dict[str, Any]]
) -> None:
    """A good file but for one line with a typo in its network: exit 2 naming that line (and
    the network it likely means); nothing reaches the sandbox or the addresses table."""
    path = csv_file(
        stack,
        GOOD.replace("TCsvThird000000000000000000003,TRON", "TCsvThird000000000000000000003,TRONN"),
    )
    ran = await cli(stack.config_path, "register-address", "--from-csv", str(path))
    assert ran.code == 2
    assert f"{path}:4: network 'TRONN' is not one depositd knows" in ran.err
    assert "did you mean 'TRON'?" in ran.err
    assert "nothing registered: 1 of 3 lines are wrong" in ran.err
    assert f"{path}:2" not in ran.err and f"{path}:3" not in ran.err
    assert ran.out == ""
    assert register_bodies == [] and stack.sandbox.state.addresses == {}
    assert address_rows(stack) == []


async def test_every_wrong_line_is_listed_with_its_number(
    stack: Stack, register_bodies: list[dict[str, Any]]
) -> None:
    """A wallet that is no number, an empty address, an unknown profile, a line repeating an
    earlier one, a field too many, an address registered already with another profile: each
    line named with all its problems, at once; nothing sent."""
    taken = "TCsvTaken000000000000000000009"
    first = csv_file(
        stack, f"wallet,address,network,profile\n1001,{taken},TRON,demo-entity\n", "a.csv"
    )
    assert (await cli(stack.config_path, "register-address", "--from-csv", str(first))).code == 0
    sent_before = len(register_bodies)
    path = csv_file(
        stack,
        f"""\
        network,wallet,address,profile

        TRON,main,TCsvA00000000000000000000001,demo-entity
        TRON,1001,,demo-entity
        TRON,1001,TCsvB00000000000000000000002,demo-entiti
        TRON,1001,TCsvC00000000000000000000003,demo-entity
        TRON,1001,TCsvC00000000000000000000003,demo-person
        TRON,1001,TCsvD00000000000000000000004,demo-entity,extra
        TRON,1001,{taken},demo-person
        """,
    )
    ran = await cli(stack.config_path, "register-address", "--from-csv", str(path))
    assert ran.code == 2
    wrong = {
        int(line.split(":")[1]): line for line in ran.err.splitlines() if line.startswith(str(path))
    }
    assert sorted(wrong) == [3, 4, 5, 7, 8, 9]
    assert "wallet must be a walletId (a positive whole number), not 'main'" in wrong[3]
    assert "address is empty" in wrong[4]
    assert (
        "no profile named 'demo-entiti'" in wrong[5] and "did you mean 'demo-entity'?" in wrong[5]
    )
    assert "the same address, network and wallet as line 6" in wrong[7]
    assert "1 more field(s) than the header names" in wrong[8]
    assert "already registered as" in wrong[9] and "with profile demo-entity" in wrong[9]
    assert "nothing registered: 6 of 7 lines are wrong" in ran.err
    assert len(register_bodies) == sent_before


async def test_dry_run_checks_and_reports_and_sends_nothing(
    stack: Stack, register_bodies: list[dict[str, Any]]
) -> None:
    """--dry-run reports what each line would register and sends nothing (exit 0); with a wrong
    line it fails as the real run would (exit 2)."""
    path = csv_file(stack, GOOD)
    ran = await cli(stack.config_path, "register-address", "--from-csv", str(path), "--dry-run")
    assert ran.code == 0, ran.err
    assert ran.out.splitlines() == [
        f"{path}:2: would register TCsvFirst000000000000000000001 on TRON into wallet 1001 with"
        " profile demo-entity",
        f"{path}:3: would register 0x00000000000000000000000000000000000C5v02 on ETH into wallet"
        " 1002 with profile demo-person",
        f"{path}:4: would register TCsvThird000000000000000000003 on TRON into wallet 1001 with"
        " profile demo-entity",
    ]
    assert "dry run: 3 to register, 0 already registered; nothing sent" in ran.err
    bad = csv_file(stack, GOOD.replace("demo-person", "nobody"), "bad.csv")
    refused = await cli(stack.config_path, "register-address", "--from-csv", str(bad), "--dry-run")
    assert refused.code == 2 and f"{bad}:3: no profile named 'nobody'" in refused.err
    assert register_bodies == [] and stack.sandbox.state.addresses == {}
    assert address_rows(stack) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", ":1: the file is empty: it needs a header line"),
        ("wallet,address,network\n1001,TX,TRON\n", ":1: the header line has no profile column"),
        ("wallet,address,netwrk,profile\n", ":1: unknown column 'netwrk'"),
        ("wallet,address,network,profile\n\n", ": no line after the header: nothing to register"),
        (
            "wallet,address,network,profile\n1001," + "T" * 200_000 + ",TRON,demo-person\n",
            ":2: field larger than field limit",
        ),
    ],
)
async def test_a_file_that_is_no_address_list_is_refused(
    stack: Stack, text: str, problem: str
) -> None:
    """No header, a required column missing, an unknown column, no line: exit 2 naming the
    file (and the header's line)."""
    path = csv_file(stack, text)
    ran = await cli(stack.config_path, "register-address", "--from-csv", str(path))
    assert ran.code == 2 and f"{path}{problem}" in ran.err, ran.err


async def test_the_options_of_one_address_do_not_go_with_a_file(stack: Stack) -> None:
    """--from-csv with --profile (or --dry-run without a file, or no address at all) is a usage
    error: exit 2, nothing sent."""
    path = csv_file(stack, GOOD)
    ran = await cli(
        stack.config_path, "register-address", "--from-csv", str(path), "--profile", "demo-entity"
    )
    assert ran.code == 2 and "not --profile" in ran.err
    alone = await cli(stack.config_path, "register-address", "--dry-run")
    assert alone.code == 2 and "--dry-run goes with --from-csv" in alone.err
    nothing = await cli(stack.config_path, "register-address")
    assert nothing.code == 2 and "--wallet, --address, --network, --profile needed" in nothing.err
    assert stack.sandbox.state.addresses == {}


async def test_sending_keeps_to_the_provider_request_budget(
    stack: Stack, recorded: list[dict[str, Any]]
) -> None:
    """With `provider.max_requests_per_s: 2`, the registrations (a register and a detail read
    each) are spaced out at that rate, as the polls' calls are."""
    config = yaml.safe_load(stack.config_path.read_text(encoding="utf-8"))
    config["provider"]["max_requests_per_s"] = 2
    slow = stack.workdir / "slow.yaml"
    slow.write_text(yaml.safe_dump(config), encoding="utf-8")
    ran = await cli(slow, "register-address", "--from-csv", str(csv_file(stack, GOOD)))
    assert ran.code == 0, ran.err
    calls = [
        r["at"] for r in recorded if r["path"].startswith("/v1/wallet/deposit-whitelist/addresses")
    ]
    assert len(calls) == 6
    # Two at once (a second's worth), then one every half second.
    assert calls[-1] - calls[0] >= 1.8
