"""`depositd selftest --url URL` through a reverse proxy (an aiohttp app on loopback) in front
of a running depositd endpoint: passes through a straight proxy, names the fault otherwise."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.configs import HOOK_PATH, HOOK_SECRET
from tests.support.ingress import write_ingress_config
from tests.support.processes import cli
from worker.commands.selftest import EVENT_TYPE
from worker.config.settings import load_settings
from worker.service.setup import build_app

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]


def proxy(upstream: str, rewrite: Callable[[str], str]) -> web.Application:
    """A reverse proxy: every request goes to `upstream` + rewrite(path), body and headers as
    they came; the answer comes back as it is."""

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host",)}
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method, upstream + rewrite(request.raw_path), data=body, headers=headers
            ) as resp,
        ):
            return web.Response(
                status=resp.status,
                body=await resp.read(),
                content_type=resp.content_type,
            )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def strip(path: str) -> str:
    """What a proxy that strips the public prefix passes on."""
    return path.removeprefix("/depositd")


@pytest.mark.parametrize(
    ("public_path", "rewrite", "code", "expected", "scheme"),
    [
        (HOOK_PATH, lambda p: p, 0, "stored: yes (ignored)", "published"),
        (HOOK_PATH, lambda p: p, 0, "stored: yes (ignored)", "method-path-v1"),
        ("/depositd" + HOOK_PATH, strip, 1, "check: path rewritten", "method-path-v1"),
        ("/depositd" + HOOK_PATH, strip, 0, "stored: yes (ignored)", "published"),
        (HOOK_PATH, lambda p: "/upstream" + p, 1, "check: 404", "published"),
    ],
    ids=[
        "straight",
        "straight-method-path-v1",
        "strips-prefix-method-path-v1",
        "strips-prefix-published",
        "wrong-upstream-path",
    ],
)
async def test_selftest_through_a_proxy(
    aiohttp_server: ServerFactory,
    tmp_path: Path,
    public_path: str,
    rewrite: Callable[[str], str],
    code: int,
    expected: str,
    scheme: str,
) -> None:
    """selftest signs with the configured webhook scheme. Through a straight proxy the selftest
    event is stored (ignored) and selftest exits 0; a proxy that strips a path prefix fails
    under method-path-v1 (which signs the path) with the signed and the arrived path named,
    and passes under the published scheme (which does not); one that forwards to another path
    fails with the 404 hint. A failure stores nothing."""
    config = write_ingress_config(tmp_path, signature=scheme)
    settings = load_settings(config)
    backend = await aiohttp_server(build_app(settings, sweep_interval_s=0.05))
    front = await aiohttp_server(proxy(str(backend.make_url("")).rstrip("/"), rewrite))
    url = str(front.make_url(public_path))
    status, out, err = await cli(config, "selftest", "--url", url)
    assert status == code, (out, err)
    assert expected in out, out
    with closing(sqlite3.connect(settings.storage.path)) as db:
        types = [r[0] for r in db.execute("SELECT event_type FROM events")]
    assert types == ([EVENT_TYPE] if code == 0 else [])
    if code == 0:  # a pass says what it cannot show: the provider's secret may still differ
        assert "cannot tell whether the provider signs with the same ones" in out
        assert "webhookAuthRefused" in out and HOOK_SECRET not in out
    if "path rewritten" in expected:
        assert f"signed for /depositd{HOOK_PATH}, arrived as {HOOK_PATH}" in out
        assert HOOK_SECRET not in out
