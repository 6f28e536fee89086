"""End to end: every provider failure of a submission ends as docs/concepts.md says.

The failures come from the sandbox itself: its fault controls (5xx, latency, a wallet code),
its own validation, a changed API secret, and its submit answering with what its fault controls
cannot say (an HTML page, a redirect, a system error, "processing"), sent over real HTTP. The
worker, the sandbox, an aiosmtpd server and a Slack stand-in are real and on loopback
(`worker.dev.harness.Stack`).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.support.stacks import MakeStack
from tests.support.stores import stack_rows
from worker.dev.harness import Stack
from worker.errors import StorageError, WalletCodeError
from worker.service import runtime as runtime_mod
from worker.track.tracker import Fact

PAYER_ADDRESS = "TE2eErrorsPayer00000000000000001"
ENTITY = {
    "correspondentType": "ENTITY",
    "fullName": "Yarrowby Lantern Holdings Ltd",
    "countryCode": "SG",
    "companyAddress": "3 Lantern Quay, Singapore",
    "walletType": "VASP",
    "provider": "Binance",
    "walletLabel": "Lantern ops wallet",
}
PAYER_DATA = ("Yarrowby Lantern", "3 Lantern Quay", "Lantern ops wallet")

Recorded = list[dict[str, Any]]


def profiles_yaml(entity: Mapping[str, Any] = ENTITY) -> str:
    """A profiles file with one entity profile for PAYER_ADDRESS."""
    return json.dumps(
        {"profiles": {"e2e-errors": dict(entity)}, "addresses": {PAYER_ADDRESS: "e2e-errors"}}
    )


@pytest.fixture
def make_stack(tmp_path: Path, start_stack: MakeStack) -> MakeStack:
    """Start a Stack (no polls unless asked) with the test profile; stopped at teardown."""

    async def make(profiles: str | None = None, **kw: Any) -> Stack:
        path = tmp_path / "profiles-source.yaml"
        path.write_text(profiles if profiles is not None else profiles_yaml())
        kw.setdefault("scheduler", False)
        return await start_stack(profiles=path, **kw)

    return make


def submits(recorded: Recorded, tx: str) -> Recorded:
    """Submit requests for one deposit, in arrival order."""
    return [r for r in recorded if r["method"] == "POST" and r["path"].endswith(f"/{tx}/submit")]


def detail_reads_after_submit(recorded: Recorded, tx: str) -> Recorded:
    """Detail (or history) reads of the provider made after the first submit of `tx`."""
    first = next(i for i, r in enumerate(recorded) if r["path"].endswith(f"/{tx}/submit"))
    return [
        r
        for r in recorded[first + 1 :]
        if r["method"] == "GET"
        and (r["path"].startswith(f"/v1/wallet/transactions/{tx}") or "history" in r["path"])
    ]


async def submit_rows(stack: Stack, tx: str) -> list[dict[str, Any]]:
    """The deposit's submit_profile action rows."""
    return [a for a in await stack.actions(tx) if a["action"] == "submit_profile"]


async def first_submit_ends(stack: Stack, tx: str) -> dict[str, Any]:
    """Wait until the first submission row is no longer pending or running; that row."""

    async def ended() -> bool:
        rows = await submit_rows(stack, tx)
        return bool(rows) and rows[0]["status"] not in ("pending", "running")

    await stack.wait_for(ended, what="the submission to end")
    await stack.settle()
    return (await submit_rows(stack, tx))[0]


async def deposit_with_fault(
    make_stack: MakeStack, code: str, *, detail_code: str | None = None
) -> tuple[Stack, str, dict[str, Any]]:
    """A deposit whose submission meets wallet code `code` once; the ended submission row."""
    stack = await make_stack()
    stack.sandbox.set_fault("submit", "code", count=1, code=code)
    if detail_code is not None:
        stack.sandbox.set_fault("detail", "code", count=1, code=detail_code)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "321.09", PAYER_ADDRESS)[
        "transactionId"
    ]
    return stack, tx, await first_submit_ends(stack, tx)


def alert_conditions(stack: Stack) -> list[tuple[str, str]]:
    """(channel, condition) of every alert received."""
    out = []
    for payload in stack.slack:
        context = payload["blocks"][-1]["elements"][0]["text"]
        out.append(("slack", context.split("condition `")[1].rstrip("`")))
    out += [("email", str(m["X-Depositd-Condition"])) for m in stack.emails]
    return sorted(out)


def assert_no_payer_data(stack: Stack) -> None:
    """No alert carries a payer profile value."""
    texts = [json.dumps(p) for p in stack.slack] + [m.as_string() for m in stack.emails]
    for text in texts:
        for value in PAYER_DATA:
            assert value not in text


def answer_submits(stack: Stack, *answers: Callable[[], Exception]) -> None:
    """The sandbox's next submissions answer with these (an HTTP answer aiohttp sends as it is,
    or a wallet failure envelope); later ones reach the sandbox's own submit."""
    original = stack.sandbox.submit
    queue = list(answers)

    def submit(tx_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if queue:
            raise queue.pop(0)()
        return original(tx_id, body)

    stack.sandbox.submit = submit  # type: ignore[method-assign]


def json_answer(kind: type[web.HTTPException], body: Mapping[str, Any]) -> Callable[[], Exception]:
    """An HTTP error answer (`kind`: its status) with a JSON body."""
    return lambda: kind(text=json.dumps(body), content_type="application/json")


def texts(stack: Stack) -> list[str]:
    """Every alert received (Slack payloads and e-mails) as text."""
    return [json.dumps(p) for p in stack.slack] + [m.as_string() for m in stack.emails]


async def test_10000100_deposit_still_there_is_reread_and_not_resubmitted(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000100 for a deposit still waiting for details: re-read, no new submission, and a
    warning, since nothing depositd may do moves the deposit on."""
    stack, tx, row = await deposit_with_fault(make_stack, "10000100")
    assert row["status"] == "failed" and "still exists" in row["outcome"]
    assert detail_reads_after_submit(recorded, tx)
    assert len(submits(recorded, tx)) == 1
    assert alert_conditions(stack) == [
        ("email", "submit_failed:10000100"),
        ("slack", "submit_failed:10000100"),
    ]
    assert "WARNING" in stack.slack[0]["text"]
    assert "still waits for payer details" in json.dumps(stack.slack[0])


async def test_10000100_deposit_moved_on_is_not_alerted(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000100 although the submission was taken (the detail shows it pending): no alert."""
    stack = await make_stack()
    original = stack.sandbox.submit

    def taken_but_not_found(tx_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        original(tx_id, body)
        raise WalletCodeError("10000100", "transaction not found")

    stack.sandbox.submit = taken_but_not_found  # type: ignore[method-assign]
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "3.5", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "failed" and "still exists" in row["outcome"]
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]
    assert len(submits(recorded, tx)) == 1
    assert stack.slack == [] and stack.emails == []


async def test_10000100_deposit_gone_alerts(make_stack: MakeStack, recorded: Recorded) -> None:
    """10000100 and the re-read cannot find the deposit either: a critical alert, no retry."""
    stack = await make_stack()
    original = stack.sandbox.submit

    def forgotten(tx_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        # Gone for good: no history queue lists it and its detail answers 10000100 too.
        stack.sandbox.state.orders.pop(tx_id)
        return original(tx_id, body)

    stack.sandbox.submit = forgotten  # type: ignore[method-assign]
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "321.09", PAYER_ADDRESS)[
        "transactionId"
    ]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "failed" and "gone" in row["outcome"]
    assert alert_conditions(stack) == [
        ("email", "submit_failed:10000100"),
        ("slack", "submit_failed:10000100"),
    ]
    assert "CRITICAL" in stack.slack[0]["text"]
    assert len(submits(recorded, tx)) == 1


async def test_10000101_nothing_left_and_detail_refreshed(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000101 (the order failed meanwhile): done, and the refreshed detail shows the FAIL."""
    stack = await make_stack()
    # The submission is held while the order fails, and the FAIL webhook is lost: only the
    # detail read that 10000101 calls for can tell the worker.
    stack.sandbox.set_fault("submit", "latency", count=1, latency_s=0.3)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "12.5", PAYER_ADDRESS)["transactionId"]
    await stack.wait_for(lambda: bool(submits(recorded, tx)), what="the submit request")
    stack.sandbox.drop_webhooks(1)
    stack.sandbox.fail_order(tx)
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done" and "already completed" in row["outcome"]
    assert detail_reads_after_submit(recorded, tx)
    assert (await stack.deposit(tx)).state.value == "failed"  # type: ignore[union-attr]
    assert len(submits(recorded, tx)) == 1
    # The failed order is the rules' business (critical alert); the code itself alerts nobody.
    assert alert_conditions(stack) == [("email", "failed"), ("slack", "failed")]


@pytest.mark.parametrize("code", ["10000102", "10000103"])
async def test_profile_refused_alerts_and_waits_for_a_changed_profile(
    make_stack: MakeStack, recorded: Recorded, code: str
) -> None:
    """10000102/10000103: alert, no retry; a changed profile is submitted once with a new key."""
    stack, tx, row = await deposit_with_fault(make_stack, code)
    assert row["status"] == "failed" and "no retry until the profile changes" in row["outcome"]
    assert alert_conditions(stack) == [
        ("email", f"submit_failed:{code}"),
        ("slack", f"submit_failed:{code}"),
    ]
    assert code in stack.slack[0]["text"] and "WARNING" in stack.slack[0]["text"]
    assert await stack.rewrite_profiles(profiles_yaml())  # same contents: no correction
    await stack.settle()
    assert len(submits(recorded, tx)) == 1

    fixed = {**ENTITY, "walletLabel": "Lantern ops wallet 2"}
    assert await stack.rewrite_profiles(profiles_yaml(fixed))
    await stack.settle()
    calls = submits(recorded, tx)
    assert len(calls) == 2
    assert calls[0]["headers"]["Idempotency-Key"] != calls[1]["headers"]["Idempotency-Key"]
    assert json.loads(calls[1]["body"]) == fixed
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]
    assert len(stack.slack) == 1 and len(stack.emails) == 1
    assert_no_payer_data(stack)


async def test_10000103_from_sandbox_validation_names_the_field_not_the_value(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """The sandbox refuses an unknown provider (10000103): the alert names `provider` only."""
    stack = await make_stack(profiles=profiles_yaml({**ENTITY, "provider": "Nowhere VASP Ltd"}))
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "99", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "failed"
    [slack] = stack.slack_for(tx, "submit_failed:10000103")
    [mail] = stack.emails_for(tx, "submit_failed:10000103")
    for text in (json.dumps(slack), mail.as_string()):
        assert "provider" in text and "10000103" in text
        assert "Nowhere VASP" not in text
    assert "Nowhere VASP" not in row["outcome"]
    assert len(submits(recorded, tx)) == 1


async def test_10000104_retried_later_with_same_payload_and_key(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000104 twice: retried after back-off with the same body and key, then accepted."""
    stack = await make_stack()
    stack.sandbox.set_fault("submit", "code", count=2, code="10000104")
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "5", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done" and row["attempts"] == 3
    calls = submits(recorded, tx)
    assert len(calls) == 3
    assert {c["headers"]["Idempotency-Key"] for c in calls} == {row["idempotency_key"]}
    assert len({c["body"] for c in calls}) == 1
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]
    assert stack.slack == [] and stack.emails == []


async def test_10000105_reads_original_result_without_new_submission(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000105: the original result is read (detail), nothing is submitted again."""
    stack, tx, row = await deposit_with_fault(make_stack, "10000105")
    assert row["status"] == "done" and "original result" in row["outcome"]
    assert detail_reads_after_submit(recorded, tx)
    assert len(submits(recorded, tx)) == 1
    assert len(await submit_rows(stack, tx)) == 1
    assert stack.slack == [] and stack.emails == []


async def test_10000105_with_detail_unavailable_stays_done(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000105 while the detail read fails: the submission is done, not failed; no resubmit."""
    stack = await make_stack()
    stack.sandbox.set_fault("submit", "code", count=1, code="10000105")
    stack.sandbox.set_fault("detail", "5xx", count=2)  # every attempt of the client's one read
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "8.25", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done" and "detail not read now" in row["outcome"]
    assert len(submits(recorded, tx)) == 1
    assert len(await submit_rows(stack, tx)) == 1


async def test_10000100_with_detail_unavailable_is_retried_later(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000100 while the detail read fails: retried later with the same key, not given up."""
    stack = await make_stack()
    stack.sandbox.set_fault("submit", "code", count=1, code="10000100")
    stack.sandbox.set_fault("detail", "5xx", count=2)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "8.5", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done" and row["attempts"] == 2
    calls = submits(recorded, tx)
    assert len(calls) == 2
    assert {c["headers"]["Idempotency-Key"] for c in calls} == {row["idempotency_key"]}
    assert stack.slack == [] and stack.emails == []


@pytest.mark.parametrize(("code", "severity"), [("10000106", "CRITICAL"), ("10000107", None)])
async def test_10000106_and_10000107_alert_without_retry(
    make_stack: MakeStack, recorded: Recorded, code: str, severity: str | None
) -> None:
    """10000106 (our bug) alerts critical, 10000107 (wallet) alerts; neither is retried."""
    stack, tx, row = await deposit_with_fault(make_stack, code)
    assert row["status"] == "failed"
    assert alert_conditions(stack) == [
        ("email", f"submit_failed:{code}"),
        ("slack", f"submit_failed:{code}"),
    ]
    if severity:
        assert severity in stack.slack[0]["text"]
    assert code in stack.slack[0]["text"]
    assert len(submits(recorded, tx)) == 1
    assert_no_payer_data(stack)


async def test_5xx_retried_by_client_and_outbox_with_same_key(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """Three 503s: retried (client, then outbox back-off) with one key until accepted."""
    stack = await make_stack()
    stack.sandbox.set_fault("submit", "5xx", count=3)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "7", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done" and row["attempts"] == 2
    calls = submits(recorded, tx)
    assert len(calls) == 4
    assert {c["headers"]["Idempotency-Key"] for c in calls} == {row["idempotency_key"]}
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]
    assert stack.slack == [] and stack.emails == []


async def test_timeout_retried_with_same_key_and_applied_once(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """A submission that times out is retried with the same key; the provider acts once."""
    stack = await make_stack()
    stack.settings.provider.timeout_s = 0.3
    await stack.restart_worker()  # a client with the short timeout
    applied: list[str] = []
    original = stack.sandbox.submit

    def counting(tx_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        answer = original(tx_id, body)
        applied.append(tx_id)
        return answer

    stack.sandbox.submit = counting  # type: ignore[method-assign]
    stack.sandbox.set_fault("submit", "latency", count=1, latency_s=0.6)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "8", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done"
    await stack.wait_for(lambda: time.monotonic() > submits(recorded, tx)[0]["at"] + 0.7)
    calls = submits(recorded, tx)
    assert len(calls) == 2
    assert {c["headers"]["Idempotency-Key"] for c in calls} == {row["idempotency_key"]}
    assert applied == [tx]
    assert stack.sandbox.state.order(tx).white_list_status.value == "pending"


async def test_stop_does_not_wait_out_a_hung_provider(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """A stop while a submission and the polls hang at the provider (4 tries x 5 s each) ends
    within one grace (well inside systemd's 30 s); the row stays running and, after the
    restart, is submitted with the same key and applied once."""
    stack = await make_stack()
    stack.sandbox.set_fault("*", "timeout", count=None)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "8", PAYER_ADDRESS)["transactionId"]
    await stack.wait_for(lambda: len(submits(recorded, tx)) == 1, what="the hung submission")
    since = submits(recorded, tx)[0]["at"]
    await stack.wait_for(
        lambda: any(r["method"] == "GET" and r["at"] > since for r in recorded),
        what="a poll hanging too",
    )
    started = time.monotonic()
    await stack.stop_worker()
    assert time.monotonic() - started < runtime_mod.STOP_GRACE_S + 3
    status = stack_rows(stack, "SELECT status FROM actions WHERE action='submit_profile'")
    assert status == [("running",)]
    stack.sandbox.clear_faults()
    await stack.start_worker()
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done"
    assert {c["headers"]["Idempotency-Key"] for c in submits(recorded, tx)} == {
        row["idempotency_key"]
    }
    assert stack.sandbox.state.order(tx).white_list_status.value == "pending"


async def test_auth_failure_alerts_and_retries_after_backoff(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """401 from the provider: one auth alert, retries spaced by back-off, same key, then OK."""
    stack = await make_stack()
    secret = stack.sandbox.cfg.api_secret
    stack.sandbox.cfg.api_secret = "rotated-at-the-provider"
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "9", PAYER_ADDRESS)["transactionId"]
    await stack.wait_for(lambda: len(submits(recorded, tx)) >= 3, what="three refused tries")
    await stack.wait_for(lambda: len(stack.slack) >= 1 and len(stack.emails) >= 1)
    stack.sandbox.cfg.api_secret = secret
    await stack.wait_for(
        lambda: stack.sandbox.state.order(tx).white_list_status.value == "pending",
        what="the submission to pass",
    )
    await stack.settle()

    calls = submits(recorded, tx)
    [row] = await submit_rows(stack, tx)
    assert row["status"] == "done" and row["attempts"] == len(calls)
    assert {c["headers"]["Idempotency-Key"] for c in calls} == {row["idempotency_key"]}
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(calls)]
    assert all(gap >= 0.02 for gap in gaps)  # back-off, not a hot loop
    assert gaps[1] > gaps[0] * 0.5  # and it does not shrink
    assert alert_conditions(stack) == [("email", "auth_failure"), ("slack", "auth_failure")]
    assert "CRITICAL" in stack.slack[0]["text"]


@pytest.mark.parametrize(
    "answer",
    [
        lambda: web.HTTPNotFound(text="<html><body>404 Not Found</body></html>"),
        lambda: web.HTTPForbidden(text="<html><body>blocked by WAF</body></html>"),
        lambda: web.HTTPFound(location="/login"),
    ],
    ids=["html-404", "html-403", "redirect"],
)
async def test_unreadable_answer_is_retried_with_same_key_and_alerted_once(
    make_stack: MakeStack, recorded: Recorded, answer: Callable[[], Exception]
) -> None:
    """An answer that is no envelope leaves the outcome unknown: retried with back-off and the
    same key (interface: "Timeout / unknown"), one warning once it lasts, then accepted."""
    stack = await make_stack()
    answer_submits(stack, answer, answer, answer, answer)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "6", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done" and row["attempts"] == 5
    calls = submits(recorded, tx)
    assert len(calls) == 5
    assert {c["headers"]["Idempotency-Key"] for c in calls} == {row["idempotency_key"]}
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(calls)]
    assert all(gap >= 0.02 for gap in gaps)  # back-off, not a hot loop
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]
    assert alert_conditions(stack) == [
        ("email", "submit_failed:unreadable"),
        ("slack", "submit_failed:unreadable"),
    ]
    assert "WARNING" in stack.slack[0]["text"]
    assert_no_payer_data(stack)


SYSTEM_ERROR = {
    "status": 500,
    "code": "SYSTEM_ERROR",
    "msg": "internal server error",
    "success": False,
    "traceId": "t-system",
    "data": None,
}


@pytest.mark.parametrize(
    ("answer", "in_flight"),
    [
        (json_answer(web.HTTPInternalServerError, SYSTEM_ERROR), False),
        (lambda: WalletCodeError("SYSTEM_ERROR", "internal server error"), False),
        (lambda: WalletCodeError("IN_PROGRESS", "request is processing, query later"), True),
    ],
    ids=["http-500-system-error", "envelope-500-internal", "envelope-500-processing"],
)
async def test_system_error_and_in_flight_are_retried_with_same_key(
    make_stack: MakeStack, recorded: Recorded, answer: Callable[[], Exception], in_flight: bool
) -> None:
    """ "System error" and "In-flight" answers: retried later with the same key (in flight: the
    detail is read first), one warning once it lasts; never a failed row or a critical alert."""
    stack = await make_stack()
    answer_submits(stack, answer, answer, answer)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "4", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done" and row["attempts"] == 4
    calls = submits(recorded, tx)
    assert len(calls) == 4
    assert {c["headers"]["Idempotency-Key"] for c in calls} == {row["idempotency_key"]}
    assert bool(detail_reads_after_submit(recorded, tx)) is in_flight
    assert (await stack.deposit(tx)).state.value == "submitted"  # type: ignore[union-attr]
    assert len(stack.slack) == 1 and len(stack.emails) == 1
    assert "WARNING" in stack.slack[0]["text"] and "CRITICAL" not in stack.slack[0]["text"]


def fail_recording(stack: Stack, source: str) -> None:
    """Make the running outbox's recording of facts from `source` fail (storage locked)."""
    observe = stack.outbox._observe

    async def locked(fact: Fact) -> Any:
        if fact.source == source:
            raise StorageError("database is locked")
        return await observe(fact)

    stack.outbox._observe = locked


async def test_accepted_submission_stays_done_when_its_fact_is_not_recorded(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """The provider took the submission but recording its fact fails (storage locked): the row
    stays done, so a later profile edit does not submit again while the review runs."""
    stack = await make_stack()
    fail_recording(stack, "submit")
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "2", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done"
    assert stack.sandbox.state.order(tx).white_list_status.value == "pending"

    assert await stack.rewrite_profiles(profiles_yaml({**ENTITY, "walletLabel": "Edited label"}))
    await stack.settle()
    assert len(submits(recorded, tx)) == 1
    assert len(await submit_rows(stack, tx)) == 1


async def test_10000105_stays_done_when_the_read_result_is_not_recorded(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000105 and the original result is read, but recording it fails: still done (the
    submission exists at the provider), no resubmission after a profile edit."""
    stack = await make_stack()
    fail_recording(stack, "poll")
    stack.sandbox.set_fault("submit", "code", count=1, code="10000105")
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "2.2", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "done" and detail_reads_after_submit(recorded, tx)
    assert await stack.rewrite_profiles(profiles_yaml({**ENTITY, "walletLabel": "Edited again"}))
    await stack.settle()
    assert len(submits(recorded, tx)) == 1


async def test_second_refusal_after_correction_alerts_again(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """Refused naming one field, corrected, refused naming another: two alerts, each naming
    its field (one alert per submission, not per deposit)."""
    stack = await make_stack()
    answer_submits(
        stack,
        lambda: WalletCodeError("10000102", "payer details incomplete: walletLabel is mandatory"),
        lambda: WalletCodeError("10000102", "payer details incomplete: companyAddress is empty"),
    )
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "1.5", PAYER_ADDRESS)["transactionId"]
    await first_submit_ends(stack, tx)
    assert await stack.rewrite_profiles(profiles_yaml({**ENTITY, "walletLabel": "Label two"}))
    await stack.settle()

    calls = submits(recorded, tx)
    assert len(calls) == 2
    assert calls[0]["headers"]["Idempotency-Key"] != calls[1]["headers"]["Idempotency-Key"]
    assert [r["status"] for r in await submit_rows(stack, tx)] == ["failed", "failed"]
    first, second = stack.slack_for(tx, "submit_failed:10000102")
    assert "walletLabel" in json.dumps(first) and "companyAddress" not in json.dumps(first)
    assert "companyAddress" in json.dumps(second)
    assert len(stack.emails_for(tx, "submit_failed:10000102")) == 2


async def test_same_submission_refused_again_alerts_once(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """10000107 for one submission, retried by hand (retry-failed keeps the key) and refused
    again: still one alert; a corrected profile refused too alerts once more."""
    stack = await make_stack()
    stack.sandbox.set_fault("submit", "code", count=3, code="10000107")
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "2.5", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "failed" and len(stack.slack) == 1

    await stack.store.write(
        lambda db: db.execute(
            "UPDATE actions SET status='pending', next_attempt_at='0' WHERE id=?", [row["id"]]
        )
    )
    stack.outbox.wake()
    await stack.wait_for(lambda: len(submits(recorded, tx)) == 2, what="the retried submit")
    await stack.settle()
    assert len(stack.slack) == 1 and len(stack.emails) == 1

    assert await stack.rewrite_profiles(profiles_yaml({**ENTITY, "walletLabel": "Label three"}))
    await stack.settle()
    calls = submits(recorded, tx)
    assert len(calls) == 3
    assert len({c["headers"]["Idempotency-Key"] for c in calls}) == 2
    assert (
        alert_conditions(stack)
        == [("email", "submit_failed:10000107")] * 2 + [("slack", "submit_failed:10000107")] * 2
    )


async def test_refused_row_keeps_the_key_it_sent_so_a_restart_does_not_resend(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """The profile changed between queueing and a refused attempt: the row records the key it
    sent, so the next start does not send the same refused payload again."""
    stack = await make_stack()
    stack.sandbox.set_fault("submit", "5xx", count=None)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "3", PAYER_ADDRESS)["transactionId"]
    await stack.wait_for(lambda: len(submits(recorded, tx)) >= 2, what="a failed attempt")
    assert await stack.rewrite_profiles(profiles_yaml({**ENTITY, "walletLabel": "New label"}))
    stack.sandbox.clear_faults()
    stack.sandbox.set_fault("submit", "code", count=1, code="10000103")
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "failed"
    sent = submits(recorded, tx)[-1]["headers"]["Idempotency-Key"]
    assert row["idempotency_key"] == sent
    # The new payload's first attempt may still have met the 5xx fault (then retried with the
    # same key): what counts is that the restart sends it no more.
    before = [c["headers"]["Idempotency-Key"] for c in submits(recorded, tx)].count(sent)

    await stack.restart_worker()  # resubmit_changed runs at every start
    await stack.settle()
    assert [c["headers"]["Idempotency-Key"] for c in submits(recorded, tx)].count(sent) == before
    assert len(await submit_rows(stack, tx)) == 1


PERSON = {
    "correspondentType": "INDIVIDUAL",
    "firstName": "Bo",
    "lastName": "Li",
    "birthday": "1991-03-04",
    "residentialAddress": "8 Short Road, Leeds",
    "countryCode": "GB",
    "walletType": "SELF_HOSTED",
}


async def test_refusal_echoing_short_values_names_fields_only(
    make_stack: MakeStack, recorded: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    """A provider message echoing short unquoted values (lastName=Li): alerts, the row and the
    log name the fields, never the values."""
    stack = await make_stack(profiles=profiles_yaml(PERSON))
    answer_submits(
        stack,
        lambda: WalletCodeError("10000103", "name not accepted: lastName=Li, firstName=Bo"),
    )
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "9.5", PAYER_ADDRESS)["transactionId"]
    row = await first_submit_ends(stack, tx)
    assert row["status"] == "failed"
    alerts = texts(stack)
    assert len(alerts) == 2
    logged = capsys.readouterr()
    for text in [*alerts, row["outcome"], logged.out, logged.err]:
        assert not re.search(r"\b(Li|Bo)\b", text), text
    for text in [*alerts, row["outcome"]]:
        assert "lastName" in text and "firstName" in text


async def test_submission_retried_without_end_keeps_a_bounded_back_off(
    make_stack: MakeStack, recorded: Recorded
) -> None:
    """A row that has been retried a thousand times (days of an unknown outcome) is still
    retried, not failed by an overflowing back-off."""
    stack = await make_stack()
    stack.sandbox.set_fault("submit", "5xx", count=None)
    tx = stack.sandbox.inject_deposit(1001, "USDT", "TRON", "1.1", PAYER_ADDRESS)["transactionId"]
    await stack.wait_for(lambda: len(submits(recorded, tx)) >= 2, what="a failed attempt")
    await stack.store.write(
        lambda db: db.execute(
            "UPDATE actions SET attempts=5000, next_attempt_at='2000-01-01T00:00:00.000Z'"
            " WHERE action='submit_profile'"
        )
    )
    asked = len(submits(recorded, tx))
    stack.outbox.wake()
    await stack.wait_for(lambda: len(submits(recorded, tx)) > asked, what="attempt 5001")

    async def recorded_again() -> bool:
        [row] = await submit_rows(stack, tx)
        return int(row["attempts"]) > 5000 and row["status"] != "running"

    await stack.wait_for(recorded_again, what="attempt 5001's outcome")
    stack.sandbox.clear_faults()
    [row] = await submit_rows(stack, tx)
    assert row["status"] == "pending", row["outcome"]
    # Due again within the longest back-off (300 s), not never.
    due = datetime.fromisoformat(row["next_attempt_at"].replace("Z", "+00:00"))
    assert due <= datetime.now(UTC) + timedelta(seconds=300)
