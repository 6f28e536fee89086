"""Payer profiles (docs/rules.md): stored payer details, picked by source address or wallet.

The file has three optional mappings: `profiles` (name -> payer details), `addresses` (source
address -> profile name, exact match, case kept) and `wallets` (walletId -> fallback profile
name). Every profile is validated at load as a submission body. Profiles are personal data:
errors name the profile and the field, never a value, and no repr shows any contents.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from worker.config.yamlkeys import duplicate_keys
from worker.config.yamlkeys import known as known_list
from worker.config.yamlsrc import YamlSource, yaml_error
from worker.config.yamlsrc import loads as parse_yaml
from worker.errors import ConfigError
from worker.provider import canonical
from worker.provider.payer import (
    PayerDetails,
    PayerValidationError,
    content_hash,
    validate_payer,
)

TOP_KEYS = ("profiles", "addresses", "wallets")


@dataclass(frozen=True, repr=False)
class Profile:
    """One named profile; `details` are validated payer details for a submission."""

    name: str
    details: PayerDetails = field(compare=False)

    def __repr__(self) -> str:
        return f"Profile(name={self.name!r})"

    __str__ = __repr__


@dataclass(frozen=True, repr=False)
class ProfileMatch:
    """The profile that applies to a deposit, and how it was found."""

    name: str
    details: PayerDetails = field(compare=False)
    via: Literal["address", "wallet"]

    def __repr__(self) -> str:
        return f"ProfileMatch(name={self.name!r}, via={self.via!r})"

    __str__ = __repr__


def _hide_value(message: str, value: Any) -> str:
    """Drop a quoted value from a payer message: errors name the field, never its value."""
    if isinstance(value, str) and value:
        for form in (f": {value!r}", f" {value!r}", repr(value)):
            message = message.replace(form, "")
    return message


class _Reader:
    def __init__(self, src: YamlSource, problems: list[str]) -> None:
        self.src = src
        self.problems = problems

    def bad(self, loc: tuple[str | int, ...], label: str, message: str) -> None:
        self.problems.append(f"{self.src.where(loc)}: {label}: {message}")

    def profiles(self, value: Any) -> dict[str, Profile]:
        out: dict[str, Profile] = {}
        if value is None:
            return out
        if not isinstance(value, dict):
            self.bad(
                ("profiles",), "profiles", "must be a mapping of profile name to payer details"
            )
            return out
        for name, data in value.items():
            loc = ("profiles", name)
            if not isinstance(name, str) or not name.strip():
                self.bad(loc, "profiles", "a profile name must be a non-empty string")
                continue
            if not isinstance(data, dict):
                self.bad(loc, f"profile {name!r}", "must be a mapping of payer details")
                continue
            try:
                details = validate_payer(data, form="submit")
            except PayerValidationError as exc:
                for problem in exc.problems:
                    message = _hide_value(problem.message, data.get(problem.field))
                    label = f"profile {name!r}"
                    if not message.startswith(problem.field):
                        label += f" field {problem.field}"
                    self.bad((*loc, problem.field), label, message)
                continue
            out[name] = Profile(name, details)
        return out

    def refs(self, section: str, value: Any, names: Collection[str]) -> dict[Any, str]:
        """`addresses` or `wallets`: key -> profile name, every name checked."""
        out: dict[Any, str] = {}
        if value is None:
            return out
        if not isinstance(value, dict):
            self.bad((section,), section, "must be a mapping to profile names")
            return out
        for key, name in value.items():
            loc = (section, key)
            if section == "addresses" and not isinstance(key, str):
                # Unquoted 0x... is read by YAML as a number and would lose its case and zeros.
                self.bad(loc, section, "an address must be a string (quote it in YAML)")
                continue
            if section == "wallets" and (isinstance(key, bool) or not isinstance(key, int)):
                self.bad(loc, section, "a key must be a walletId number")
                continue
            if section == "addresses":
                # In the form deposits hold it (`worker.provider.canonical`): trimmed, its case
                # kept; a key that is blanks only names no address.
                key = canonical.address(key)
                if key is None:
                    self.bad(loc, section, "an address must not be empty")
                    continue
            label = f"{section}.{key}" if section == "wallets" else section
            if not isinstance(name, str) or name not in names:
                self.bad(
                    loc, label, f"unknown profile {name!r} {known_list(sorted(names) or ['none'])}"
                )
                continue
            out[key] = name
        return out


class Profiles:
    """The loaded profiles file: look-ups by source address then walletId."""

    def __init__(
        self,
        profiles: Mapping[str, Profile],
        addresses: Mapping[str, str],
        wallets: Mapping[int, str],
        *,
        path: Path | None = None,
        file_hash: str = "",
        lines: Mapping[str, int] | None = None,
        wallet_lines: Mapping[int, int] | None = None,
    ) -> None:
        self._profiles = dict(profiles)
        self._wallet_lines = dict(wallet_lines or {})  # walletId -> line of its `wallets:` key
        self._lines = dict(lines or {})  # profile name -> line of its `provider` (else itself)
        self._addresses = dict(addresses)
        self._wallets = dict(wallets)
        self.path = path
        self.file_hash = file_hash

    def __repr__(self) -> str:
        return (
            f"Profiles({len(self._profiles)} profile(s), {len(self._addresses)} address(es), "
            f"{len(self._wallets)} wallet(s), file={self.path})"
        )

    __str__ = __repr__

    @classmethod
    def empty(cls) -> Profiles:
        """No profiles: every deposit is `profile: missing`."""
        return cls({}, {}, {})

    @classmethod
    def load(cls, path: Path) -> Profiles:
        """Read and validate a profiles file; `ConfigError` lists every problem (file:line)."""
        try:
            raw = path.read_bytes()
            text = raw.decode("utf-8")
        except OSError as exc:
            raise ConfigError([f"{path}: cannot read profiles: {exc.strerror}"]) from None
        except UnicodeDecodeError:
            raise ConfigError([f"{path}:1: profiles file is not UTF-8 text"]) from None
        try:
            src = parse_yaml(text, path)
        except yaml.YAMLError as exc:
            raise ConfigError([yaml_error(path, exc)]) from None
        if not isinstance(src.data, dict):
            raise ConfigError(
                [
                    f"{path}:1: a profiles file must be a YAML mapping with profiles:, addresses:"
                    " and wallets:"
                ]
            )
        problems = duplicate_keys(src)
        reader = _Reader(src, problems)
        for key in src.data:
            if key not in TOP_KEYS:
                reader.bad((key,), str(key), f"unknown key {known_list(TOP_KEYS)}")
        profiles = reader.profiles(src.data.get("profiles"))
        # Names of invalid profiles still count, so one bad profile gives one problem, not three.
        raw_profiles = src.data.get("profiles")
        names = set(raw_profiles) if isinstance(raw_profiles, dict) else set()
        addresses = reader.refs("addresses", src.data.get("addresses"), names)
        wallets = reader.refs("wallets", src.data.get("wallets"), names)
        if problems:
            raise ConfigError(problems)
        digest = hashlib.sha256(raw).hexdigest()
        lines = {name: src.line(("profiles", name, "provider")) for name in profiles}
        wallet_lines = {key: src.line(("wallets", key)) for key in wallets}
        return cls(
            profiles,
            addresses,
            wallets,
            path=path,
            file_hash=digest,
            lines=lines,
            wallet_lines=wallet_lines,
        )

    def names(self) -> set[str]:
        """Every profile name."""
        return set(self._profiles)

    def get(self, name: str) -> Profile:
        """The profile called `name` (KeyError if there is none)."""
        return self._profiles[name]

    def for_deposit(self, wallet_id: int | None, from_address: str | None) -> ProfileMatch | None:
        """The profile for a deposit: its source address first, then its wallet's fallback."""
        if from_address is not None and from_address in self._addresses:
            name = self._addresses[from_address]
            return ProfileMatch(name, self._profiles[name].details, "address")
        if wallet_id is not None and wallet_id in self._wallets:
            name = self._wallets[wallet_id]
            return ProfileMatch(name, self._profiles[name].details, "wallet")
        return None

    def body(self, name: str) -> dict[str, Any]:
        """The submission body of a profile."""
        return self._profiles[name].details.to_body()

    def content_hash(self, name: str) -> str:
        """A stable hash of a profile's body: a new one means a corrected profile."""
        return content_hash(self.body(name))

    def in_force(self) -> dict[str, Any]:
        """What decides which details are sent, as the rules hash covers it
        (`worker.rules.fingerprint`): each profile's content hash, and the profile each source
        address and walletId takes. Hashes and names only, never a value."""
        return {
            "profiles": {name: self.content_hash(name) for name in sorted(self._profiles)},
            "addresses": dict(sorted(self._addresses.items())),
            "wallets": {str(key): name for key, name in sorted(self._wallets.items())},
        }

    def provider_problems(self, offered: Collection[str]) -> list[str]:
        """`file:line: profile 'x': ...` for each profile whose provider is not offered, with the
        offered names closest to it first (the profile's own value is not repeated)."""
        problems = []
        for name in self.check_providers(offered):
            wrong = self._profiles[name].details.provider or ""
            ranked = sorted(
                offered,
                key=lambda o: -difflib.SequenceMatcher(None, wrong.lower(), o.lower()).ratio(),
            )
            where = f"{self.path}:{self._lines.get(name, 1)}"
            problems.append(
                f"{where}: profile {name!r}: provider is not one the provider offers; give one"
                f" of (closest first): {', '.join(ranked)}"
            )
        return problems

    def wallet_fallbacks(self) -> list[tuple[int, str, int]]:
        """(walletId, profile name, line) of each `wallets:` fallback, in walletId order."""
        return [
            (wallet_id, name, self._wallet_lines.get(wallet_id, 1))
            for wallet_id, name in sorted(self._wallets.items())
        ]

    def check_providers(self, known: Collection[str]) -> list[str]:
        """Names of profiles whose `provider` is not in the options endpoint's list."""
        return sorted(
            name
            for name, profile in self._profiles.items()
            if profile.details.provider is not None and profile.details.provider not in known
        )
