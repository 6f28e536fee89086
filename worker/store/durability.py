"""What an acknowledged webhook survives, from the database's own settings (docs/postgresql.md,
"What an acknowledgement survives").

`200` is answered once the delivery's transaction committed; what that commit survives is the
database's choice. On PostgreSQL: `fsync` and `synchronous_commit` say whether a commit is on
the server's disk when it returns, and `synchronous_standby_names` whether it is also on a
standby's (so that the standby, promoted, has it). On SQLite: `storage.synchronous`.
"""

from __future__ import annotations

from typing import Any

from worker.store.db import Db

# What a commit survives, from least to most.
NOTHING = (
    "nothing certain: a crash of the database server may lose the last acknowledged deliveries"
)
SERVER_CRASH = (
    "the database server's crash (its disk kept); not the loss of that server or its disk"
)
PRIMARY_LOSS = "the loss of the primary server: a synchronous standby has every acknowledged commit"
# SQLite
PROCESS_CRASH = "the process's crash; not a power cut or an operating system crash"
MACHINE_CRASH = "a power cut or an operating system crash (the file's disk kept)"

_LOCAL_ONLY = {"local"}
_ON_STANDBY = {"on", "remote_apply", "remote_write"}


def postgres_durability(conn: Db) -> dict[str, Any]:
    """The promise of a PostgreSQL server, read on `conn`: its settings and what they mean."""
    names = (
        "fsync",
        "synchronous_commit",
        "synchronous_standby_names",
    )
    values = {name: str(conn.execute(f"SHOW {name}").fetchone()[0]).strip() for name in names}
    fsync, commit, standbys = (values[n] for n in names)
    if fsync != "on" or commit == "off":
        survives = NOTHING
    elif standbys and commit in _ON_STANDBY:
        survives = PRIMARY_LOSS
    else:
        survives = SERVER_CRASH
    answer: dict[str, Any] = {
        "survives": survives,
        "fsync": fsync,
        "synchronousCommit": commit,
        "synchronousStandbyNames": standbys,
    }
    if survives == PRIMARY_LOSS:
        # Visible to a role with pg_monitor (or pg_read_all_stats); else null: not known here.
        # None connected: commits wait until one is (PostgreSQL holds them).
        row = conn.execute(
            "SELECT COUNT(*) FILTER (WHERE sync_state IN ('sync', 'quorum')),"
            " pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER') FROM pg_stat_replication"
        ).fetchone()
        answer["synchronousStandbysConnected"] = int(row[0]) if row[1] else None
    return answer


def sqlite_durability(synchronous: str) -> dict[str, Any]:
    """The promise of a SQLite file written with `PRAGMA synchronous = synchronous` (WAL)."""
    survives = MACHINE_CRASH if synchronous.upper() in ("FULL", "EXTRA") else PROCESS_CRASH
    return {"survives": survives, "synchronous": synchronous.upper()}


def durability_line(answer: dict[str, Any]) -> str:
    """One line for `check --online`: what survives, and the settings that say so."""
    settings = ", ".join(f"{k}={v}" for k, v in answer.items() if k != "survives")
    return f"an acknowledged webhook survives {answer['survives']} ({settings})"
