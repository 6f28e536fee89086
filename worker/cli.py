"""The `depositd` command line (SPEC section 3).

Exit status: 0 success, 2 bad usage or bad configuration, 1 other failure. Each command is a
`run(args) -> int` function in the module that holds its subject; this module only parses.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from worker import __version__
from worker.errors import ConfigError, DepositdError
from worker.logs import configure

# command -> "module:function"; modules are imported only when their command runs.
COMMANDS: dict[str, str] = {
    "serve": "worker.app:run_serve",
    "check": "worker.check:run",
    "rules": "worker.rules.cli:run",
    "ledger": "worker.views:run_ledger",
    "deposits": "worker.views:run_deposits",
    "events": "worker.views:run_events",
    "addresses": "worker.views:run_addresses",
    "replay": "worker.ops:run_replay",
    "retry-failed": "worker.ops:run_retry_failed",
    "backup": "worker.ops:run_backup",
    "status": "worker.ops:run_status",
    "register-address": "worker.addresses:run",
    "backfill": "worker.backfill:run",
    "sandbox": "worker.sandbox.cli:run",
    "demo": "worker.demo:run",
}


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
    src.add_argument("event_file", nargs="?", metavar="EVENT.json")
    src.add_argument("--event", metavar="EVENT_ID", help="a stored event")

    p = sub.add_parser("ledger", parents=[common], help="print booked deposits")
    p.add_argument("--json", action="store_true")
    p.add_argument("--since", metavar="ISO", help="only entries booked at or after this time")

    p = sub.add_parser("deposits", parents=[common], help="print tracked deposits")
    p.add_argument("--state", metavar="S")
    p.add_argument("--json", action="store_true")
    p.add_argument("transaction_id", nargs="?", help="show one deposit with its history")

    p = sub.add_parser("events", parents=[common], help="print stored webhook events")
    p.add_argument("--failed", action="store_true", help="failed events, actions and alerts")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("addresses", parents=[common], help="print registered source addresses")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("replay", parents=[common], help="re-run one stored event")
    p.add_argument("event_id", metavar="EVENT_ID")
    sub.add_parser("retry-failed", parents=[common], help="re-run failed events and actions")
    p = sub.add_parser("backup", parents=[common], help="consistent online copy of the database")
    p.add_argument("path", metavar="PATH")
    sub.add_parser("status", parents=[common], help="state of the running service")

    p = sub.add_parser("register-address", parents=[common], help="register a source address")
    p.add_argument("--wallet", required=True, type=int, metavar="ID")
    p.add_argument("--address", required=True, metavar="ADDR")
    p.add_argument("--network", required=True, metavar="NET")
    p.add_argument("--profile", required=True, metavar="NAME")
    p.add_argument("--tx-hash", metavar="H")
    p.add_argument("--memo", metavar="M")
    p.add_argument("--replace-failed", action="store_true")
    p.add_argument("--no-wait", action="store_true", help="do not poll until ACTIVE or FAILED")

    p = sub.add_parser(
        "backfill", parents=[common], help="read the full history of a window into the tracker"
    )
    p.add_argument("--since", required=True, metavar="ISO")
    p.add_argument("--until", metavar="ISO", help="default: now")
    p.add_argument("--wallet", type=int, metavar="ID", help="only this wallet's history")

    p = sub.add_parser("sandbox", parents=[common], help="run the provider sandbox")
    p.add_argument("--port", type=_port)
    p.add_argument("--state", metavar="FILE", help="keep sandbox state in this SQLite file")

    p = sub.add_parser("demo", parents=[common], help="sandbox + worker scripted scenarios")
    p.add_argument("--keep", metavar="DIR", help="keep the demo's files in DIR")
    return parser


def _port(text: str) -> int:
    """A TCP port number (argparse type: anything else is a usage error, exit 2)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (1-65535): {text!r}")
    return port


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `depositd` and `python -m worker`."""
    args = build_parser().parse_args(argv)
    # Log lines go to stderr, never into a command's output (serve sets its own from config).
    configure(None, "warning")
    target = COMMANDS[args.command]
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        result: int = func(args)
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
