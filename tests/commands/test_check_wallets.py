"""Rule sets and profile fallbacks checked against the wallets the provider lists: `check
--online` fails for a walletId or walletName the provider does not list (file, line, closest
names), a rule set keyed by name says it matches exactly, and `serve` warns at start."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from tests.support.configs import HOOK_SECRET, serve_config, write_config
from tests.support.ports import free_port
from tests.support.processes import Processes
from worker.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]
BOOK = 'rules:\n  - name: book\n    "on": [credited]\n    then: [book]\n'
# The sandbox lists 1000 "Main account", 1001 "Main USDT" and 1002 "Ops".
RULE_SETS = {
    "main-usd.yaml": 'wallet: "Main USD"\n' + BOOK,
    "w1003.yaml": "description: a wallet that does not exist\nwallet: 1003\n" + BOOK,
    "ops.yaml": 'wallet: "Ops"\n' + BOOK,
    "zz-default.yaml": 'wallet: "*"\n' + BOOK,
}


def _setup(tmp_path: Path, provider_url: str) -> tuple[Path, Path, Path]:
    rules = tmp_path / "rules"
    rules.mkdir()
    for name, text in RULE_SETS.items():
        (rules / name).write_text(text)
    profiles = tmp_path / "profiles.yaml"
    shipped = (ROOT / "rules" / "profiles.yaml").read_text()
    profiles.write_text(
        shipped.replace("  1002: demo-entity", "  1002: demo-entity\n  1009: demo-person")
    )
    cfg = serve_config(
        tmp_path / "depositd.db",
        provider_url,
        free_port(),
        scheduler={"enabled": False},
        rules=str(rules),
        profiles=str(profiles),
    )
    config = write_config(tmp_path, cfg)
    return config, rules, profiles


async def test_check_online_fails_for_wallets_the_provider_does_not_list(
    tmp_path: Path, provider_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "Main USD" (for "Main USDT") and 1003 in rule sets, 1009 in the profiles' wallets:
    exit 2, each with file and line and the closest names; "Ops" is said to match exactly.
    Offline, `check` passes and says a name matches exactly."""
    config, rules, profiles = _setup(tmp_path, provider_url)
    code = await asyncio.to_thread(main, ["check", "--online", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("warning")]
    fallback = 'so this rule set never applies (its deposits fall back to the "*" rule set)'
    line_1009 = profiles.read_text().splitlines().index("  1009: demo-person") + 1
    assert lines == [
        f"note: {rules / 'ops.yaml'}:1: wallet: 'Ops' matches the provider's wallet 1002 by"
        " walletName, exactly (case and spaces count)",
        f"{rules / 'main-usd.yaml'}:1: wallet: 'Main USD' is not a walletName the provider lists"
        f" (names match exactly: case and spaces count), {fallback}; closest: 1001 'Main USDT',"
        " 1000 'Main account'",
        f"{rules / 'w1003.yaml'}:2: wallet: 1003 is not a walletId the provider lists, {fallback};"
        " closest: 1002 'Ops', 1001 'Main USDT', 1000 'Main account'",
        f"{profiles}:{line_1009}: wallets: 1009 (profile 'demo-person') is not a walletId the"
        " provider lists, so this fallback never applies; closest: 1002 'Ops', 1001 'Main USDT',"
        " 1000 'Main account'",
    ]

    code = await asyncio.to_thread(main, ["check", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert (
        f"note: {rules / 'main-usd.yaml'}:1: wallet: 'Main USD' is a walletName: it matches"
        " deposits whose walletName is exactly 'Main USD' (case and spaces count)"
    ) in err


async def test_serve_warns_at_start_for_wallets_the_provider_does_not_list(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """`serve` starts (the rules are valid) and logs one warning per rule set or fallback
    naming a wallet the provider does not list."""
    config, rules, _ = _setup(tmp_path, provider_url)
    port = json.loads(config.read_text())["webhook"]["listen"].split(":")[1]
    log = tmp_path / "serve.log"
    serve = processes.serve(config, int(port), log)
    try:
        await serve.start()
        for _ in range(200):
            if log.read_text().count("is not a wallet") >= 3:
                break
            await asyncio.sleep(0.05)
        assert await serve.signal(signal.SIGTERM) == 0
    finally:
        await serve.kill()
    warned = [
        line["warning"]
        for line in map(json.loads, log.read_text().splitlines())
        if line.get("level") == "warning" and "is not a wallet" in line.get("warning", "")
    ]
    assert len(warned) == 3, warned
    assert any(w.startswith(f"{rules / 'main-usd.yaml'}:1:") and "Main USDT" in w for w in warned)


def _agreeing_setup(tmp_path: Path, provider_url: str) -> Path:
    """`_setup` without what the provider does not list."""
    config, rules, profiles = _setup(tmp_path, provider_url)
    for name in ("main-usd.yaml", "w1003.yaml"):
        (rules / name).unlink()
    profiles.write_text((ROOT / "rules" / "profiles.yaml").read_text())
    return config


async def test_check_online_says_what_it_checked_and_not_the_webhook_secret(
    tmp_path: Path, provider_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a setup the provider agrees with, `check --online` prints more than `check`: what the
    database promises, that the provider accepted signed requests and covers the profiles'
    providers and the wallets, and that the webhook secret cannot be tested from here, with the
    settings to compare."""
    config = _agreeing_setup(tmp_path, provider_url)
    assert await asyncio.to_thread(main, ["check", "--config", str(config)]) == 0
    offline = capsys.readouterr().out
    assert await asyncio.to_thread(main, ["check", "--online", "--config", str(config)]) == 0
    online = capsys.readouterr().out
    said = offline.splitlines()
    database, *extra = [line for line in online.splitlines() if line not in said]
    assert database.startswith("database: ") and "acknowledged webhook survives" in database
    assert len(extra) == 2, online
    assert extra[0].startswith(f"online: {provider_url} accepted signed requests")
    assert "cannot be tested from here" in extra[1]
    assert "webhook.secret" in extra[1] and "webhook.api_key" in extra[1]
    assert HOOK_SECRET not in extra[1].split()  # the configured secret itself is never printed
