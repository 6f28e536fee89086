"""Configuration and profile problems in plain words: file, line, key, what is wrong and what
would be right; `check` warnings for alerts that go nowhere."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.configs import PROVIDER_KEY, PROVIDER_SECRET
from tests.support.paths import ROOT
from tests.support.processes import Processes
from worker.commands.cli import main
from worker.config.settings import load_settings
from worker.errors import ConfigError


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def problems(config: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    return info.value.problems


def test_config_problems_say_what_would_be_right(tmp_path: Path) -> None:
    """A missing section names what it needs, a bare port asks for HOST:PORT, a missing secret
    mentions secret_file, a misspelled key gets a did-you-mean; none in pydantic's words."""
    config = write(
        tmp_path,
        "depositd.yaml",
        """
        provider:
          base_url: http://127.0.0.1:9
          api_key: k
          api_secret: s
        webhook:
          listen: 8089
          api_key: k
          secrte: s
        """,
    )
    assert problems(config) == [
        f'{config}:6: webhook.listen: must be HOST:PORT in quotes, e.g. "127.0.0.1:8089"',
        f"{config}:5: webhook.secret: missing: give webhook.secret (the value, or ${{VARIABLE}})"
        " or webhook.secret_file (a file holding it, e.g. a systemd credential)",
        f"{config}:8: webhook.secrte: unknown key; did you mean 'secret'? (known here: listen,"
        " path, api_key, api_key_file, secret, secret_file, tolerance_s, max_body_bytes,"
        " signature, signature_hash, signature_encoding, signature_params, ingress_process,"
        " head_timeout_s, idle_timeout_s, max_connections, body_budget_bytes, ops_listen)",
        f"{config}:1: storage: missing: the file needs a `storage:` section (with storage.path,"
        " or storage.url for PostgreSQL)",
    ]


def test_config_value_problems_in_plain_words(tmp_path: Path) -> None:
    """Out-of-range numbers, wrong choices and wrong types say the allowed values."""
    config = write(
        tmp_path,
        "depositd.yaml",
        """
        provider: {base_url: "http://127.0.0.1:9", api_key: k, api_secret: s, timeout_s: 0}
        webhook: {api_key: k, secret: s, max_body_bytes: many}
        storage: {path: x.db, synchronous: OFF}
        log: {level: loud}
        """,
    )
    found = "\n".join(problems(config))
    assert "provider.timeout_s: must be more than 0" in found
    assert "webhook.max_body_bytes: must be a whole number, not something else" in found
    assert "storage.synchronous: must be one of: FULL, NORMAL, EXTRA" in found
    assert "log.level: must be one of: debug, info, warning, error" in found
    assert "Input should" not in found and "Field required" not in found


def test_a_bad_indent_is_named_in_plain_words(tmp_path: Path) -> None:
    """A YAML indentation mistake gives file:line and says to indent like the keys next to it."""
    config = write(tmp_path, "depositd.yaml", "provider:\n  base_url: x\n   api_key: k\n")
    assert problems(config) == [
        f"{config}:3: invalid YAML (column 11): a `key: value` where none can start: indent this"
        ' line like the keys next to it, or quote a value that holds ": "'
    ]


def test_country_code_uk_suggests_gb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`countryCode: UK` in a profile is refused with file, line and the code meant: GB."""
    main(["init", "--sandbox", str(tmp_path / "s")])
    profiles = tmp_path / "s" / "rules" / "profiles.yaml"
    profiles.write_text(profiles.read_text().replace("countryCode: SG", "countryCode: UK"))
    capsys.readouterr()
    assert main(["check", "--config", str(tmp_path / "s" / "depositd.yaml")]) == 2
    line = profiles.read_text().splitlines().index("    countryCode: UK") + 1
    assert capsys.readouterr().err.splitlines() == [
        f"{profiles}:{line}: profile 'fictitious-demo-payer': countryCode is not an ISO 3166-1"
        " alpha-2 code; did you mean 'GB'?"
    ]


def test_a_wrong_profile_value_is_reported_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile with a bad value that a rule names by name: only the profile's error, not a
    second one calling the rule's profile unknown; a rule naming a profile that is not in the
    file at all still is."""
    main(["init", "--sandbox", str(tmp_path / "s")])
    profiles = tmp_path / "s" / "rules" / "profiles.yaml"
    profiles.write_text(profiles.read_text().replace("countryCode: SG", "countryCode: UK"))
    rules = tmp_path / "s" / "rules" / "named.yaml"
    rules.write_text(
        "wallet: 1001\nrules:\n"
        '  - name: named\n    "on": [needs_details]\n'
        "    then: [{submit_profile: {profile: fictitious-demo-payer}}]\n"
        '  - name: other\n    "on": [rejected]\n'
        "    then: [{submit_profile: {profile: nobody}}]\n"
    )
    capsys.readouterr()
    assert main(["check", "--config", str(tmp_path / "s" / "depositd.yaml")]) == 2
    errors = [e for e in capsys.readouterr().err.splitlines() if not e.startswith("warning")]
    assert len(errors) == 2, errors
    assert errors[0].startswith(f"{profiles}:") and "did you mean 'GB'?" in errors[0]
    assert errors[1].startswith(f"{rules}:") and "unknown profile 'nobody'" in errors[1]


def test_a_misspelled_payer_field_gets_a_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`walletLable:` in a profile is named with the field meant, as every other key is."""
    main(["init", "--sandbox", str(tmp_path / "s")])
    profiles = tmp_path / "s" / "rules" / "profiles.yaml"
    profiles.write_text(profiles.read_text().replace("walletLabel:", "walletLable:"))
    capsys.readouterr()
    assert main(["check", "--config", str(tmp_path / "s" / "depositd.yaml")]) == 2
    line = profiles.read_text().splitlines().index("    walletLable: Fictitious demo wallet") + 1
    assert capsys.readouterr().err.splitlines() == [
        f"{profiles}:{line}: profile 'fictitious-demo-payer': walletLable is not a payer details"
        " field; did you mean 'walletLabel'?"
    ]


def test_check_warns_when_alerts_go_nowhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With alert rules and no notify channel, `check` passes (0) but warns that alerts are only
    logged; with a channel it does not warn."""
    main(["init", "--sandbox", str(tmp_path / "s")])
    config = tmp_path / "s" / "depositd.yaml"
    capsys.readouterr()
    assert main(["check", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert "notify: no channel is configured, so the alerts of your rules" in err
    assert f"{tmp_path / 's' / 'rules' / 'default.yaml'}:" in err
    config.write_text(
        config.read_text() + "notify:\n  slack: {webhook_url: 'http://127.0.0.1:9'}\n"
    )
    assert main(["check", "--config", str(config)]) == 0
    assert "warning" not in capsys.readouterr().err


async def test_check_online_lists_offered_providers_closest_first(
    tmp_path: Path, provider_url: str, processes: Processes
) -> None:
    """`check --online` with a provider name the provider does not offer names the profile's
    line and the offered names, the closest first."""
    assert main(["init", "--sandbox", str(tmp_path / "s")]) == 0
    folder = tmp_path / "s"
    config = folder / "depositd.yaml"
    text = config.read_text()
    text = text.replace(text.split("base_url: ")[1].split()[0], provider_url)
    config.write_text(text)
    (folder / "secrets" / "provider_api_key").write_text(PROVIDER_KEY)
    (folder / "secrets" / "provider_api_secret").write_text(PROVIDER_SECRET)
    profiles = folder / "rules" / "profiles.yaml"
    profiles.write_text(profiles.read_text().replace("provider: Binance", "provider: Krakn"))
    proc = processes.own(
        await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "worker", "check", "--online", "--config", str(config)],
            stderr=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    )
    _, err = await proc.communicate()
    lines = [line for line in err.decode().splitlines() if not line.startswith("warning")]
    assert proc.returncode == 2
    line = profiles.read_text().splitlines().index("    provider: Krakn") + 1
    assert lines == [
        f"{profiles}:{line}: profile 'fictitious-demo-payer': provider is not one the provider"
        " offers; give one of (closest first): Kraken, Binance, OKX, Coinbase, Bybit"
    ]


@pytest.mark.parametrize("how", ["default", "env", "option"])
def test_a_missing_configuration_says_how_to_give_one(
    tmp_path: Path,
    how: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No configuration file where one was looked for: the error names the path, why that
    path, and the ways to give one: --config, $DEPOSITD_CONFIG, `depositd init --sandbox`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEPOSITD_CONFIG", raising=False)
    argv = ["status"]
    if how == "env":
        monkeypatch.setenv("DEPOSITD_CONFIG", str(tmp_path / "env.yaml"))
    elif how == "option":
        argv += ["--config", "given.yaml"]
    assert main(argv) == 2
    [line] = capsys.readouterr().err.splitlines()
    path = {"default": "depositd.yaml", "env": "env.yaml", "option": "given.yaml"}[how]
    assert line.startswith(f"{tmp_path / path}: no configuration file here (")
    why = {"default": "the default", "env": "named by $DEPOSITD_CONFIG", "option": "--config"}
    assert why[how] in line
    assert "--config PATH" in line and "$DEPOSITD_CONFIG" in line
    assert "depositd init --sandbox DIR" in line
