"""A SQLite connection with depositd's pragmas: the store's own and every command's.

Apart from `worker.store.writer` so that a command that only reads (`depositd status`) opens the
database without loading the writer and sqlite-utils.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path


def connect(path: Path, *, synchronous: str = "FULL", readonly: bool = False) -> sqlite3.Connection:
    """A connection with depositd's pragmas (WAL, synchronous, busy timeout, Row factory,
    removed content zeroed)."""
    if readonly:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    else:
        conn = sqlite3.connect(str(path), timeout=5.0, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 5000")
    if not readonly:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA temp_store = MEMORY")
        # What a write removes or moves is overwritten with zeros (Debian's build does so by
        # default; others may not): personal data removed by retention leaves no copy behind
        # in the file (docs/audit.md, "Retention of personal data").
        conn.execute("PRAGMA secure_delete = ON")
    return conn
