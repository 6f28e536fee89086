"""ProviderClient against a loopback provider that checks signatures with the provider's
published formula, written out here with the standard library alone (docs/signatures.md):
hex(HMAC-SHA256(secret, request_content + "&" + API-TIMESTAMP))."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from worker.errors import ProviderAuthError
from worker.provider import jsonio
from worker.provider.client import ProviderClient
from worker.provider.signing import METHOD_PATH_V1, Scheme

API_KEY = "published-key"
API_SECRET = "published-secret"


@dataclass
class Seen:
    """One request as the provider received it, and what it signed."""

    method: str
    target: str
    content_type: str | None
    source: bytes  # request_content + "&" + API-TIMESTAMP, as the provider reads it


def published_source(request: web.Request, body: bytes) -> bytes:
    """The provider's string to sign: the body as sent, else the parameters as sent."""
    content = body if body else request.raw_path.partition("?")[2].encode()
    return content + b"&" + request.headers["API-TIMESTAMP"].encode()


class PublishedProvider:
    """Answers 200 to requests signed with the published formula, 401 otherwise."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.base_url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        source = published_source(request, body)
        expected = hmac.new(API_SECRET.encode(), source, hashlib.sha256).hexdigest()
        given = request.headers.get("API-SIGNATURE", "")
        self.seen.append(
            Seen(request.method, request.raw_path, request.headers.get("Content-Type"), source)
        )
        if request.headers.get("API-KEY") != API_KEY or not hmac.compare_digest(expected, given):
            answer = {"status": 401, "msg": "signature invalid", "traceId": "t-auth"}
            return web.json_response(answer, status=401)
        data: Any = None
        if request.path.endswith("/options"):
            data = {"providers": ["Binance", "OKX"]}
        elif request.path.endswith("/history"):
            data = {"pageNumber": 1, "pageSize": 50, "totalPage": 1, "totalRow": 0, "records": []}
        elif request.path.endswith("/addresses"):
            data = {"id": "a1", "walletId": 1001, "walletAddress": "TQ5a", "network": "TRON"}
            data["status"] = "PROCESSING"
        answer = {"status": 200, "code": None, "msg": "OK", "traceId": "t", "data": data}
        return web.Response(body=jsonio.dumpb(answer), content_type="application/json")


@pytest.fixture
async def provider(aiohttp_server: AiohttpServer) -> PublishedProvider:
    fake = PublishedProvider()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = await aiohttp_server(app)
    fake.base_url = str(server.make_url("/")).rstrip("/")
    return fake


@pytest.fixture
async def client(provider: PublishedProvider) -> AsyncIterator[ProviderClient]:
    async with ProviderClient(provider.base_url, API_KEY, API_SECRET, retries=0) as made:
        yield made


async def test_get_without_parameters_signs_ampersand_and_timestamp(
    client: ProviderClient, provider: PublishedProvider
) -> None:
    """A GET with no parameters signs "&" + timestamp, and the provider accepts it."""
    assert await client.options() == ["Binance", "OKX"]
    [seen] = provider.seen
    assert seen.method == "GET" and "?" not in seen.target
    assert seen.source.startswith(b"&") and seen.source[1:].isdigit()


async def test_get_with_parameters_signs_them_sorted_as_sent(
    client: ProviderClient, provider: PublishedProvider
) -> None:
    """A GET sends its parameters sorted by name and signs them as sent; the provider reading
    them as sent accepts it."""
    await client.history(white_list_status="init", wallet_id=1001, currency="USDT")
    [seen] = provider.seen
    query = seen.target.partition("?")[2]
    names = [pair.partition("=")[0] for pair in query.split("&")]
    assert (
        names == sorted(names) == ["currency", "pageNum", "pageSize", "walletId", "whiteListStatus"]
    )
    assert seen.source.startswith(query.encode() + b"&")


async def test_post_signs_the_body_as_sent_with_json_content_type(
    client: ProviderClient, provider: PublishedProvider
) -> None:
    """A POST signs its body bytes exactly as sent and carries Content-Type: application/json."""
    body = {"walletId": 1001, "walletAddress": "TQ5a", "network": "TRON"}
    record = await client.register_address(body, idempotency_key="k-1")
    assert record.id == "a1"
    [seen] = provider.seen
    assert seen.method == "POST" and seen.content_type == "application/json"
    sent = jsonio.dumpb(body)
    assert seen.source.startswith(sent + b"&")


@pytest.mark.parametrize(
    "scheme", [METHOD_PATH_V1, Scheme(encoding="base64"), Scheme(hash="sha512")]
)
async def test_other_schemes_are_refused_by_a_published_provider(
    provider: PublishedProvider, scheme: Scheme
) -> None:
    """A client set to another scheme or setting is refused as unauthorised: the default is
    what makes requests authenticate."""
    async with ProviderClient(
        provider.base_url, API_KEY, API_SECRET, retries=0, scheme=scheme
    ) as other:
        with pytest.raises(ProviderAuthError):
            await other.options()
