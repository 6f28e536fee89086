"""The configuration file: empty credentials, duplicate keys, non-UTF-8 files, typo'd `*_file`
keys, and `check` reporting config, rules and profiles problems at once."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from worker.commands.cli import main
from worker.config.settings import load_settings
from worker.errors import ConfigError
from worker.provider.signing import DEFAULT, METHOD_PATH_V1

# Line 1 of every config below; the lines the tests name count from here.
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
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def problems(config: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    return info.value.problems


def check(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["check", "--config", str(config)])
    return code, capsys.readouterr().err.splitlines()


# --- 1. credentials must not be empty ---------------------------------------------------------


def test_check_refuses_an_empty_webhook_secret_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`WEBHOOK_SECRET= depositd check` fails: an empty HMAC key verifies forged deliveries."""
    monkeypatch.setenv("WEBHOOK_SECRET", "")
    config = write(tmp_path, "depositd.yaml", BASE.replace("hook-secret", "${WEBHOOK_SECRET}"))
    assert check(config, capsys) == (
        2,
        [f"{config}:7: webhook.secret: is empty (from environment variable WEBHOOK_SECRET)"],
    )


def test_empty_or_blank_secret_files_are_refused(tmp_path: Path) -> None:
    """A secret file holding nothing, or only whitespace and newlines, is an empty secret; the
    problem names the key as written, its line and the file."""
    write(tmp_path, "api_secret", "\n")
    write(tmp_path, "hook_old", "old-secret\n")
    write(tmp_path, "hook_new", "  \n\n")
    config = write(
        tmp_path,
        "depositd.yaml",
        BASE.replace("  api_secret: provider-secret\n", "  api_secret_file: api_secret\n").replace(
            "  secret: hook-secret\n", "  secret_file:\n    - hook_old\n    - hook_new\n"
        ),
    )
    assert problems(config) == [
        f"{config}:4: provider.api_secret_file: is empty (from file {tmp_path}/api_secret)",
        f"{config}:9: webhook.secret_file.1: is empty (from file {tmp_path}/hook_new)",
    ]


def test_every_credential_must_be_non_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """API keys, each rotation secret, the Slack URL and an e-mail password given empty are
    refused, with the variable they came from and never a value."""
    monkeypatch.setenv("HOOK_KEY", " ")
    monkeypatch.setenv("SLACK_URL", "")
    monkeypatch.setenv("SMTP_PASSWORD", "")
    config = write(
        tmp_path,
        "depositd.yaml",
        BASE.replace("api_key: provider-key", 'api_key: ""')
        .replace("api_key: hook-key", "api_key: ${HOOK_KEY}")
        .replace("secret: hook-secret", "secret: [hook-secret, '']")
        + "notify:\n"
        + "  slack: {webhook_url: '${SLACK_URL}'}\n"
        + "  email: {host: smtp.example, from: a@b.example, to: c@d.example,"
        + " password: '${SMTP_PASSWORD}'}\n",
    )
    found = problems(config)
    assert found == [
        f"{config}:3: provider.api_key: is empty",
        f"{config}:6: webhook.api_key: is empty (from environment variable HOOK_KEY)",
        f"{config}:7: webhook.secret.1: is empty",
        f"{config}:11: notify.slack.webhook_url: is empty (from environment variable SLACK_URL)",
        f"{config}:12: notify.email.password: is empty (from environment variable SMTP_PASSWORD)",
    ]
    assert "hook-secret" not in "\n".join(found)


def test_an_unset_variable_is_reported_once(tmp_path: Path) -> None:
    """An unset ${VAR} in a credential is named once, not also as an empty value."""
    config = write(tmp_path, "depositd.yaml", BASE.replace("hook-secret", "${DEPOSITD_UNSET_X}"))
    assert problems(config) == [
        f"{config}:7: webhook.secret: environment variable DEPOSITD_UNSET_X is not set"
    ]


# --- 2. duplicate keys ------------------------------------------------------------------------


def test_duplicate_keys_in_the_config_are_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`storage:` or `secret:` given twice fails check with file:line instead of the last
    silently winning."""
    config = write(
        tmp_path,
        "depositd.yaml",
        BASE.replace("  secret: hook-secret\n", "  secret: hook-secret\n  secret: other\n")
        + "storage:\n  path: other.db\n",
    )
    assert check(config, capsys) == (
        2,
        [
            f"{config}:8: key 'secret' is given twice (first at line 7)",
            f"{config}:11: key 'storage' is given twice (first at line 9)",
        ],
    )


# --- 3. files that are not UTF-8 --------------------------------------------------------------


def test_a_config_file_that_is_not_utf8_is_a_config_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A non-UTF-8 config exits 2 with a message naming the file, not a traceback quoting a byte."""
    config = tmp_path / "depositd.yaml"
    config.write_bytes(BASE.replace("hook-secret", "s\xe8cret").encode("latin-1"))
    assert check(config, capsys) == (2, [f"{config}:1: configuration is not UTF-8 text"])


def test_a_secret_file_that_is_not_utf8_is_a_config_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A non-UTF-8 `*_file` secret is named with its key and line; its bytes never appear."""
    (tmp_path / "secret").write_bytes(b"ab\xe8c\n")
    config = write(
        tmp_path, "depositd.yaml", BASE.replace("  secret: hook-secret", "  secret_file: secret")
    )
    code, err = check(config, capsys)
    assert (code, err) == (
        2,
        [f"{config}:7: webhook.secret_file: {tmp_path}/secret is not UTF-8 text"],
    )


# --- 4. check: every problem at once ----------------------------------------------------------

PROFILES = """
profiles:
  ops:
    correspondentType: ALIEN
    countryCode: SG
    walletType: VASP
    provider: Binance
"""

RULES = """
wallet: 1001
rules:
  - name: r
    on: [nope]
    then: [book]
"""


def test_check_reports_rules_and_profiles_despite_config_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unset ${VAR} does not hide the problems of the rules and profiles the config names."""
    write(tmp_path, "profiles.yaml", PROFILES)
    write(tmp_path, "rules/a.yaml", RULES)
    config = write(
        tmp_path,
        "depositd.yaml",
        BASE.replace("hook-secret", "${DEPOSITD_UNSET_X}")
        + "rules: rules\nprofiles: profiles.yaml\n",
    )
    code, err = check(config, capsys)
    assert code == 2
    assert err[0] == f"{config}:7: webhook.secret: environment variable DEPOSITD_UNSET_X is not set"
    assert err[1].startswith(f"{tmp_path}/profiles.yaml:3: profile 'ops': correspondentType ")
    assert err[2].startswith(f"{tmp_path}/rules/a.yaml:4: rules[0].on: unknown trigger 'nope'")
    assert len(err) == 3


def test_check_reads_the_rules_when_only_the_profiles_path_is_broken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profiles path that is itself broken is reported and skipped; the rules the config
    names plainly are still validated."""
    write(tmp_path, "rules/a.yaml", RULES)
    config = write(
        tmp_path,
        "depositd.yaml",
        BASE + "rules: rules\nprofiles: ${DEPOSITD_UNSET_X}/profiles.yaml\n",
    )
    code, err = check(config, capsys)
    assert code == 2
    assert err[0] == f"{config}:11: profiles: environment variable DEPOSITD_UNSET_X is not set"
    assert err[1].startswith(f"{tmp_path}/rules/a.yaml:4: rules[0].on: unknown trigger 'nope'")
    assert len(err) == 2


# --- 5. a typo'd key and --config before the command ------------------------------------------


def test_a_typo_in_a_file_key_is_reported_as_written(tmp_path: Path) -> None:
    """`api_secrte_file` is an unknown key on its own line, not `api_secrte` at the section;
    the file it names is not read (a typo'd key naming no file gives no second problem)."""
    write(tmp_path, "api_secret", "provider-secret\n")
    config = write(
        tmp_path,
        "depositd.yaml",
        BASE.replace("  api_secret: provider-secret\n", "  api_secrte_file: api_secret\n")
        + "notify:\n  slack:\n    webhook_ulr_file: no-such-file\n",
    )
    # Messages in plain words: what is missing and how to give it, the key meant.
    found = problems(config)
    assert [line.split(" (")[0] for line in found] == [
        f"{config}:1: provider.api_secret: missing: give provider.api_secret",
        f"{config}:4: provider.api_secrte_file: unknown key; did you mean 'api_secret_file'?",
        f"{config}:11: notify.slack.webhook_url: missing: give notify.slack.webhook_url",
        f"{config}:12: notify.slack.webhook_ulr_file: unknown key; did you mean"
        " 'webhook_url_file'?",
    ]
    assert "or provider.api_secret_file (a file holding it" in found[0]


def test_config_may_come_before_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`depositd --config X check` reads X, as `depositd check --config X` does."""
    config = write(tmp_path, "depositd.yaml", BASE)
    assert main(["--config", str(config), "check"]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {config}: ")


def test_check_refuses_an_instance_lease_under_a_second(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`instance.lease_s` below 1 s is refused at its line: a lease renewed every quarter of it
    would flap between the instances."""
    config = write(tmp_path, "depositd.yaml", BASE + "instance:\n  lease_s: 0.5\n")
    code, err = check(config, capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"{config}:11: instance.lease_s:"), err
    good = write(tmp_path, "ok.yaml", BASE + "instance:\n  lease_s: 5\n")
    assert load_settings(good).instance.lease_s == 5


# --- signature keys ----------------------------------------------------------------------------


def test_signature_keys_default_to_the_published_scheme(tmp_path: Path) -> None:
    """Without signature keys both sections use the published scheme (docs/signatures.md)."""
    settings = load_settings(write(tmp_path, "depositd.yaml", BASE))
    assert settings.provider.scheme == settings.webhook.scheme == DEFAULT
    assert settings.provider.signature == "published"


def test_old_scheme_name_is_read_as_method_path_v1(tmp_path: Path) -> None:
    """A config that says `signature: hmac-sha256-v1` keeps the old scheme, under its new name."""
    text = BASE.replace("  api_secret: provider-secret\n", "  api_secret: provider-secret\n"
                        "  signature: hmac-sha256-v1\n")  # fmt: skip
    settings = load_settings(write(tmp_path, "depositd.yaml", text))
    assert settings.provider.scheme == METHOD_PATH_V1
    assert settings.webhook.scheme == DEFAULT


def test_unknown_signature_setting_names_the_choices(tmp_path: Path) -> None:
    """An unknown value of a signature key is an error naming file, line, key and the choices."""
    text = BASE.replace("  secret: hook-secret\n", "  secret: hook-secret\n"
                        "  signature_encoding: base32\n")  # fmt: skip
    config = write(tmp_path, "depositd.yaml", text)
    assert problems(config) == [
        f"{config}:8: webhook.signature_encoding: must be one of: hex, base64"
    ]


# --- retention of personal data ------------------------------------------------------------------


def test_personal_data_is_kept_unless_a_retention_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unset (or empty): kept; a whole number of days, also from a ${VAR}, is read as given."""
    assert load_settings(write(tmp_path, "a.yaml", BASE)).retention.personal_data_days is None
    empty = write(tmp_path, "b.yaml", BASE + "retention:\n  personal_data_days:\n")
    assert load_settings(empty).retention.personal_data_days is None
    given = write(tmp_path, "c.yaml", BASE + "retention:\n  personal_data_days: 1825\n")
    assert load_settings(given).retention.personal_data_days == 1825
    monkeypatch.setenv("KEEP_DAYS", "90")
    variable = write(tmp_path, "d.yaml", BASE + "retention:\n  personal_data_days: ${KEEP_DAYS}\n")
    assert load_settings(variable).retention.personal_data_days == 90


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "must be more than 0"),
        ("-30", "must be more than 0"),
        ("30.5", "must be a whole number of days, e.g. 1825"),
        ("30.0", "must be a whole number of days, e.g. 1825"),
        ("true", "must be a whole number of days, e.g. 1825"),
        ("thirty", "must be a whole number of days, e.g. 1825"),
        ("[30]", "must be a whole number, not a list"),
    ],
)
def test_a_retention_that_is_not_a_positive_whole_number_of_days_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    """0, a negative, a fraction, `true` (which would read as 1 day) or text: `check` names
    the file, line and key, and says what would be right."""
    config = write(tmp_path, "depositd.yaml", BASE + f"retention:\n  personal_data_days: {value}\n")
    assert check(config, capsys) == (2, [f"{config}:11: retention.personal_data_days: {message}"])
