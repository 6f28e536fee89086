"""`depositd submit TX --profile NAME --by WHO [--note TEXT]`: the approve path from a shell.

Queues a submission of a stored profile for a deposit waiting for payer details (one held by a
rule for a person, or rejected), recorded as an operator action (`worker.act.approve`). The
running service's outbox submits it, as it does a rule's submission (it sweeps the table every
second); the command waits for that outcome up to `--wait` seconds and prints it. With no
`serve` running the submission waits for the next start. A second run queues nothing and
reports the first. Exit status: 0 submitted (or queued, or submitted before), 1 refused by the
provider or not possible for the deposit, 2 a profile that is unknown or does not fit.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from worker.act.approve import Approval, approve, operator_name
from worker.commands.dbopen import run_on_db
from worker.config.profiles import Profiles
from worker.config.settings import Settings, load_settings
from worker.store.actions import get_action
from worker.store.db import Connection
from worker.store.servelock import serving
from worker.store.sqlitestore import database, transaction

EXIT = {
    "queued": 0,
    "already": 0,
    "unknown_deposit": 1,
    "not_waiting": 1,
    "identical": 1,
    "unknown_profile": 2,
    "unfit": 2,
}
_POLL_S = 0.2
MAX_NOTE = 500  # as the console's


def _serve_running(settings: Settings) -> bool | None:
    storage = settings.storage
    if storage.path is not None:
        return serving(storage.path)
    from worker.store.pgstore import serving as pg_serving  # psycopg: only when asked

    return pg_serving(storage)


def _wait(conn: Connection, action_id: int, wait_s: float, out: TextIO) -> int:
    """Print the submission's outcome once the outbox has recorded one (or after `wait_s`)."""
    deadline = time.monotonic() + wait_s
    row = get_action(conn, action_id)
    while row is not None and row["status"] in ("pending", "running"):
        if time.monotonic() >= deadline:
            shown = f": {row['outcome']}" if row["outcome"] else ""
            print(
                f"submission #{action_id} still {row['status']} after {wait_s:g}s{shown};"
                f" `depositd deposits {row['transaction_id']}` shows what follows",
                file=out,
            )
            return 0
        time.sleep(_POLL_S)
        row = get_action(conn, action_id)
    if row is None:  # pruned meanwhile: nothing more to say
        return 0
    print(f"submission #{action_id} {row['status']}: {row['outcome'] or '-'}", file=out)
    return 0 if row["status"] == "done" else 1


def _body(settings: Settings, profiles: Profiles, args: argparse.Namespace) -> Any:
    def body(conn: Connection, _args: argparse.Namespace, out: TextIO) -> int:
        db = database(conn)
        by = operator_name(args.by)
        note = " ".join((args.note or "").split())
        with transaction(db):
            approval: Approval = approve(
                db, args.transaction_id, args.profile, profiles, note=note, remote=f"{by}@cli"
            )
        print(
            f"{args.transaction_id}: {approval.message}",
            file=out if approval.queued else sys.stderr,
        )
        if approval.verdict != "queued" or approval.action_id is None:
            return EXIT[approval.verdict]
        running = _serve_running(settings)
        if running is False:
            print(
                "no `depositd serve` is running on this database: the submission is made when"
                " it starts",
                file=out,
            )
            return 0
        if args.wait <= 0:
            return 0
        return _wait(conn, approval.action_id, args.wait, out)

    return body


def run(args: argparse.Namespace) -> int:
    """`depositd submit TX --profile NAME --by WHO [--note TEXT] [--wait S]`."""
    if not operator_name(args.by or ""):
        print("depositd: submit: --by NAME is required (who submits, recorded)", file=sys.stderr)
        return 2
    if len(args.note or "") > MAX_NOTE:
        print(f"depositd: submit: a note is at most {MAX_NOTE} characters", file=sys.stderr)
        return 2
    settings = load_settings(args.config)
    if settings.profiles is None:
        print(
            f"depositd: submit: {settings.config_path}: profiles: is not set; there is no stored"
            " profile to submit",
            file=sys.stderr,
        )
        return 2
    # A profiles file with a problem (a profile missing a field its correspondentType needs)
    # is refused here with every problem, each naming the field, never its value (exit 2).
    profiles = Profiles.load(settings.profiles)
    return run_on_db(args, _body(settings, profiles, args), readonly=False)
