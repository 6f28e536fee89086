"""The service on PostgreSQL when the database goes away and comes back."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.support.pgcluster import ENV_URL, Cluster
from tests.support.stacks import MakeStack
from worker.dev.harness import Stack
from worker.provider.signing import signed_headers


async def _post(http: aiohttp.ClientSession, stack: Stack, event_id: str) -> int:
    """Deliver one signed webhook; its HTTP status."""
    body = json.dumps(
        {"eventId": event_id, "eventType": "SOMETHING_NEW", "timestamp": int(time.time() * 1000)}
    ).encode()
    path = urlsplit(stack.webhook_url).path
    headers = signed_headers(stack.webhook_api_key, stack.webhook_secret, "POST", path, body)
    headers["Content-Type"] = "application/json"
    async with http.post(stack.webhook_url, data=body, headers=headers) as resp:
        return resp.status


async def _ready(http: aiohttp.ClientSession, stack: Stack) -> int:
    async with http.get(stack.worker_url + "/readyz") as resp:
        return resp.status


@pytest.mark.parametrize("engine", ["postgres"])
async def test_an_unreachable_database_answers_503_then_the_instance_recovers(
    start_stack: MakeStack, pg_cluster: Cluster
) -> None:
    """While PostgreSQL is down, deliveries get 503 (never 200) and /readyz fails; once it is
    back the same process stores deliveries and is ready again, untouched."""
    if os.environ.get(ENV_URL):
        pytest.skip(f"{ENV_URL} names a server this test cannot stop")
    stack = await start_stack(scheduler=False)
    async with aiohttp.ClientSession() as http:
        assert await _post(http, stack, "before") == 200
        await asyncio.to_thread(pg_cluster.stop)
        try:
            statuses = [await _post(http, stack, f"down-{i}") for i in range(3)]
            assert statuses == [503, 503, 503]
            assert await _ready(http, stack) == 503
        finally:
            await asyncio.to_thread(pg_cluster.start)
        deadline = time.monotonic() + 20
        while True:
            status = await _post(http, stack, f"after-{uuid.uuid4().hex[:6]}")
            if status == 200 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert status == 200
        assert await _ready(http, stack) == 200
    ids = [e["event_id"] for e in await stack.events()]
    assert ids[0] == "before" and ids[-1].startswith("after-")
    assert not any(i.startswith("down-") for i in ids)
