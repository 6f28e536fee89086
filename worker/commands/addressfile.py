"""Known source addresses registered in bulk: `depositd register-address --from-csv FILE`
(docs/commands.md, "Registering addresses from a CSV file").

The file has a header line naming its columns (`COLUMNS`; `memo` and `tx_hash` may be left
out) and one line per address and profile, the values `register-address` takes as options.
Every line is checked before anything is sent (`check_lines`): the walletId, the address and
the register form of its profile as `register-address` checks them, the network among those
depositd knows, the profile stored, the same address twice in the file, an address already
registered. Any wrong line and nothing is sent. Lines already registered with the same profile
are skipped, so a file can be run again after an interruption. Each line is then registered as
`register-address --no-wait` registers it (`worker.commands.registration.register_prepared`:
the same Idempotency-Key, the record kept in the addresses table), one after another within the
provider's request budget (docs/polling.md).

Payer details are personal data: a problem names the profile and the payer fields, never a
value.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.commands.registration import refusal, register_body, register_prepared
from worker.config.profiles import Profiles
from worker.config.settings import Settings
from worker.config.yamlkeys import known, suggest
from worker.errors import ConfigError, ProviderAuthError, ProviderError, ProviderUnavailable
from worker.provider.client import ProviderClient
from worker.provider.models import AddressStatus, SourceAddress
from worker.provider.payer import PayerValidationError, validate_payer
from worker.store.sqlitestore import Store

COLUMNS = ("wallet", "address", "network", "profile", "memo", "tx_hash")
REQUIRED = ("wallet", "address", "network", "profile")
# Records that hold the address for its wallet: registering it again would be a duplicate.
HOLDING = (AddressStatus.PROCESSING.value, AddressStatus.ACTIVE.value)


@dataclass(frozen=True)
class AddressLine:
    """One line of the file: its number and its values (stripped; None when left empty)."""

    number: int
    values: dict[str, str | None]
    extra: int = 0  # fields past the header's

    def get(self, column: str) -> str:
        """The value of a column, "" when empty or absent."""
        return self.values.get(column) or ""


@dataclass(frozen=True)
class Registered:
    """A row of the addresses table as the checks read it."""

    id: str
    wallet_id: int | None
    wallet_address: str | None
    network: str | None
    status: str
    profile: str | None


@dataclass
class Verdict:
    """What the checks say of one line: its problems, else the register body; `registered`:
    the record that already holds its address with its profile (the line is skipped)."""

    line: AddressLine
    problems: list[str] = field(default_factory=list)
    body: dict[str, Any] | None = None
    registered: Registered | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """What one registration is: wallet, address, network."""
        return (self.line.get("wallet"), self.line.get("address"), self.line.get("network"))

    def describe(self) -> str:
        """`ADDRESS on NETWORK into wallet W with profile P` (no payer value)."""
        wallet, address, network = self.key
        return (
            f"{address} on {network} into wallet {wallet} with profile {self.line.get('profile')}"
        )


def read_csv(path: Path) -> list[AddressLine]:
    """The lines of the file; `ConfigError` naming the file (and line) when it cannot be read
    as one: unreadable, not UTF-8, no header, a column unknown, missing or named twice, no
    line."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the file: {exc.strerror}"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: the file is not UTF-8 text"]) from None
    rows = _rows(text, path)
    header = next(rows, None)
    if header is None:
        raise ConfigError([f"{path}:1: the file is empty: it needs a header line ({_columns()})"])
    number, names = header
    names = [n.strip() for n in names]
    problems = [
        f"{path}:{number}: unknown column {n!r} {known(COLUMNS)}{suggest(n, COLUMNS)}"
        for n in names
        if n not in COLUMNS
    ]
    problems += [f"{path}:{number}: column {n!r} is named twice" for n in _twice(names)]
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        problems.append(
            f"{path}:{number}: the header line has no {', '.join(missing)} column"
            f" (the header names the columns: {_columns()})"
        )
    if problems:
        raise ConfigError(problems)
    lines = []
    for number, fields in rows:
        values = {
            n: (fields[i].strip() or None) if i < len(fields) else None for i, n in enumerate(names)
        }
        lines.append(AddressLine(number, values, extra=max(0, len(fields) - len(names))))
    if not lines:
        raise ConfigError([f"{path}: no line after the header: nothing to register"])
    return lines


def _rows(text: str, path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number where the record starts, fields) of each record, blank lines left out."""
    reader = csv.reader(text.splitlines(keepends=True))
    start = 1
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # a field past the csv module's limit, a stray quote...
            raise ConfigError([f"{path}:{reader.line_num}: {exc}"]) from None
        if any(f.strip() for f in fields):
            yield start, fields
        start = reader.line_num + 1


def _twice(names: Sequence[str]) -> list[str]:
    return sorted({n for n in names if names.count(n) > 1})


def _columns() -> str:
    return ", ".join(COLUMNS[:4]) + ", and optionally " + " and ".join(COLUMNS[4:])


def check_lines(
    lines: Sequence[AddressLine],
    profiles: Profiles,
    *,
    known_networks: Collection[str],
    registered: Sequence[Registered],
) -> list[Verdict]:
    """Every line's verdict: all its problems at once, or the register body it sends."""
    names = sorted(profiles.names())
    first: dict[tuple[str, str, str], int] = {}
    verdicts = []
    for line in lines:
        verdict = Verdict(line)
        _check_fields(verdict, names, known_networks)
        if not verdict.problems:
            verdict.body = _body(verdict, profiles)
        seen = first.setdefault(verdict.key, line.number)
        if seen != line.number:
            verdict.problems.append(f"the same address, network and wallet as line {seen}")
        elif not verdict.problems:
            _check_registered(verdict, registered)
        verdicts.append(verdict)
    return verdicts


def _check_fields(verdict: Verdict, names: Sequence[str], known_networks: Collection[str]) -> None:
    line, problems = verdict.line, verdict.problems
    if line.extra:
        problems.append(f"{line.extra} more field(s) than the header names")
    for column in REQUIRED:
        if not line.get(column):
            problems.append(f"{column} is empty")
    wallet = line.get("wallet")
    if wallet and not (
        wallet.isascii() and wallet.isdigit() and len(wallet) <= 18 and int(wallet) > 0
    ):
        problems.append(f"wallet must be a walletId (a positive whole number), not {wallet!r}")
    network = line.get("network")
    if network and network not in known_networks:
        hint = suggest(network, known_networks)
        problems.append(
            f"network {network!r} is not one depositd knows or has seen in a deposit or a"
            f" registered address{hint} (register-address --network takes it alone)"
        )
    profile = line.get("profile")
    if profile and profile not in names:
        problems.append(
            f"no profile named {profile!r} {known(names or ['none'])}{suggest(profile, names)}"
        )


def _body(verdict: Verdict, profiles: Profiles) -> dict[str, Any] | None:
    """The register body of a line whose fields are right, checked as `register-address`
    checks it (the payer's register form); None after recording its problem."""
    line, name = verdict.line, verdict.line.get("profile")
    body = register_body(
        profiles.body(name),
        wallet_id=int(line.get("wallet")),
        address=line.get("address"),
        network=line.get("network"),
        memo=line.values.get("memo"),
        tx_hash=line.values.get("tx_hash"),
    )
    try:
        validate_payer(body, form="register")
    except PayerValidationError as exc:
        fields = ", ".join(dict.fromkeys(p.field for p in exc.problems))
        verdict.problems.append(f"profile {name!r} cannot register an address: {fields}")
        return None
    return body


def _check_registered(verdict: Verdict, registered: Sequence[Registered]) -> None:
    """An address already held (PROCESSING or ACTIVE) for its wallet: skipped when with the
    line's profile, wrong with another; one whose registration FAILED is wrong (it is
    registered again with `--replace-failed`, one at a time)."""
    wallet, address, network = verdict.key
    profile = verdict.line.get("profile")
    for row in registered:
        if (row.wallet_address, row.network) != (address, network):
            continue
        if row.wallet_id is not None and str(row.wallet_id) != wallet:
            continue
        if row.status in HOLDING:
            if row.profile in (None, profile):
                verdict.registered = row
            else:
                verdict.problems.append(
                    f"already registered as {row.id} ({row.status}) with profile {row.profile}"
                )
            return
        if row.status == AddressStatus.FAILED.value:
            verdict.problems.append(
                f"its registration {row.id} FAILED: register it again with"
                " `depositd register-address ... --replace-failed`"
            )
            return


Report = Callable[[Verdict, SourceAddress | None, str | None], None]


async def register_lines(
    settings: Settings,
    client: ProviderClient,
    store: Store,
    verdicts: Sequence[Verdict],
    *,
    report: Report,
) -> int:
    """Register each line to send, one after another within the provider's request budget;
    `report(verdict, record, error)` after each; returns how many failed (a refusal, a record
    FAILED, or a line not sent after the provider stopped answering)."""
    failed = 0
    stopped: str | None = None
    # The budget's tokens, as the polls take them: a long file is sent at
    # `provider.max_requests_per_s` and waits out the provider's rate limit.
    paced = client.for_polls()
    for verdict in verdicts:
        if verdict.body is None or verdict.registered is not None:
            continue
        if stopped is not None:
            report(verdict, None, f"not sent: {stopped}")
            failed += 1
            continue
        try:
            record = await register_prepared(
                settings,
                paced,
                store,
                verdict.body,
                profile=verdict.line.get("profile"),
                wait=False,
                say=lambda _: None,
            )
        except ProviderError as exc:
            failed += 1
            report(verdict, None, refusal(exc, verdict.body))
            if isinstance(exc, ProviderAuthError | ProviderUnavailable):
                stopped = f"the provider stopped at line {verdict.line.number}"
            continue
        failed += record.status is AddressStatus.FAILED
        report(verdict, record, None)
    return failed
