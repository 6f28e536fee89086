"""Test helpers shipped with the sandbox: a webhook recorder and sample payer details.

`WebhookRecorder` is a real aiohttp receiver that verifies every delivery's signature, records
the envelopes it accepted and can be told to answer failures first (to exercise retries).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web

from worker.provider import jsonio
from worker.provider.signing import DEFAULT, Scheme, SignatureError, verify

ENTITY_PAYER: dict[str, Any] = {
    "correspondentType": "ENTITY",
    "fullName": "Acme Trading Ltd",
    "countryCode": "SG",
    "companyAddress": "1 Raffles Place, Singapore",
    "walletType": "VASP",
    "provider": "Binance",
    "walletLabel": "Acme hot wallet",
    "addressType": "STANDARD",
}

INDIVIDUAL_PAYER: dict[str, Any] = {
    "correspondentType": "INDIVIDUAL",
    "firstName": "Ada",
    "lastName": "Lovelace",
    "birthday": "1990-12-10",
    "residentialAddress": "12 Example Road, London",
    "countryCode": "GB",
    "walletType": "SELF_HOSTED",
}


class WebhookRecorder:
    """A webhook receiver for tests: verifies, records, and fails on request."""

    def __init__(
        self,
        api_key: str,
        secret: str,
        *,
        path: str = "/webhooks/provider",
        scheme: Scheme = DEFAULT,
    ) -> None:
        self.api_key = api_key
        self.secret = secret
        self.path = path
        self.scheme = scheme
        self.url: str | None = None  # set by whoever serves the app
        self.events: list[dict[str, Any]] = []
        self.attempts: list[dict[str, Any]] = []
        self.rejected: list[str] = []
        # HTTP statuses to answer (one per request) before answering 200 again.
        self.fail_with: deque[int] = deque()
        # referenceId -> how many more of its requests to answer with HTTP 500.
        self.fail_reference: dict[str, int] = {}
        # Seconds to stall (then answer 504), one per request, to outlast the sender's timeout.
        self.stall_s: deque[float] = deque()
        self._changed = asyncio.Condition()

    def app(self) -> web.Application:
        """The receiver application (serve it with aiohttp_server)."""
        app = web.Application()
        app.router.add_post(self.path, self._receive)
        return app

    async def _receive(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            verify(
                request.headers,
                request.method,
                request.raw_path,
                raw,
                api_key=self.api_key,
                secrets=[self.secret],
                tolerance_s=300,
                scheme=self.scheme,
            )
        except SignatureError as exc:
            self.rejected.append(str(exc))
            return web.json_response({"error": str(exc)}, status=401)
        env = jsonio.loads(raw)
        self.attempts.append(env)
        if self.stall_s:
            # The sender has given up by now: never count a stalled request as accepted.
            await asyncio.sleep(self.stall_s.popleft())
            return web.json_response({"error": "stalled"}, status=504)
        if self.fail_with:
            return web.json_response({"error": "try again"}, status=self.fail_with.popleft())
        reference = str(env.get("referenceId"))
        if self.fail_reference.get(reference, 0) > 0:
            self.fail_reference[reference] -= 1
            return web.json_response({"error": "try again"}, status=500)
        self.events.append(env)
        async with self._changed:
            self._changed.notify_all()
        return web.json_response({})

    def types(self, reference_id: str | None = None) -> list[str]:
        """Event types accepted so far (of one referenceId when given), in arrival order."""
        return [
            e["eventType"]
            for e in self.events
            if reference_id is None or e["referenceId"] == reference_id
        ]

    def of(self, reference_id: str) -> list[dict[str, Any]]:
        """Envelopes accepted for one referenceId, in arrival order."""
        return [e for e in self.events if e["referenceId"] == reference_id]

    async def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool]) -> None:
        """Wait until `predicate(self.events)` holds (bound it with `asyncio.timeout`)."""
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self.events))
