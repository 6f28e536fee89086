"""Payer profiles: loading with file:line problems, look-ups, hashes, and no leaks in reprs."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.act.kinds import SPECS
from worker.config.profiles import Profiles
from worker.errors import ConfigError
from worker.provider.payer import content_hash
from worker.rules import RuleBook

ProfileFactory = Callable[..., dict[str, Any]]

SHIPPED = Path(__file__).resolve().parents[2] / "rules"
PERSONAL = ("Acme Trading Ltd", "1 Raffles Place", "Ada", "Lovelace", "1990-02-28", "St James")


def write(tmp_path: Path, data: dict[str, Any] | str) -> Path:
    path = tmp_path / "profiles.yaml"
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        Profiles.load(path)
    return info.value.problems


@pytest.fixture
def good(tmp_path: Path, entity_payer: ProfileFactory, individual_payer: ProfileFactory) -> Path:
    return write(
        tmp_path,
        {
            "profiles": {"acme": entity_payer(), "ada": individual_payer()},
            "addresses": {"TAddrOfAda": "ada", "0xAbC0": "acme"},
            "wallets": {1001: "acme"},
        },
    )


def test_shipped_profiles_load() -> None:
    """rules/profiles.yaml and rules/profiles.example.yaml load cleanly."""
    assert Profiles.load(SHIPPED / "profiles.yaml").names() == {"demo-entity", "demo-person"}
    example = Profiles.load(SHIPPED / "profiles.example.yaml")
    assert example.names() == {"acme-ops", "jane-example", "other-example"}
    match = example.for_deposit(1, "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed")
    assert match is not None and match.name == "jane-example"


def test_address_beats_wallet_fallback(good: Path) -> None:
    """A known source address wins over the wallet's fallback profile."""
    profiles = Profiles.load(good)
    match = profiles.for_deposit(1001, "TAddrOfAda")
    assert match is not None and (match.name, match.via) == ("ada", "address")
    match = profiles.for_deposit(1001, "TUnknown")
    assert match is not None and (match.name, match.via) == ("acme", "wallet")
    match = profiles.for_deposit(2002, "0xAbC0")
    assert match is not None and (match.name, match.via) == ("acme", "address")
    assert match.details.fullName == "Acme Trading Ltd"


def test_address_match_is_exact(good: Path) -> None:
    """Addresses match exactly, case included; no match and no fallback gives None."""
    profiles = Profiles.load(good)
    assert profiles.for_deposit(2002, "0xabc0") is None
    assert profiles.for_deposit(None, None) is None
    assert Profiles.empty().for_deposit(1001, "TAddrOfAda") is None


def test_body_and_content_hash(good: Path, tmp_path: Path, entity_payer: ProfileFactory) -> None:
    """body() is the submission body; content_hash changes only when the profile changes."""
    profiles = Profiles.load(good)
    body = profiles.body("acme")
    assert body == entity_payer()
    assert profiles.content_hash("acme") == content_hash(body)
    changed = write(
        tmp_path,
        {"profiles": {"acme": entity_payer(walletLabel="New label"), "ada": {}}},
    )
    with pytest.raises(ConfigError):
        Profiles.load(changed)
    changed = write(tmp_path, {"profiles": {"acme": entity_payer(walletLabel="New label")}})
    reloaded = Profiles.load(changed)
    assert reloaded.content_hash("acme") != profiles.content_hash("acme")
    assert reloaded.file_hash != profiles.file_hash


def test_check_providers(good: Path) -> None:
    """Profiles whose provider the options list lacks are named; no provider is fine."""
    profiles = Profiles.load(good)
    assert profiles.check_providers(["Binance", "OKX"]) == []
    assert profiles.check_providers(["OKX"]) == ["acme"]


def test_bad_profile_names_profile_and_field_never_the_value(
    tmp_path: Path, entity_payer: ProfileFactory, individual_payer: ProfileFactory
) -> None:
    """Every problem names file, line, profile and field, and never repeats a value."""
    path = write(
        tmp_path,
        """
        profiles:
          acme:
            correspondentType: ENTITY
            fullName: Acme Trading Ltd
            countryCode: XQ
            companyAddress: 1 Raffles Place
            walletType: VASP
            walletLabel: Acme Trading Ltd hot wallet with a very long label text here
          ada:
            correspondentType: INDIVIDUAL
            firstName: Ada
            lastName: Lovelace
            birthday: "1990-02-30"
            residentialAddress: 12 St James
            countryCode: GB
            walletType: SELF_HOSTED
        """,
    )
    found = problems(path)
    assert found == [
        f"{path}:5: profile 'acme': countryCode is not an ISO 3166-1 alpha-2 code",
        f"{path}:2: profile 'acme': provider is mandatory when walletType is VASP",
        f"{path}:8: profile 'acme': walletLabel is longer than 50 characters",
        f"{path}:13: profile 'ada': birthday must be a real date in the format yyyy-MM-dd",
    ]
    text = "\n".join(found)
    for value in (*PERSONAL, "XQ", "1990-02-30", "very long"):
        assert value not in text


def test_unknown_profile_references_and_keys_all_at_once(
    tmp_path: Path, entity_payer: ProfileFactory
) -> None:
    """Unknown profiles in addresses and wallets, bad keys: every problem, each with its line."""
    path = write(
        tmp_path,
        """
        profiles:
          acme:
            correspondentType: ENTITY
            fullName: Acme Trading Ltd
            countryCode: SG
            companyAddress: 1 Raffles Place
            walletType: SELF_HOSTED
        addresses:
          TSomewhere: acme
          TElsewhere: acmee
          0xAbCdef0123456789abcdef0123456789abcdef01: acme
        wallets:
          1001: ghost
          main: acme
        walets: {}
        """,
    )
    assert problems(path) == [
        f"{path}:15: walets: unknown key (known: profiles, addresses, wallets)",
        f"{path}:10: addresses: unknown profile 'acmee' (known: acme)",
        f"{path}:11: addresses: an address must be a string (quote it in YAML)",
        f"{path}:13: wallets.1001: unknown profile 'ghost' (known: acme)",
        f"{path}:14: wallets: a key must be a walletId number",
    ]


ADA = """
profiles:
  ada:
    correspondentType: INDIVIDUAL
    firstName: Ada
    lastName: Lovelace
    birthday: BIRTHDAY
    residentialAddress: 12 St James
    countryCode: GB
    walletType: SELF_HOSTED
"""


@pytest.mark.parametrize("impossible", ["1990-02-30", "2024-13-45"])
def test_unquoted_birthday_reads_as_the_quoted_one(tmp_path: Path, impossible: str) -> None:
    """An unquoted birthday is the yyyy-MM-dd text a quoted one is: a real date gives the same
    body and hash, an impossible one the same birthday problem (not a crash)."""
    quoted = Profiles.load(write(tmp_path, ADA.replace("BIRTHDAY", '"1990-02-28"')))
    unquoted = Profiles.load(write(tmp_path, ADA.replace("BIRTHDAY", "1990-02-28")))
    assert unquoted.body("ada")["birthday"] == "1990-02-28"
    assert unquoted.body("ada") == quoted.body("ada")
    assert unquoted.content_hash("ada") == quoted.content_hash("ada")
    message = "profile 'ada': birthday must be a real date in the format yyyy-MM-dd"
    for text in (f'"{impossible}"', impossible):
        path = write(tmp_path, ADA.replace("BIRTHDAY", text))
        assert problems(path) == [f"{path}:6: {message}"]


def test_value_yaml_cannot_build_names_file_line_and_key_never_the_value(tmp_path: Path) -> None:
    """A value YAML parses but cannot build is a problem with its line and key, not a crash."""
    path = write(
        tmp_path,
        ADA.replace("BIRTHDAY", "!!timestamp 1990-02-30").replace("12 St James", "!!int St James"),
    )
    found = problems(path)
    assert found == [
        f"{path}:6: profiles.ada.birthday: invalid YAML: the value cannot be read as a date",
        f"{path}:7: profiles.ada.residentialAddress: invalid YAML: the value cannot be read as"
        " an integer",
    ]
    assert "1990" not in "".join(found) and "James" not in "".join(found)


def test_keys_that_read_the_same_are_given_twice(
    tmp_path: Path, entity_payer: ProfileFactory
) -> None:
    """Two keys YAML reads as one (1001 and 0x3E9) are a duplicate, not a silent override."""
    path = write(
        tmp_path,
        {"profiles": {"acme": entity_payer(), "acme2": entity_payer()}},
    )
    text = path.read_text() + "wallets:\n  1001: acme\n  0x3E9: acme2\n"
    path.write_text(text)
    line = len(text.splitlines())
    assert problems(path) == [
        f"{path}:{line}: key '0x3E9' is given twice (first at line {line - 1} as '1001')"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- acme\n", ":1: a profiles file must be a YAML mapping"),
        ("profiles: [a]\n", ":1: profiles: must be a mapping of profile name to payer details"),
        ("profiles:\n  acme: yes\n", ":2: profile 'acme': must be a mapping of payer details"),
        ("profiles: {a: {}}\nprofiles: {}\n", ":2: key 'profiles' is given twice"),
        ("profiles: {a: [\n", ":2: invalid YAML"),
    ],
)
def test_malformed_file(tmp_path: Path, text: str, expected: str) -> None:
    """A file that is not the expected shape is refused with its line."""
    path = write(tmp_path, text)
    assert problems(path)[0].startswith(f"{path}{expected}")


def test_missing_file(tmp_path: Path) -> None:
    """An unreadable profiles file names the path."""
    assert problems(tmp_path / "none.yaml")[0].startswith(f"{tmp_path}/none.yaml: cannot read")


def test_reprs_hide_contents(good: Path) -> None:
    """No repr or str of profiles, a profile or a match shows payer data."""
    profiles = Profiles.load(good)
    match = profiles.for_deposit(1001, "TAddrOfAda")
    shown = " ".join(
        [
            repr(profiles),
            str(profiles),
            repr(match),
            str(match),
            repr(profiles.get("acme")),
            str(profiles.get("ada")),
            repr(profiles.get("ada").details),
        ]
    )
    assert "ada" in shown and "acme" in shown
    for value in PERSONAL:
        assert value not in shown


def test_rules_may_only_name_existing_profiles(good: Path, tmp_path: Path) -> None:
    """A rule naming a stored profile loads; with profile_names from Profiles it is checked."""
    names = Profiles.load(good).names()
    rules = tmp_path / "r.yaml"
    rules.write_text(
        "wallet: 1\nrules:\n  - name: r\n    on: [needs_details]\n"
        "    then: [{submit_profile: {profile: ada}}]\n"
    )
    assert RuleBook.load(rules, profile_names=names, specs=SPECS).rulesets[0].rules[0].name == "r"
    with pytest.raises(ConfigError):
        RuleBook.load(rules, profile_names=Profiles.empty().names(), specs=SPECS)
