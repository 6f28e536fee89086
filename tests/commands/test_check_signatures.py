"""`check` prints the signature schemes in force; `check --online` against a sandbox that
checks requests with another scheme says which one it accepts and the line to set, and
changes nothing (docs/signatures.md)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.configs import PROVIDER_SECRET, make_config, write_config
from tests.support.processes import cli
from tests.support.sandboxes import sandbox_settings
from worker.commands.cli import main
from worker.dev.sandbox import create_app
from worker.provider.signing import DEFAULT, METHOD_PATH_V1, Scheme

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]


def write_check_config(folder: Path, base_url: str, **provider: str) -> Path:
    """A config for a provider at `base_url` with these provider keys, no rules."""
    return write_config(folder, make_config(Path("depositd.db"), base_url, provider=provider))


async def sandbox(aiohttp_server: ServerFactory, scheme: Scheme, secret: str = "") -> str:
    """A sandbox that checks requests with `scheme`; its base URL."""
    cfg = sandbox_settings(api_secret=secret or PROVIDER_SECRET, signature=scheme)
    server = await aiohttp_server(create_app(cfg))
    return str(server.make_url("")).rstrip("/")


def test_check_prints_the_schemes_in_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check` names the scheme for provider requests and the one for webhooks."""
    config = write_check_config(tmp_path, "http://127.0.0.1:9", signature="hmac-sha256-v1")
    cfg = json.loads(config.read_text())
    cfg["webhook"]["signature_encoding"] = "base64"
    config.write_text(json.dumps(cfg))
    assert main(["check", "--config", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "provider requests signed with method-path-v1 (HMAC-SHA256, hex)",
        "webhooks verified with published (HMAC-SHA256, base64, parameters sorted)",
    ]


async def test_check_online_passes_when_the_provider_takes_the_default(
    aiohttp_server: ServerFactory, tmp_path: Path
) -> None:
    """A provider that checks the published formula accepts the default: exit 0."""
    config = write_check_config(tmp_path, await sandbox(aiohttp_server, DEFAULT))
    code, out, err = await cli(config, "check", "--online")
    assert code == 0, err
    assert "provider requests signed with published (HMAC-SHA256, hex" in out


@pytest.mark.parametrize(
    ("provider_scheme", "line"),
    [
        (METHOD_PATH_V1, "provider.signature: method-path-v1"),
        (Scheme(encoding="base64"), "provider.signature_encoding: base64"),
        (Scheme(hash="sha512"), "provider.signature_hash: sha512"),
        (
            Scheme("method-path-v1", encoding="base64"),
            "provider.signature: method-path-v1, provider.signature_encoding: base64",
        ),
    ],
    ids=["method-path-v1", "base64", "sha512", "two-settings"],
)
async def test_check_online_names_the_scheme_the_provider_accepts(
    aiohttp_server: ServerFactory, tmp_path: Path, provider_scheme: Scheme, line: str
) -> None:
    """A provider that refuses the default as unauthorised: `check --online` exits 1, says which
    scheme the provider accepts and the line to set, and leaves the config as it was."""
    config = write_check_config(tmp_path, await sandbox(aiohttp_server, provider_scheme))
    before = config.read_bytes()
    code, _, err = await cli(config, "check", "--online")
    assert code == 1
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert lines[0].startswith("provider: the options endpoint refused the request as unauthor")
    assert lines[1] == (
        f"provider: it accepts {provider_scheme.describe()}, not {DEFAULT.describe()}:"
        f" put {line} in {config} (docs/signatures.md)"
    )
    assert config.read_bytes() == before
    assert PROVIDER_SECRET not in err


async def test_check_online_after_the_old_default_names_published(
    aiohttp_server: ServerFactory, tmp_path: Path
) -> None:
    """A config still on method-path-v1 against a provider on the published formula is told
    to set provider.signature: published."""
    url = await sandbox(aiohttp_server, DEFAULT)
    config = write_check_config(tmp_path, url, signature="method-path-v1")
    code, _, err = await cli(config, "check", "--online")
    assert code == 1
    assert "put provider.signature: published in" in err


async def test_check_online_with_a_wrong_secret_names_no_scheme(
    aiohttp_server: ServerFactory, tmp_path: Path
) -> None:
    """When no known scheme is accepted (here: another secret), it says so and points at the
    key, the secret and the clock."""
    config = write_check_config(tmp_path, await sandbox(aiohttp_server, DEFAULT, secret="other"))
    code, _, err = await cli(config, "check", "--online")
    assert code == 1
    assert "no known signature scheme is accepted either" in err
    assert "provider.api_secret" in err
