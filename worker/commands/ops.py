"""Day-2 commands: backup, replay, retry-failed, status.

They work on the database file beside a running service: SQLite in WAL mode lets them read and
make small writes while `serve` runs; the service's processor and outbox pick up rows these
commands set back to pending (they sweep the tables every second).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any, TextIO

from worker import __version__
from worker.clock import ms_from_iso, utc_now
from worker.commands.dbopen import run_on_db
from worker.config.settings import load_settings
from worker.store import actions, alerts, events, leases
from worker.store.actions import requeue_failed_actions
from worker.store.alerts import requeue_failed_alerts
from worker.store.conflicts import count_held_deposits
from worker.store.database import finish_copy, has_table
from worker.store.db import Connection
from worker.store.deposits import count_waiting_on_human, deposits_by_state
from worker.store.durability import postgres_durability, sqlite_durability
from worker.store.errors import StoreError
from worker.store.events import requeue_event, requeue_failed_events
from worker.store.findings import reconciliation_status
from worker.store.leases import SCHEDULER_LEASE
from worker.store.ledger import count_booked
from worker.store.meta import TASKS_DOWN, all_meta, auth_refusal_streak
from worker.store.pg import is_postgres
from worker.store.retention import last_run
from worker.store.servelock import serving
from worker.store.sqlite import open_file
from worker.store.verification import journal_status
from worker.store.waits import count_overdue

# The files SQLite keeps beside a database: writing over any of them under a running service
# corrupts the database.
_COMPANIONS = ("-wal", "-shm", "-journal")


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
        return os.path.samefile(a, b)  # hard links, bind mounts
    except (OSError, RuntimeError):  # one of them does not exist; a symlink loop
        return False


def backup_target_problem(database: Path, target: Path) -> str | None:
    """Why `target` must not be written as a backup of `database`, or None when it may."""
    if target.is_dir():
        return f"{target} is a directory; give the path of the backup file to write"
    live = [database, *(database.with_name(database.name + s) for s in _COMPANIONS)]
    for file in live:
        if _same_file(target, file):
            return f"{target} is the live database file {file}; choose another path"
        if _same_file(_partial(target), file):
            return f"{target}: its temporary copy would overwrite the live database file {file}"
    return None


def _partial(target: Path) -> Path:
    return target.with_name(target.name + ".partial")


def backup(source: Path, target: Path) -> int:
    """Consistent online copy with SQLite's backup API; returns the page count copied.

    Written to `<target>.partial` first, which is removed if anything fails.
    """
    tmp = _partial(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        # Created 0600 before SQLite opens it (the copy holds payer data): never readable by
        # others, not even for a moment; SQLite gives its journal files the mode of the
        # database file.
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.chmod(tmp, 0o600)  # whatever the umask
        with (
            closing(open_file(str(source), timeout=30)) as src,
            closing(open_file(str(tmp))) as dst,
        ):
            # One step under one read transaction: copied in steps, every commit the service
            # makes between two steps restarts the copy, which under load may never finish.
            # WAL keeps the service writing meanwhile.
            src.backup(dst, pages=-1)
            pages = finish_copy(dst)
        tmp.replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            if tmp.is_file():
                tmp.unlink()
        raise
    return pages


def run_backup(args: argparse.Namespace) -> int:
    """`depositd backup PATH`: exit 2 for a target that is the database or a folder."""

    settings = load_settings(args.config)
    if settings.storage.url is not None:
        print(
            "depositd: backup refused: the database is PostgreSQL (storage.url), which this"
            " command does not copy; back it up with the server's tools, e.g."
            f" `pg_dump --format=custom --file={args.path} {settings.storage.where}`"
            " (a consistent snapshot while the service runs), restored with pg_restore",
            file=sys.stderr,
        )
        return 2

    def body(_conn: Connection, _args: argparse.Namespace, out: TextIO) -> int:
        target = Path(args.path)
        problem = backup_target_problem(settings.storage.file, target)
        if problem:
            print(f"depositd: backup refused: {problem}", file=sys.stderr)
            return 2
        started = time.monotonic()
        try:
            pages = backup(settings.storage.file, target)
        except (OSError, StoreError) as exc:
            print(f"depositd: backup to {target} failed: {exc}", file=sys.stderr)
            return 1
        elapsed = time.monotonic() - started
        print(f"backup written to {args.path} ({pages} pages, {elapsed:.2f}s)", file=out)
        return 0

    return run_on_db(args, body)


def _replay(conn: Connection, args: argparse.Namespace, out: TextIO) -> int:
    with conn:
        found = requeue_event(conn, args.event_id)
    if not found:
        print(f"depositd: no stored event {args.event_id!r}", file=sys.stderr)
        return 1
    print(
        f"event {args.event_id} queued again; the running service re-runs it through the tracker"
        " and the rules (transitions already taken do not act twice)",
        file=out,
    )
    return 0


def run_replay(args: argparse.Namespace) -> int:
    """`depositd replay EVENT_ID`: put one stored event back in the inbox."""
    return run_on_db(args, _replay, readonly=False)


def _retry_failed(conn: Connection, _args: argparse.Namespace, out: TextIO) -> int:
    now = utc_now()
    with conn:
        n_events = requeue_failed_events(conn)
        # Submissions the provider refused for the profile wait for a changed profile instead.
        n_actions = requeue_failed_actions(conn, now)
        requeue_failed_alerts(conn)
    print(
        f"queued again: {n_events} event(s), {n_actions} action(s) (idempotency keys kept)",
        file=out,
    )
    return 0


def run_retry_failed(args: argparse.Namespace) -> int:
    """`depositd retry-failed`: failed events and actions back to pending, same keys."""
    return run_on_db(args, _retry_failed, readonly=False)


def _leader(conn: Connection) -> dict[str, Any] | None:
    """The scheduler's lease as recorded (None: never taken, or a database from before
    several instances); `current` is false once it has lapsed."""
    if not has_table(conn, "leases"):  # a database from before several instances
        return None
    lease = leases.get_lease(conn, SCHEDULER_LEASE)
    if lease is None:
        return None
    return {**lease.as_json(), "current": lease.expires_at > utc_now()}


def status_report(
    conn: Connection, in_use: bool | None = None, *, synchronous: str = "FULL"
) -> dict[str, Any]:
    """What `status` shows, read from the database; `in_use`: whether a serve holds it now
    (`worker.store.servelock.serving`), None when unknown; `synchronous`: SQLite's
    `storage.synchronous` (what a commit survives there)."""
    meta: dict[str, Any] = all_meta(conn)
    started, stopped = meta.get("started_at"), meta.get("stopped_at")
    # `serve` records its start and its stop; a SIGKILL, a crash or a power cut leaves the start
    # alone, so the record is only believed while some process has the database open. The
    # serve lock decides when it can be looked at: with several instances on one database,
    # one that stopped recorded its stop while another still serves (docs/operator.md).
    recorded = bool(started) and (not stopped or stopped < started)
    running = in_use if in_use is not None else recorded
    uptime = None
    if running and started:
        uptime = round((ms_from_iso(utc_now()) - ms_from_iso(started)) / 1000)
    return {
        "version": __version__,
        "running": running,
        "startedAt": started,
        "stoppedAt": stopped,
        # true: the last serve ended without recording its stop; null: could not check.
        "uncleanStop": None if recorded and in_use is None else recorded and in_use is False,
        "uptimeSeconds": uptime,
        # The meta key survives retention pruning; the events table is the fallback.
        "lastWebhookAt": meta.get("last_webhook_at") or events.last_received_at(conn),
        "lastHistoryPollOk": meta.get("last_history_poll_ok"),
        "lastDetailPollOk": meta.get("last_detail_poll_ok"),
        # Up to when the full history was read completely (catch-up, sweep, backfill).
        "historyCoveredUntil": meta.get("history_covered_until"),
        "pendingEvents": events.count_pending(conn),
        "failedEvents": events.count_failed(conn),
        "pendingActions": actions.count_open(conn),
        "failedActions": actions.count_failed(conn),
        "failedAlerts": alerts.count_failed(conn),
        "waitingOnHuman": count_waiting_on_human(conn),
        # Deposits whose booking is held by a fixed-field conflict (`depositd resolve`); a
        # database not yet migrated to version 3 has none.
        "heldByConflict": count_held_deposits(conn),
        # Deposits still waiting on a person past their rule set's deadline (alerted again).
        "overdue": count_overdue(conn),
        "deposits": deposits_by_state(conn),
        "booked": count_booked(conn),
        # Requests refused on the webhook port by reason, since `since` (a serve's start).
        "webhookRefusals": json.loads(meta.get("webhook_refusals") or "null"),
        # Deliveries refused in a row for their signature or API key, none accepted since
        # `since` (alerted once): webhook.secret or webhook.api_key differs from the provider's.
        "webhookAuthRefused": auth_refusal_streak(meta),
        # The instance leading the scheduler (its polls and daily jobs), since when, until when.
        "leader": _leader(conn),
        # The long-running tasks of serve down (restarting, or given up), by instance.
        "tasksDown": json.loads(meta.get(TASKS_DOWN) or "{}"),
        # The last reconciliation run and the findings still open (`depositd reconcile`).
        "reconciliation": reconciliation_status(conn),
        # The last run of the retention of personal data, and the last one that removed any
        # (null: never ran, `retention.personal_data_days` unset).
        "personalDataRetention": last_run(meta),
        # The journal's head and its last verification (`depositd verify`, the daily job).
        "journal": journal_status(conn) if has_table(conn, "journal") else None,
        # What an acknowledged webhook survives, as the database is set up now.
        "durability": (
            postgres_durability(conn) if is_postgres(conn) else sqlite_durability(synchronous)
        ),
    }


def run_status(args: argparse.Namespace) -> int:
    """`depositd status`: from the running service's database."""
    settings = load_settings(args.config)
    storage = settings.storage
    # SQLite: the serve lock's file; PostgreSQL: the serve lock's advisory lock in pg_locks.
    if storage.path is not None:
        in_use = serving(storage.path)
    else:
        from worker.store.pgstore import serving as pg_serving  # psycopg: only when asked

        in_use = pg_serving(storage)

    def body(conn: Connection, _args: argparse.Namespace, out: TextIO) -> int:
        report = status_report(conn, in_use, synchronous=storage.synchronous)
        print(json.dumps(report, indent=2), file=out)
        return 0

    return run_on_db(args, body, settings=settings)
