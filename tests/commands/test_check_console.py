"""`check` on the console block: the token file (missing, empty, readable by others), the
hosted page's URL (plain http off this machine) and unknown keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.commands.cli import main

BASE = """\
provider:
  base_url: http://127.0.0.1:9
  api_key: provider-key
  api_secret: provider-secret
webhook:
  api_key: hook-key
  secret: hook-secret
storage:
  path: depositd.db
console:
  listen: 127.0.0.1:8081
  token_file: console_token
"""


def run_check(tmp_path: Path, extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    config = tmp_path / "depositd.yaml"
    config.write_text(BASE + extra)
    code = main(["check", "--config", str(config)])
    return code, capsys.readouterr().err


def token(tmp_path: Path, text: str = "s3cret-console-token\n", mode: int = 0o600) -> Path:
    path = tmp_path / "console_token"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_private_token_file_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A readable, non-empty token file only this user reads: no console problem or warning."""
    token(tmp_path)
    code, err = run_check(tmp_path, "  hosted_url: https://hosted.provider.com\n", capsys)
    assert code == 0, err
    assert "console" not in err


def test_a_missing_token_file_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No token file: exit 2, naming console.token_file and the path, never a token."""
    code, err = run_check(tmp_path, "", capsys)
    assert code == 2
    assert "console.token_file" in err and str(tmp_path / "console_token") in err


def test_an_empty_token_file_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token file holding only whitespace: exit 2 (anyone could log in with nothing)."""
    token(tmp_path, "  \n")
    code, err = run_check(tmp_path, "", capsys)
    assert code == 2 and "console.token_file" in err and "empty" in err


def test_a_token_file_others_may_read_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token file group or others may read passes with a warning that says chmod 600."""
    token(tmp_path, mode=0o644)
    code, err = run_check(tmp_path, "", capsys)
    assert code == 0
    assert "warning:" in err and "console.token_file" in err and "chmod 600" in err
    assert "s3cret-console-token" not in err


def test_plain_http_hosted_page_off_loopback_is_an_error_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """hosted_url over plain http to another host: exit 2; accepted with a warning when
    console.allow_insecure_http says so; loopback needs no flag."""
    token(tmp_path)
    code, err = run_check(tmp_path, "  hosted_url: http://hosted.provider.example\n", capsys)
    assert code == 2 and "console.hosted_url" in err
    code, err = run_check(
        tmp_path,
        "  hosted_url: http://hosted.provider.example\n  allow_insecure_http: true\n",
        capsys,
    )
    assert code == 0 and "warning:" in err and "console.hosted_url" in err
    code, err = run_check(tmp_path, "  hosted_url: http://127.0.0.1:8090/hosted\n", capsys)
    assert code == 0 and "console" not in err


def test_unknown_console_keys_and_a_missing_token_file_key_are_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in the console block is an error, and so is a console without token_file."""
    token(tmp_path)
    code, err = run_check(tmp_path, "  sesion_ttl_s: 60\n", capsys)
    assert code == 2 and "sesion_ttl_s" in err
    config = tmp_path / "depositd.yaml"
    config.write_text(BASE.replace("  token_file: console_token\n", ""))
    assert main(["check", "--config", str(config)]) == 2
    assert "token_file" in capsys.readouterr().err
