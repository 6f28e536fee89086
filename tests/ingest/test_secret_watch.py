"""A webhook secret or API key that differs from the provider's: deliveries refused in a row
alert once (critical), `status` shows it until a delivery is accepted again.

The sandbox delivers (and retries) every webhook signed with its own copy of the secret and
key; changing that copy while the worker keeps its configuration is the mismatch a user makes.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.configs import HOOK_KEY, HOOK_PATH, HOOK_SECRET
from tests.support.processes import Processes, cli
from tests.support.service import Service
from tests.support.stores import rows
from tests.support.webhooks import deposit_event
from worker.commands.ops import status_report
from worker.dev.harness import Stack
from worker.ingest.secret_watch import CONDITION, REFUSALS_IN_A_ROW
from worker.provider.jsonio import dumpb
from worker.provider.signing import signed_headers
from worker.service.keys import INGRESS_KEY

PAYER = "TDemoKnownPayer1111111111111111111"  # demo-entity in rules/profiles.yaml


def status(stack: Stack) -> dict[str, Any]:
    with closing(sqlite3.connect(stack.db_path)) as conn:
        conn.row_factory = sqlite3.Row
        return status_report(conn)


async def auth_alerts(stack: Stack) -> list[dict[str, Any]]:
    rows = await stack.actions()
    return [r for r in rows if r["action"] == "alert" and r["params"]["condition"] == CONDITION]


@pytest.mark.parametrize(
    ("setting", "reason"),
    [("webhook_secret", "bad_signature"), ("webhook_api_key", "unknown_api_key")],
)
async def test_refused_deliveries_in_a_row_alert_once(
    tmp_path: Path, setting: str, reason: str
) -> None:
    """The sandbox signing with another secret (or naming another key): after a few refusals
    one critical alert names webhook.secret and webhook.api_key, however many refusals follow;
    `status` shows the streak; an accepted delivery ends it, with no second alert."""
    async with Stack(tmp_path) as stack:
        ingress = stack.app[INGRESS_KEY]
        right = getattr(stack.sandbox.cfg, setting)
        setattr(stack.sandbox.cfg, setting, "not-the-one-the-worker-has")
        tx = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "10.00", PAYER)["transactionId"]
        await stack.wait_for(lambda: len(stack.slack) > 0, what="an alert on Slack")
        await stack.wait_for(
            lambda: ingress.refusals.get(reason, 0) >= 2 * REFUSALS_IN_A_ROW,
            what="the sandbox's retries refused twice over",
        )
        await stack.wait_for(
            lambda: (
                (status(stack)["webhookAuthRefused"] or {}).get("refused", 0)
                >= 2 * REFUSALS_IN_A_ROW
            ),
            what="status to count the refusals",
        )
        alerts = await auth_alerts(stack)
        assert len(alerts) == 1 and alerts[0]["params"]["severity"] == "critical"
        (sent,) = [p for p in stack.slack if CONDITION in json.dumps(p)]
        text = json.dumps(sent)
        assert "webhook.secret" in text and "webhook.api_key" in text
        assert stack.webhook_secret not in text and right not in text
        assert await stack.events(tx) == []  # nothing stored from a refused delivery

        setattr(stack.sandbox.cfg, setting, right)  # the settings agree again
        await stack.wait_for(
            lambda: status(stack)["webhookAuthRefused"] is None, what="the streak to end"
        )
        assert len(await stack.events(tx)) >= 1
        assert len(await auth_alerts(stack)) == 1


async def test_other_refusals_do_not_alert(tmp_path: Path) -> None:
    """Refusals that do not say the secret is wrong (here a path nothing is served on) alert
    nothing and show no streak."""
    async with Stack(tmp_path) as stack:
        async with aiohttp.ClientSession() as http:
            for _ in range(3 * REFUSALS_IN_A_ROW):
                async with http.post(stack.worker_url + "/webhooks/other", data=b"{}") as resp:
                    assert resp.status == 404
        assert stack.app[INGRESS_KEY].refusals
        await stack.settle()
        assert await auth_alerts(stack) == []
        assert status(stack)["webhookAuthRefused"] is None


async def test_serve_with_its_ingress_process_records_the_streak(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """`serve` (the webhook listener in a process of its own): deliveries signed with another
    secret, one after another, leave one critical alert and the streak in `status`; a delivery
    signed right ends it."""
    service = processes.own(Service(tmp_path, provider_url))

    async def post(secret: str) -> int:
        body = dumpb(deposit_event(tx="T-secret-watch"))
        headers = signed_headers(HOOK_KEY, secret, "POST", HOOK_PATH, body)
        async with (
            aiohttp.ClientSession() as http,
            http.post(service.url + HOOK_PATH, data=body, headers=headers) as answer,
        ):
            return answer.status

    def streak() -> Any:
        with closing(sqlite3.connect(service.db)) as conn:
            conn.row_factory = sqlite3.Row
            return status_report(conn)["webhookAuthRefused"]

    async def until(check: Any, what: str) -> None:
        for _ in range(400):  # bounded: each write follows its delivery within milliseconds
            if check():
                return
            await asyncio.sleep(0.025)
        pytest.fail(f"timed out waiting for {what}")

    try:
        await service.start()
        for _ in range(REFUSALS_IN_A_ROW + 2):
            assert await post("the-provider-has-another-one") == 401
        await until(lambda: streak() is not None, "the streak")
        assert streak()["refused"] >= REFUSALS_IN_A_ROW
        alerts = rows(
            service.db,
            "SELECT json_extract(params, '$.severity') FROM actions WHERE action = 'alert'"
            " AND json_extract(params, '$.condition') = ?",
            CONDITION,
        )
        assert alerts == [("critical",)]
        code, out, err = await cli(service.config, "status")
        assert code == 0 and json.loads(out)["webhookAuthRefused"] is not None, err
        assert await post(HOOK_SECRET) == 200
        await until(lambda: streak() is None, "the streak to end")
        assert await service.stop() == 0
    finally:
        await service.kill()
