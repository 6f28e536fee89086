"""`depositd register-address`: the known-address flow, one address from its options or many
from a CSV file (`--from-csv`); imported when the command runs."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from worker.commands.addressfile import Registered, Verdict, check_lines, read_csv, register_lines
from worker.commands.dbopen import NoDatabase, open_db
from worker.config.profiles import Profiles
from worker.config.settings import Settings, load_settings
from worker.errors import ConfigError, DepositdError
from worker.logs import configure
from worker.provider.client import ProviderClient
from worker.provider.models import AddressStatus, SourceAddress
from worker.provider.networks import KNOWN_NETWORKS
from worker.store import addresses, deposits
from worker.store.writelock import command_store

# The options of one address: given with --from-csv they are a mistake (the file has them).
ONE_ADDRESS = ("wallet", "address", "network", "profile", "tx_hash", "memo")
ONE_ADDRESS_FLAGS = ("replace_failed", "no_wait")


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def run(args: argparse.Namespace) -> int:
    """Register a known source address with the provider (`worker.commands.registration`), or every
    line of a CSV file (`worker.commands.addressfile`)."""
    if args.from_csv is not None:
        given = [d for d in ONE_ADDRESS if getattr(args, d) is not None]
        given += [d for d in ONE_ADDRESS_FLAGS if getattr(args, d)]
        if given:
            options = ", ".join(_option(d) for d in given)
            raise ConfigError(
                [f"register-address: --from-csv takes every address from the file, not {options}"]
            )
        return run_from_csv(args)
    if args.dry_run:
        raise ConfigError(["register-address: --dry-run goes with --from-csv FILE"])
    missing = [_option(d) for d in ONE_ADDRESS[:4] if getattr(args, d) is None]
    if missing:
        raise ConfigError(
            [f"register-address: {', '.join(missing)} needed (or --from-csv FILE for many)"]
        )
    from worker.commands.registration import run as register

    return register(args)


def run_from_csv(args: argparse.Namespace) -> int:
    """`depositd register-address --from-csv FILE [--dry-run]` (docs/commands.md): every line
    checked, then (unless any is wrong, or `--dry-run`) registered, each reported by its line."""
    settings = load_settings(args.config)
    configure(settings.log.format, settings.log.level)  # logs to stderr; stdout: the lines
    path = Path(args.from_csv)
    lines = read_csv(path)
    if settings.profiles is None:
        raise ConfigError(
            [f"{settings.config_path}: profiles: not set, so no profile a line names exists"]
        )
    profiles = Profiles.load(settings.profiles)
    unknown = sorted({ln.get("network") for ln in lines} - set(KNOWN_NETWORKS) - {""})
    registered, seen = _read_database(args, settings, unknown)
    verdicts = check_lines(
        lines, profiles, known_networks={*KNOWN_NETWORKS, *seen}, registered=registered
    )
    wrong = [v for v in verdicts if v.problems]
    for verdict in wrong:
        print(f"{path}:{verdict.line.number}: {'; '.join(verdict.problems)}", file=sys.stderr)
    if wrong:
        print(
            f"depositd: nothing registered: {len(wrong)} of {len(verdicts)} lines are wrong",
            file=sys.stderr,
        )
        return 2
    sending = [v for v in verdicts if v.registered is None]
    for verdict in verdicts:
        where = f"{path}:{verdict.line.number}"
        if verdict.registered is not None:
            row = verdict.registered
            print(f"{where}: already registered as {row.id} ({row.status}); skipped")
        elif args.dry_run:
            print(f"{where}: would register {verdict.describe()}")
    if args.dry_run:
        print(
            f"depositd: dry run: {len(sending)} to register, {len(verdicts) - len(sending)}"
            " already registered; nothing sent",
            file=sys.stderr,
        )
        return 0
    return asyncio.run(_send(settings, path, verdicts))


def _read_database(
    args: argparse.Namespace, settings: Settings, networks: list[str]
) -> tuple[list[Registered], set[str]]:
    """The addresses registered, and which of `networks` a deposit or a registered address is
    on; nothing when there is no database yet (read-only: a refused file changes nothing)."""
    try:
        with open_db(args, readonly=True, settings=settings) as conn:
            rows = addresses.list_addresses(conn)
            registered = [
                Registered(
                    id=str(r["id"]),
                    wallet_id=r["wallet_id"],
                    wallet_address=r["wallet_address"],
                    network=r["network"],
                    status=str(r["status"]),
                    profile=r["profile"],
                )
                for r in rows
            ]
            seen = addresses.networks_among(conn, networks) | deposits.networks_among(
                conn, networks
            )
            return registered, seen
    except NoDatabase:
        return [], set()


async def _send(settings: Settings, path: Path, lines: list[Verdict]) -> int:
    """Register the lines to send; each reported on stdout (stderr when it failed)."""
    done: list[int] = []

    def report(verdict: Verdict, record: SourceAddress | None, error: str | None) -> None:
        where = f"{path}:{verdict.line.number}"
        if record is None:
            print(f"{where}: {error}", file=sys.stderr)
            return
        done.append(verdict.line.number)
        out = sys.stderr if record.status is AddressStatus.FAILED else sys.stdout
        status = record.status.value
        print(f"{where}: registered {verdict.describe()}: {record.id} {status}", file=out)

    try:
        async with (
            command_store(settings.storage) as store,
            ProviderClient.from_settings(settings.provider) as client,
        ):
            failed = await register_lines(settings, client, store, lines, report=report)
    except DepositdError as exc:
        print(f"depositd: {exc}; {len(done)} line(s) registered before it", file=sys.stderr)
        return 1
    skipped = sum(v.registered is not None for v in lines)
    print(
        f"depositd: {len(done)} registered, {skipped} already registered, {failed} failed",
        file=sys.stderr,
    )
    return 1 if failed else 0
