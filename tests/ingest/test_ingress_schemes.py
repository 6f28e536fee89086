"""Webhook signatures over real loopback HTTP (docs/signatures.md): deliveries signed with the
published formula are stored; one signed another known way is refused, and the sampled
refusal log line names the scheme and setting that would accept it."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import HOOK_KEY, HOOK_PATH, HOOK_SECRET
from tests.support.ingress import ClientFactory, start_ingress, stored
from tests.support.webhooks import deposit_event
from worker.clock import now_ms
from worker.provider.jsonio import dumpb
from worker.provider.signing import METHOD_PATH_V1, Scheme, signed_headers


def refusals(log: io.StringIO) -> list[dict[str, Any]]:
    """The "webhook refused" log lines so far."""
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    return [e for e in lines if e["event"] == "webhook refused"]


async def test_published_signature_by_hand_is_stored(
    aiohttp_client: ClientFactory, tmp_path: Path
) -> None:
    """With the default settings, a delivery whose API-SIGNATURE is the published formula
    (worked out here with the standard library) is stored; upper-case hex too."""
    client, settings, _ = await start_ingress(aiohttp_client, tmp_path)
    for upper in (False, True):
        raw = dumpb(deposit_event())
        ts = str(now_ms())
        mac = hmac.new(HOOK_SECRET.encode(), raw + b"&" + ts.encode(), hashlib.sha256).hexdigest()
        headers = {"API-KEY": HOOK_KEY, "API-TIMESTAMP": ts, "API-SIGNATURE": mac}
        if upper:
            headers["API-SIGNATURE"] = mac.upper()
        headers["Content-Type"] = "application/json"
        resp = await client.post(HOOK_PATH, data=raw, headers=headers)
        assert resp.status == 200, await resp.text()
    assert len(stored(settings)) == 2


@pytest.mark.parametrize(
    ("config", "signed_with", "target", "named"),
    [
        ({}, METHOD_PATH_V1, HOOK_PATH, "webhook.signature: method-path-v1"),
        ({}, Scheme(encoding="base64"), HOOK_PATH, "webhook.signature_encoding: base64"),
        ({}, Scheme(hash="sha512"), HOOK_PATH, "webhook.signature_hash: sha512"),
        ({}, Scheme(params="as-sent"), HOOK_PATH + "?b=1&a=2", "webhook.signature_params: as-sent"),
        ({"signature": "method-path-v1"}, Scheme(), HOOK_PATH, "webhook.signature: published"),
    ],
    ids=["old-scheme", "base64", "sha512", "as-sent-params", "published-under-old"],
)
async def test_other_scheme_refused_and_named_in_the_log(
    aiohttp_client: ClientFactory,
    tmp_path: Path,
    log_lines: io.StringIO,
    config: dict[str, str],
    signed_with: Scheme,
    target: str,
    named: str,
) -> None:
    """A delivery signed with the right secret but another known scheme or setting is refused
    401, nothing stored; the refusal log line names the key and value that would accept it
    (the answer to the sender does not)."""
    client, settings, _ = await start_ingress(aiohttp_client, tmp_path, **config)
    # The parameter order matters only for a request without a body.
    raw = b"" if "?" in target else dumpb(deposit_event())
    headers = signed_headers(HOOK_KEY, HOOK_SECRET, "POST", target, raw, scheme=signed_with)
    headers["Content-Type"] = "application/json"
    resp = await client.post(target, data=raw, headers=headers)
    assert resp.status == 401
    assert "verifies with" not in await resp.text()
    assert stored(settings) == []
    [line] = refusals(log_lines)
    assert line["verifiesWith"] == named
    assert f"set {named}" in line["hint"]
    assert HOOK_SECRET not in log_lines.getvalue()


async def test_wrong_secret_names_no_scheme(
    aiohttp_client: ClientFactory,
    tmp_path: Path,
    log_lines: io.StringIO,
) -> None:
    """Signed with a secret depositd does not hold, under any scheme: refused, and the log
    line names no scheme (nothing the sender controls is confirmed)."""
    client, _, _ = await start_ingress(aiohttp_client, tmp_path)
    raw = dumpb(deposit_event())
    headers = signed_headers(HOOK_KEY, "not-ours", "POST", HOOK_PATH, raw, scheme=METHOD_PATH_V1)
    resp = await client.post(HOOK_PATH, data=raw, headers=headers)
    assert resp.status == 401
    [line] = refusals(log_lines)
    assert "verifiesWith" not in line and "hint" not in line
