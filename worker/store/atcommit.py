"""Journal entries held until the end of the write transaction they belong to, then appended
just before its COMMIT (docs/audit.md, "When an entry is written").

On PostgreSQL an append holds the journal's lock to the end of the transaction: a store round
(many jobs in one transaction) that appended early and then waited for a deposit's lock held
by another instance, itself waiting for the journal, would deadlock. So the jobs of a round,
and a command's transaction, queue their entries here (`journal.append_at_commit`), and the
round appends them all last (`journal.append_queued`), when it takes no other lock after.

A queue belongs to one connection while its transaction is open (`open_queue` after BEGIN,
`take` before COMMIT, `close_queue` after a rollback); a savepoint rolled back drops what was
queued inside it (`mark`, `drop_after`). Without an open queue an entry is appended at once.
"""

from __future__ import annotations

from typing import Any

# id(connection) -> (the connection, kept so that its id is not reused; the queued items).
_QUEUES: dict[int, tuple[object, list[Any]]] = {}


def open_queue(conn: object) -> None:
    """The connection's transaction has begun: queue its entries from now on (empty)."""
    _QUEUES[id(conn)] = (conn, [])


def add(conn: object, item: Any) -> bool:
    """Queue one item for the connection's commit; False when no queue is open (the caller
    appends it at once)."""
    found = _QUEUES.get(id(conn))
    if found is None or found[0] is not conn:
        return False
    found[1].append(item)
    return True


def mark(conn: object) -> int | None:
    """Where the queue stands (before a savepoint); None without an open queue."""
    found = _QUEUES.get(id(conn))
    return None if found is None or found[0] is not conn else len(found[1])


def drop_after(conn: object, at: int | None) -> None:
    """The savepoint begun at `at` (`mark`) was rolled back: drop what it queued."""
    found = _QUEUES.get(id(conn))
    if at is not None and found is not None and found[0] is conn:
        del found[1][at:]


def take(conn: object) -> list[Any]:
    """The queued items, in order, and the queue closed (the transaction commits next)."""
    found = _QUEUES.pop(id(conn), None)
    return [] if found is None or found[0] is not conn else found[1]


def close_queue(conn: object) -> None:
    """The transaction was rolled back: its queue goes with it."""
    found = _QUEUES.get(id(conn))
    if found is not None and found[0] is conn:
        del _QUEUES[id(conn)]
