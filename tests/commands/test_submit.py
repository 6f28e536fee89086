"""`depositd submit TX --profile NAME --by WHO`: the approve path for a deposit a rule held for a
person, against a real stack (sandbox, worker, Slack endpoint, SMTP server)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.stacks import MakeStack
from worker.act.queue import submit_key
from worker.commands.cli import main
from worker.config.profiles import Profiles
from worker.dev.harness import Stack
from worker.notify.message import build_alert, render_text
from worker.store import operator as operator_store

UNKNOWN = "THeldForAPerson000000000000000001"
# Large deposits wait for a person even though a stored profile applies (wallet 1002 falls back
# to demo-entity in the shipped profiles); small ones are submitted by the rule.
HOLD_LARGE = """\
wallet: "*"
rules:
  - name: large to a human
    "on": [needs_details]
    if: {amount: {gt: "1000"}}
    then:
      - alert: {severity: warning, message: large deposit held for review}
  - name: small submitted
    "on": [needs_details]
    if: {amount: {lte: "1000"}, profile: found}
    then: [submit_profile]
  - name: book
    "on": [credited]
    then: [book]
"""


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command line in a thread (the stack keeps running on this loop)."""
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def _held(tmp_path: Path, start_stack: MakeStack) -> tuple[Stack, str]:
    rules = tmp_path / "hold.yaml"
    rules.write_text(HOLD_LARGE, encoding="utf-8")
    stack = await start_stack(rules=rules, scheduler=False)
    order = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "5000.00", UNKNOWN)
    tx = str(order["transactionId"])
    await stack.settle()
    deposit = await stack.deposit(tx)
    assert deposit is not None and deposit.state.value == "needs_details"
    return stack, tx


@pytest.mark.usefixtures("engine")  # its stacks on SQLite and on PostgreSQL
async def test_a_held_deposit_is_submitted_once_and_recorded(
    tmp_path: Path, start_stack: MakeStack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The alert of a deposit held by a rule names the command; the command submits the stored
    profile through the outbox (the sandbox takes it: pending), recorded as an operator action
    with who and the note; a second run submits nothing new and reports the first."""
    stack, tx = await _held(tmp_path, start_stack)
    slack = json.dumps(stack.slack_for(tx, "needs_details"))
    assert f"depositd submit {tx} --profile demo-entity --by YOUR_NAME" in slack
    config = str(stack.config_path)

    code, out, err = await _cli(
        capsys, "submit", tx, "--profile", "demo-entity", "--by", "ana", "--note", "KYC seen",
        "--config", config, "--wait", "0",
    )  # fmt: skip
    assert code == 0, err
    assert f"{tx}: queued submission #" in out and "profile demo-entity" in out
    await stack.settle()
    assert stack.sandbox.state.orders[tx].white_list_status.value == "pending"
    deposit = await stack.deposit(tx)
    assert deposit is not None and deposit.state.value == "submitted"
    submissions = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
    assert len(submissions) == 1
    first = submissions[0]
    assert first["trigger"] == "operator" and first["status"] == "done"
    assert first["params"]["profile"] == "demo-entity" and first["params"]["named"] is True
    recorded = await stack.store.read(lambda db: operator_store.recent(db, subject=tx))
    assert [(r["kind"], r["remote"], r["note"]) for r in recorded] == [
        ("submit_profile", "ana@cli", "KYC seen")
    ]
    # Who submitted, and why, shows in the deposit's history (JSON and text), not only the
    # trigger `operator`; the facts say the submission moved the deposit, and to what.
    code, out, err = await _cli(capsys, "deposits", tx, "--json", "--config", config)
    assert code == 0, err
    shown = json.loads(out)
    assert [(o["kind"], o["by"], o["note"]) for o in shown["operatorActions"]] == [
        ("submit_profile", "ana@cli", "KYC seen")
    ]
    assert shown["operatorActions"][0]["outcome"].startswith("queued submission #")
    assert {"from": "needs_details", "to": "submitted"} in [f["moved"] for f in shown["facts"]]
    code, out, err = await _cli(capsys, "deposits", tx, "--config", config)
    assert code == 0, err
    operator = out.split("\noperator actions\n", 1)[1].splitlines()
    assert operator[0].split() == ["at", "by", "kind", "note", "outcome"]
    assert "ana@cli  submit_profile  KYC seen  queued submission #" in operator[1]
    assert "moved needs_details -> submitted (whiteListStatus)" in out

    code, out, err = await _cli(
        capsys, "submit", tx, "--profile", "demo-entity", "--by", "ana", "--config", config
    )
    assert code == 0, err
    assert f"submitted already: submission #{first['id']} (done" in out
    await stack.settle()
    again = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
    assert [a["id"] for a in again] == [first["id"]]


@pytest.mark.usefixtures("engine")  # its stacks on SQLite and on PostgreSQL
async def test_a_profile_that_does_not_fit_is_refused_naming_fields_not_values(
    tmp_path: Path, start_stack: MakeStack, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile of the wrong correspondentType's fields and missing ones is refused (exit 2)
    naming the fields, never their values; nothing is queued or submitted."""
    stack, tx = await _held(tmp_path, start_stack)
    text = stack.profiles_path.read_text(encoding="utf-8")
    bad = (
        "  wrong-person:\n"
        "    correspondentType: INDIVIDUAL\n"
        "    fullName: Zebedee Quorn-Hastings\n"
        "    firstName: Zebedee\n"
        "    countryCode: GB\n"
        "    walletType: SELF_HOSTED\n"
    )
    stack.profiles_path.write_text(
        text.replace("profiles:\n", "profiles:\n" + bad, 1), encoding="utf-8"
    )
    code, out, err = await _cli(
        capsys, "submit", tx, "--profile", "wrong-person", "--by", "ana",
        "--config", str(stack.config_path),
    )  # fmt: skip
    assert code == 2
    for field in ("fullName", "lastName", "birthday", "residentialAddress"):
        assert field in err
    assert "Zebedee" not in err + out and "Quorn" not in err + out
    assert not [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
    assert stack.sandbox.state.orders[tx].white_list_status.value == "init"


@pytest.mark.usefixtures("engine")  # its stacks on SQLite and on PostgreSQL
async def test_unknown_profiles_deposits_and_deposits_no_longer_waiting_are_refused(
    tmp_path: Path, start_stack: MakeStack, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown profile (exit 2, the closest name), an unknown deposit (exit 1) and a
    deposit no longer waiting for details (exit 1) submit nothing; refusals are recorded."""
    stack, tx = await _held(tmp_path, start_stack)
    config = str(stack.config_path)
    code, _, err = await _cli(
        capsys, "submit", tx, "--profile", "demo-entty", "--by", "ana", "--config", config
    )
    assert code == 2 and "unknown profile 'demo-entty'" in err and "demo-entity" in err
    code, _, err = await _cli(
        capsys, "submit", "no-such-tx", "--profile", "demo-entity", "--by", "ana",
        "--config", config,
    )  # fmt: skip
    assert code == 1 and "no tracked deposit no-such-tx" in err
    code, _, _ = await _cli(
        capsys, "submit", tx, "--profile", "demo-entity", "--by", "ana", "--config", config,
        "--wait", "0",
    )  # fmt: skip
    assert code == 0
    await stack.settle()
    code, _, err = await _cli(
        capsys, "submit", tx, "--profile", "demo-person", "--by", "ana", "--config", config
    )
    assert code == 1 and "is submitted, not waiting for payer details" in err
    submissions = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
    assert len(submissions) == 1
    recorded = await stack.store.read(lambda db: operator_store.recent(db, subject=tx))
    assert [r["outcome"].split(":")[0] for r in reversed(recorded)] == [
        "unknown profile 'demo-entty' (known",
        f"queued submission #{submissions[0]['id']} of profile demo-entity",
        "refused",
    ]


async def test_a_missing_by_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`--by` is required (who submits is recorded): without it, exit 2 before anything."""
    with pytest.raises(SystemExit) as exit_:
        main(["submit", "tx-1", "--profile", "p"])
    assert exit_.value.code == 2
    assert main(["submit", "tx-1", "--profile", "p", "--by", " \x1b "]) == 2
    assert "--by NAME is required" in capsys.readouterr().err


def _alert_next_step(condition: str, profile: str | None) -> str:
    deposit: Any = type("D", (), {"transaction_id": "tx-9", "wallet_id": 1002})()
    return render_text(build_alert(condition, "warning", deposit, profile=profile))


def test_alerts_name_the_command_for_the_case_at_hand() -> None:
    """Held by a rule (a profile applies): submit it; no profile: store one, then submit it;
    rejected: correct it, then submit it. Each names the deposit's transactionId."""
    held = " ".join(_alert_next_step("needs_details", "acme").split())
    assert "depositd submit tx-9 --profile acme --by YOUR_NAME" in held
    assert "store a profile" not in held
    none = " ".join(_alert_next_step("needs_details", None).split())
    assert "No stored profile applies: store a profile" in none
    assert "depositd submit tx-9 --profile NAME --by YOUR_NAME" in none
    rejected = " ".join(_alert_next_step("rejected#2", "acme").split())
    assert "Correct profile acme" in rejected and "depositd submit tx-9 --profile acme" in rejected


@pytest.mark.usefixtures("engine")  # its stacks on SQLite and on PostgreSQL
async def test_a_submission_refused_by_the_provider_is_not_sent_again_by_a_second_run(
    tmp_path: Path, start_stack: MakeStack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The provider refuses the profile (a provider name it does not offer, 10000103): the
    command's wait ends with the refusal (exit 1); running it again submits nothing (exit 1,
    naming the failed submission) until the profile is corrected."""
    stack, tx = await _held(tmp_path, start_stack)
    text = stack.profiles_path.read_text(encoding="utf-8")
    stack.profiles_path.write_text(text.replace("provider: Binance", "provider: Binanse"))
    assert await stack.runtime.reload()
    config = str(stack.config_path)
    code, _, err = await _cli(
        capsys, "submit", tx, "--profile", "demo-entity", "--by", "ana", "--config", config,
        "--wait", "0",
    )  # fmt: skip
    assert code == 0, err
    await stack.settle()
    (first,) = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
    assert first["status"] == "failed" and "10000103" in first["outcome"]
    code, _, err = await _cli(
        capsys, "submit", tx, "--profile", "demo-entity", "--by", "ana", "--config", config
    )
    assert code == 1
    assert f"refused: submission #{first['id']} (failed:" in err and "had this very payload" in err
    await stack.settle()
    assert len([a for a in await stack.actions(tx) if a["action"] == "submit_profile"]) == 1


@pytest.mark.usefixtures("engine")  # its stacks on SQLite and on PostgreSQL
async def test_a_profile_edited_but_not_reloaded_is_not_sent_in_its_old_form(
    tmp_path: Path, start_stack: MakeStack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator corrects a profile in the file and submits it without reloading: the
    command checked the file's version, the service holds the old one. The old details are
    never sent in place of the ones approved: the submission is skipped saying to reload, and
    after the reload a second run submits the corrected profile."""
    from worker.dev.demo import corrected_profiles

    stack, tx = await _held(tmp_path, start_stack)
    text = stack.profiles_path.read_text(encoding="utf-8")
    stack.profiles_path.write_text(corrected_profiles(text), encoding="utf-8")
    config = str(stack.config_path)
    code, _, err = await _cli(
        capsys, "submit", tx, "--profile", "demo-entity", "--by", "ana", "--config", config,
        "--wait", "0",
    )  # fmt: skip
    assert code == 0, err
    await stack.settle()
    assert stack.sandbox.state.orders[tx].white_list_status.value == "init"
    (first,) = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]
    assert first["status"] == "skipped"
    assert "reload the service" in first["outcome"]
    assert await stack.runtime.reload()
    code, _, err = await _cli(
        capsys, "submit", tx, "--profile", "demo-entity", "--by", "ana", "--config", config,
        "--wait", "0",
    )  # fmt: skip
    assert code == 0, err
    await stack.settle()
    assert stack.sandbox.state.orders[tx].white_list_status.value == "pending"
    second = [a for a in await stack.actions(tx) if a["action"] == "submit_profile"][-1]
    assert second["status"] == "done"
    corrected = Profiles.load(stack.profiles_path).content_hash("demo-entity")
    assert second["params"]["content_hash"] == corrected
    assert second["idempotency_key"] == submit_key(tx, corrected)  # the content sent
