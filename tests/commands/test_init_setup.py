"""What `init --sandbox` writes: a rules folder laid out like the shipped one, every path its
files mention present, and a console that works as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from worker.commands.cli import main
from worker.config.settings import load_settings

# Paths the generated files name, relative to the setup folder or to the file that names them.
MENTIONED = re.compile(r"(?<![\w./])(?:rules|examples|schemas|secrets)/[\w./-]*\w")
SCHEMA_LINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$", re.M)
# The one path named as a target to create: "Copy it to rules/wallet-1001.yaml".
COPY_TARGET = "rules/wallet-1001.yaml"


@pytest.fixture
def folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["init", "--sandbox", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    return tmp_path / "s"


def test_init_writes_a_rules_folder(folder: Path) -> None:
    """The rules are a folder as the cookbook says (`rules/wallet-1001.yaml` goes beside the
    default set), with the profiles and the per-wallet example where the shipped rules say."""
    settings = load_settings(folder / "depositd.yaml")
    assert settings.rules == folder / "rules"
    assert settings.profiles == folder / "rules" / "profiles.yaml"
    assert sorted(p.relative_to(folder).as_posix() for p in (folder / "rules").rglob("*")) == [
        "rules/default.yaml",
        "rules/examples",
        "rules/examples/wallet-1001.example.yaml",
        "rules/profiles.yaml",
    ]


def test_every_path_the_generated_files_mention_exists(folder: Path) -> None:
    """Each path named in a generated YAML file (comments included) and each editor schema line
    resolves, from the setup folder or from the file itself."""
    named = 0
    for path in folder.rglob("*.yaml"):
        text = path.read_text(encoding="utf-8")
        schema = SCHEMA_LINE.search(text)
        assert schema, f"{path}: no schema line"
        assert (path.parent / schema.group(1)).is_file(), f"{path}: {schema.group(1)}"
        for mentioned in MENTIONED.findall(SCHEMA_LINE.sub("", text)):
            if mentioned == COPY_TARGET:
                continue
            named += 1
            where = [folder / mentioned, path.parent / mentioned]
            assert any(p.exists() for p in where), f"{path} names {mentioned}: not there"
    assert named >= 8


def test_init_prints_the_console_and_configures_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`init` prints the console's address and where its token is; the configuration serves the
    console on that loopback port, with the token file and the sandbox's hosted page."""
    assert main(["init", "--sandbox", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    settings = load_settings(tmp_path / "s" / "depositd.yaml")
    console = settings.console
    assert console is not None and console.host == "127.0.0.1"
    assert f"the console, while serve runs: http://127.0.0.1:{console.port}/\n" in out
    token = tmp_path / "s" / "secrets" / "console_token"
    assert f"its login token: cat {token}\n" in out
    assert console.token_file == token and len(token.read_text().strip()) >= 32
    assert token.stat().st_mode & 0o077 == 0
    sandbox = settings.provider.base_url.rstrip("/")
    assert console.hosted_url == f"{sandbox}/hosted"
    ports = {console.port, settings.webhook.port, int(sandbox.rsplit(":", 1)[1])}
    assert len(ports) == 3
