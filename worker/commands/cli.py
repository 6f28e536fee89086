"""The `depositd` command line (docs/commands.md).

Exit status: 0 success, 2 bad usage or bad configuration, 1 other failure. Each command is a
`run(args) -> int` function in the module that holds its subject; this module only parses.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from worker import __version__
from worker.dev import sandboxctl
from worker.errors import ConfigError, DepositdError

# command -> "module:function" that runs it. The module is imported only when its command runs,
# so `--help` and a quick command such as `status` load no more than they use (nothing here
# imports aiohttp, pydantic or the rule engine; tests/commands/test_cli_imports.py holds it).
# One line per command.
COMMANDS: dict[str, str] = {
    "serve": "worker.commands.serve:run",
    "check": "worker.commands.check:run",
    "rules": "worker.commands.rules:run",
    "ledger": "worker.commands.read:run_ledger",
    "deposits": "worker.commands.read:run_deposits",
    "events": "worker.commands.read:run_events",
    "addresses": "worker.commands.read:run_addresses",
    "orders": "worker.commands.orders:run",
    "replay": "worker.commands.ops:run_replay",
    "retry-failed": "worker.commands.ops:run_retry_failed",
    "resolve": "worker.commands.resolve:run",
    "submit": "worker.commands.submit:run",
    "backup": "worker.commands.ops:run_backup",
    "status": "worker.commands.ops:run_status",
    "register-address": "worker.commands.addresses:run",
    "backfill": "worker.commands.backfill:run",
    "reconcile": "worker.commands.money:run_reconcile",
    "abnormal": "worker.commands.money:run_abnormal",
    "sandbox": "worker.dev.commands:run_sandbox",
    "demo": "worker.dev.commands:run_demo",
    "init": "worker.commands.init:run",
    "selftest": "worker.commands.selftest:run",
    "schema": "worker.commands.schema:run",
    "migrate-store": "worker.commands.migrate:run",
    "verify": "worker.commands.verify:run",
    "evidence": "worker.commands.evidence:run_evidence",
    "verify-evidence": "worker.commands.evidence:run_verify_evidence",
}


def command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs a command, its module imported now."""
    module, _, function = COMMANDS[name].partition(":")
    run: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), function)
    return run


# The tracked states (worker.track.tracker.State), listed here so that parsing imports no model.
STATES = (
    "processing",
    "needs_details",
    "submitted",
    "rejected",
    "credited",
    "completed",
    "blocked",
    "failed",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    config_help = "configuration file (default: $DEPOSITD_CONFIG, else ./depositd.yaml)"
    # `--config` goes before or after the command (`depositd --config X status`, `depositd
    # status --config X`). Only the top level has a default (None): a subcommand's own default
    # would overwrite a value given before it, as would a nested one in `rules --config X test`.
    common = _Parser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help=config_help)
    nested = _Parser(add_help=False)
    nested.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help="as above")
    parser = _Parser(prog="depositd", description="Travel Rule deposit worker")
    parser.add_argument("--version", action="version", version=f"depositd {__version__}")
    parser.add_argument("--config", metavar="PATH", default=None, help=config_help)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("serve", parents=[common], help="run ingress, processor and scheduler")
    p = sub.add_parser("check", parents=[common], help="validate config, rules and profiles")
    p.add_argument("--online", action="store_true", help="also check provider names online")

    p = sub.add_parser("rules", parents=[common], help="rule tools")
    rules_sub = p.add_subparsers(dest="rules_command", required=True, parser_class=_Parser)
    t = rules_sub.add_parser("test", parents=[nested], help="dry-run rules against an event")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "event_file",
        nargs="?",
        metavar="EVENT.json",
        help="a webhook body as the provider posts it (a JSON file), or the name of an example"
        " that ships in rules/events/: needs_details, rejected, submitted, credited, completed,"
        " blocked, failed, order_updated",
    )
    src.add_argument("--event", metavar="EVENT_ID", help="a stored event, by its eventId")

    json_help = "one JSON object per line instead of a table"
    p = sub.add_parser("ledger", parents=[common], help="print booked deposits")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("--since", metavar="ISO", help="only entries booked at or after this time")

    states = list(STATES)
    p = sub.add_parser("deposits", parents=[common], help="print tracked deposits")
    p.add_argument(
        "--state",
        type=_state,
        choices=states,
        metavar="STATE",
        help=f"only this state: {', '.join(states)}",
    )
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("transaction_id", nargs="?", help="show one deposit with its history")

    p = sub.add_parser("events", parents=[common], help="print stored webhook events")
    p.add_argument("--failed", action="store_true", help="failed events, actions and alerts")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument(
        "--type",
        metavar="TYPE",
        action="append",
        help="only this eventType (repeat for several), e.g. DEPOSIT_WHITELIST_REQUIRED",
    )
    p.add_argument("--since", metavar="ISO", help="only events received at or after this time")
    p.add_argument("--limit", type=_positive, metavar="N", help="only the last N events")
    p.add_argument(
        "--follow",
        action="store_true",
        help="then print new events as they are stored (checked every second) until Ctrl-C",
    )

    p = sub.add_parser("addresses", parents=[common], help="print registered source addresses")
    p.add_argument("--json", action="store_true", help=json_help)

    p = sub.add_parser("orders", parents=[common], help="print stable, collection, transfer orders")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument(
        "--kind", choices=("stable", "collect", "transfer"), help="only orders of this kind"
    )

    p = sub.add_parser("replay", parents=[common], help="re-run one stored event")
    p.add_argument("event_id", metavar="EVENT_ID", help="the stored event's eventId")
    sub.add_parser("retry-failed", parents=[common], help="re-run failed events and actions")
    p = sub.add_parser(
        "resolve", parents=[common], help="show or decide a deposit's fixed-field conflicts"
    )
    p.add_argument("transaction_id", metavar="TX", help="the deposit's transactionId")
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="the decided value of a field in conflict (amount, walletId, currency, network,"
        " fromAddress, toAddress); repeat for each",
    )
    p.add_argument("--by", metavar="NAME", help="who decides (recorded)")
    p.add_argument("--note", metavar="TEXT", help="why (recorded)")
    _submit(sub, common)
    p = sub.add_parser("backup", parents=[common], help="consistent online copy of the database")
    p.add_argument("path", metavar="PATH", help="file to write (not the database itself)")
    sub.add_parser("status", parents=[common], help="state of the running service")
    _migrate_store(sub, common)
    _register_address(sub, common)
    _evidence(sub, common)

    p = sub.add_parser(
        "backfill", parents=[common], help="read the full history of a window into the tracker"
    )
    p.add_argument(
        "--since", required=True, metavar="ISO", help="start of the window (ISO 8601, UTC)"
    )
    p.add_argument("--until", metavar="ISO", help="default: now")
    p.add_argument("--wallet", type=int, metavar="ID", help="only this wallet's history")

    p = sub.add_parser(
        "reconcile",
        parents=[common],
        help="compare the ledger with the provider's daily settlement report (exit 3: findings)",
    )
    p.add_argument("--date", metavar="YYYY-MM-DD", help="the day (default: yesterday, UTC)")
    p.add_argument("--json", action="store_true", help="one JSON object per finding and line")
    p.add_argument("--ack", type=int, metavar="ID", help="acknowledge the finding with this id")
    p.add_argument("--by", metavar="NAME", help="who acknowledges (with --ack)")
    p.add_argument("--note", metavar="TEXT", help="why (with --ack)")
    p = sub.add_parser("abnormal", parents=[common], help="abnormal funds seen at the provider")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    _verify(sub, common)

    _sandbox(sub, common)

    p = sub.add_parser("demo", parents=[common], help="sandbox + worker scripted scenarios")
    p.add_argument("--keep", metavar="DIR", help="keep the demo's files in DIR")
    p = sub.add_parser("init", help="write a working local setup into a folder")
    p.add_argument(
        "--sandbox",
        required=True,
        metavar="DIR",
        help="folder for a setup against the local provider sandbox (created; must be empty)",
    )
    p = sub.add_parser(
        "selftest", parents=[common], help="send a signed test event through the public URL"
    )
    p.add_argument("--url", required=True, help="the public webhook URL the provider posts to")
    p = sub.add_parser("schema", parents=[common], help="print a file kind's JSON Schema")
    p.add_argument(
        "kind",
        choices=("config", "rules", "profiles"),
        help="depositd.yaml, a rule file or a profiles file",
    )
    return parser


def _register_address(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "register-address",
        parents=[common],
        help="register a source address (or a CSV file of them)",
    )
    p.add_argument("--wallet", type=int, metavar="ID", help="walletId it pays into")
    p.add_argument("--address", metavar="ADDR", help="the source address")
    p.add_argument("--network", metavar="NET", help="its network, e.g. TRON")
    p.add_argument("--profile", metavar="NAME", help="payer profile to register")
    p.add_argument("--tx-hash", metavar="H", help="hash of a deposit already sent from it")
    p.add_argument("--memo", metavar="M", help="memo or tag, on networks that use one")
    p.add_argument(
        "--replace-failed",
        action="store_true",
        help="register again an address whose last registration FAILED",
    )
    p.add_argument("--no-wait", action="store_true", help="do not poll until ACTIVE or FAILED")
    p.add_argument(
        "--from-csv",
        metavar="FILE",
        help="register every line of a CSV file (header: wallet,address,network,profile"
        "[,memo][,tx_hash]); nothing is sent when any line is wrong",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="with --from-csv: check and report, send nothing"
    )


def _verify(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "verify",
        parents=[common],
        help="check the journal and the rows it describes (exit 3: something does not verify)",
    )
    p.add_argument(
        "--anchor",
        metavar="SEQ:HASH",
        help="also prove the journal unchanged up to this head, kept outside the database",
    )
    p.add_argument("--head", action="store_true", help="print the journal's head, SEQ HASH")
    p.add_argument("--json", action="store_true", help="the outcome as one JSON object")


def _evidence(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "evidence",
        parents=[common],
        help="write everything about one deposit, with its journal proof, to one file",
    )
    p.add_argument("transaction_id", metavar="TX", help="the deposit's transactionId")
    p.add_argument("--out", required=True, metavar="FILE", help="the file to write (JSON)")
    p.add_argument("--by", required=True, metavar="NAME", help="who writes it (recorded)")
    p.add_argument(
        "--with-personal-data",
        action="store_true",
        help="include the payer values each submission sent (journaled as an export)",
    )
    p = sub.add_parser(
        "verify-evidence",
        parents=[common],
        help="check an evidence file on its own (exit 3: it does not verify)",
    )
    p.add_argument("file", metavar="FILE", help="a file `depositd evidence` wrote")
    p.add_argument(
        "--anchor",
        metavar="SEQ:HASH",
        help="a journal head kept outside the database: check the proof's chain passes it",
    )


def _submit(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "submit",
        parents=[common],
        help="submit a stored payer profile for a deposit waiting for details (recorded)",
    )
    p.add_argument("transaction_id", metavar="TX", help="the deposit's transactionId")
    p.add_argument("--profile", required=True, metavar="NAME", help="the stored profile's name")
    p.add_argument("--by", required=True, metavar="WHO", help="who submits (recorded)")
    p.add_argument("--note", metavar="TEXT", help="why (recorded)")
    p.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="S",
        help="wait this long for the running service's outcome (default 30; 0: do not wait)",
    )


def _sandbox(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("sandbox", parents=[common], help="run the provider sandbox")
    p.add_argument(
        "--port", type=_port, metavar="N", help="listen on this port (default: provider.base_url's)"
    )
    p.add_argument("--state", metavar="FILE", help="keep sandbox state in this SQLite file")
    p.add_argument(
        "--auto-review",
        action="store_true",
        help="pass every submission and address registration review 2 s after it arrives",
    )
    actions = p.add_subparsers(
        dest="sandbox_command",
        parser_class=_Parser,
        metavar="VERB",
        help="optional: without it the sandbox runs until SIGINT or SIGTERM; with it, one"
        " control call to the running sandbox (docs/sandbox.md)",
    )
    sandboxctl.add_verbs(actions, common)


def _state(text: str) -> str:
    """A tracked state's name (argparse type; the error names the known ones)."""
    if text not in STATES:
        raise argparse.ArgumentTypeError(f"unknown state {text!r} (known: {', '.join(STATES)})")
    return text


def _positive(text: str) -> int:
    """A whole number of at least 1 (argparse type)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of at least 1: {text!r}")
    return int(text)


def _port(text: str) -> int:
    """A TCP port number (argparse type: anything else is a usage error, exit 2)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (1-65535): {text!r}")
    return port


def _log_to_stderr() -> None:
    """Log lines go to stderr at warning, never into a command's output (serve sets its own
    from config): now if logging is loaded, else when it is (`worker.logdefault`)."""
    if "worker.logs" in sys.modules:
        from worker.logs import configure

        configure(None, "warning")
    else:
        from worker import logdefault

        logdefault.requested = (None, "warning")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `depositd` and `python -m worker`."""
    args = build_parser().parse_args(argv)
    try:
        _log_to_stderr()
        result: int = command(args.command)(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 2
    except DepositdError as exc:
        print(f"depositd: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into e.g. `head`, which stopped reading: not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return result


def _migrate_store(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "migrate-store",
        parents=[common],
        help="copy the database into an empty one of the other engine (service stopped)",
    )
    p.add_argument(
        "--to",
        required=True,
        metavar="URL|PATH",
        help="a postgresql:// URL (from SQLite), or a SQLite file (from PostgreSQL)",
    )
    p.add_argument(
        "--password-file",
        metavar="FILE",
        help="the URL's password: a file, or the name of a credential the unit loads"
        " (with depositctl); else libpq's PGPASSWORD or PGPASSFILE",
    )
