"""Order webhooks (STABLE_ORDER_UPDATED, Collect Order Updated): stored with the detail read,
trigger order_updated for the "*" rule set, forwarded signed to a real HTTP endpoint, listed by
`depositd orders` (sandbox, worker and the endpoint on loopback through worker.dev.harness)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.stacks import MakeStack
from worker.act.kinds import SPECS
from worker.dev.harness import Stack
from worker.dev.sandbox.orders import (
    create_collect_order,
    create_stable_order,
    move_collect_order,
    move_stable_order,
)
from worker.errors import ConfigError
from worker.provider import signing
from worker.rules import RuleBook

ROOT = Path(__file__).resolve().parents[2]
SECRET = "order-forward-secret-1"
AiohttpServer = Callable[[web.Application], Awaitable[TestServer]]


async def endpoint(aiohttp_server: AiohttpServer) -> tuple[str, list[tuple[bytes, Any]]]:
    """A merchant endpoint recording every verified POST: its URL and the (body, headers)."""
    got: list[tuple[bytes, Any]] = []

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        signing.verify_signature(
            request.headers,
            "POST",
            request.path_qs,
            body,
            secrets=[SECRET],
            scheme=signing.METHOD_PATH_V1,  # forward's own scheme
        )
        got.append((body, request.headers))
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/merchant/orders", receive)
    server = await aiohttp_server(app)
    return str(server.make_url("/merchant/orders")), got


def rules_with(tmp_path: Path, extra: str) -> Path:
    """The shipped default rule set plus `extra` rules (YAML list items)."""
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    text = (ROOT / "rules" / "default.yaml").read_text(encoding="utf-8")
    (folder / "default.yaml").write_text(text.rstrip("\n") + "\n" + extra, encoding="utf-8")
    return folder


async def order_rows(stack: Stack) -> list[dict[str, Any]]:
    """The order_updated action rows, in id order."""
    return [a for a in await stack.actions() if a["action"] == "order_updated"]


async def test_stable_order_success_is_forwarded_once_with_its_detail(
    start_stack: MakeStack,
    tmp_path: Path,
    aiohttp_server: AiohttpServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stable order reaching success is forwarded once, signed, with the detail read from the
    provider (fields the webhook lacks); its processing update matches no rule; a redelivery
    forwards nothing more; `depositd orders --json` lists it."""
    url, got = await endpoint(aiohttp_server)
    monkeypatch.setenv("ORDER_FORWARD_SECRET", SECRET)
    rules = rules_with(
        tmp_path,
        "  - name: tell the books about finished stable buys\n"
        '    "on": [order_updated]\n'
        "    if: {kind: stable, orderStatus: success, businessType: STABLE_BUY}\n"
        f"    then: [{{forward: {{url: '{url}', secret_env: ORDER_FORWARD_SECRET}}}}]\n",
    )
    stack = await start_stack(rules=rules, scheduler=False)
    order = create_stable_order(
        stack.sandbox,
        {"merchantOrderId": "M-77", "sourceAmount": "1000.10", "price": "0.999"},
    )
    await stack.settle()
    assert got == []  # processing: no rule matches
    move_stable_order(stack.sandbox, order["orderId"], "success")
    await stack.settle()

    [(body, _)] = got
    sent = json.loads(body)
    assert sent["orderId"] == order["orderId"] and sent["merchantOrderId"] == "M-77"
    assert sent["orderStatus"] == "success" and sent["kind"] == "stable"
    assert sent["paymentMethod"] == "VIRTUAL_ACCOUNT"  # only the detail read says this
    assert sent["sourceAmount"] == "1000.10" and sent["targetAmount"] == "999.09990"
    assert sent["amount"] == "999.09990" and sent["currency"] == "USDT"

    [delivery] = [
        d
        for d in stack.sandbox.deliverer.history
        if d.envelope["eventType"] == "STABLE_ORDER_UPDATED"
        and d.envelope["data"]["orderStatus"] == "success"
    ]
    stack.sandbox.deliverer.enqueue(dict(delivery.envelope))
    await stack.settle()
    assert len(got) == 1
    assert [r["status"] for r in await order_rows(stack)] == ["done", "done"]

    listed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "worker", "orders", "--json", "--config", str(stack.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    [line] = [json.loads(x) for x in listed.stdout.splitlines() if x.strip()]
    assert (line["kind"], line["orderId"], line["orderStatus"]) == (
        "stable",
        order["orderId"],
        "success",
    )
    assert line["read"] == "read" and line["sourceAmount"] == "1000.10"


async def test_collection_order_alerts_through_the_star_rule_set(
    start_stack: MakeStack, tmp_path: Path
) -> None:
    """A collection order's update reads the order status and alerts once per event through the
    "*" rule set's order_updated rule, with the order named and no deposit behind it."""
    rules = rules_with(
        tmp_path,
        "  - name: failed collections\n"
        '    "on": [order_updated]\n'
        "    if: {kind: collect, orderStatus: FAIL}\n"
        "    then: [{alert: {severity: warning, message: collection order failed}}]\n",
    )
    stack = await start_stack(rules=rules, scheduler=False)
    order = create_collect_order(
        stack.sandbox, {"merchantOrderId": "C-9", "amount": "50.5", "currency": "USDT"}
    )
    await stack.settle()
    move_collect_order(stack.sandbox, order["orderId"], {"status": "FAIL"})
    await stack.settle()

    texts = [json.dumps(p) for p in stack.slack if "order_updated" in json.dumps(p)]
    assert len(texts) == 1
    assert order["orderId"] in texts[0] and "collection order failed" in texts[0]
    assert "amount 50.5 USDT" in texts[0]
    assert len([m for m in stack.emails if m["X-Depositd-Condition"] == "order_updated"]) == 1

    # `rules test` on that event shows the order rule matching, and touches nothing.
    [failed] = [
        d.envelope
        for d in stack.sandbox.deliverer.history
        if d.envelope["eventType"] == "Collect Order Updated" and d.envelope["status"] == "FAIL"
    ]
    event = tmp_path / "collect.json"
    event.write_text(json.dumps(failed))
    dry = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "worker", "rules", "test", str(event)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "DEPOSITD_CONFIG": str(stack.config_path)},
    )
    assert dry.returncode == 0, dry.stderr
    assert "[match] failed collections" in dry.stdout
    assert "would run: alert (rule 'failed collections')" in dry.stdout


def test_order_rules_are_checked_with_file_and_line(tmp_path: Path) -> None:
    """order_updated only in the "*" set, only on order fields, never book: check names the
    file and line of each mistake."""
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "w.yaml").write_text(
        "wallet: 1001\n"
        "rules:\n"
        "  - name: orders in a wallet set\n"
        '    "on": [order_updated]\n'
        "    then: [{alert: {severity: info}}]\n"
    )
    (folder / "star.yaml").write_text(
        'wallet: "*"\n'
        "rules:\n"
        "  - name: typo\n"
        '    "on": [order_updated]\n'
        "    if: {orderStatuss: success}\n"
        "    then: [book]\n"
    )
    with pytest.raises(ConfigError) as info:
        RuleBook.load(folder, specs=SPECS)
    text = str(info.value)
    assert f"{folder / 'w.yaml'}:4:" in text and "only the rule set for every wallet" in text
    assert f"{folder / 'star.yaml'}:5:" in text and "unknown condition 'orderStatuss'" in text
    assert "did you mean 'orderStatus'" in text
    assert "book cannot act on an order" in text
