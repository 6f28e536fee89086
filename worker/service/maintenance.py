"""What the runtime's daily maintenance and a (re)load of the profiles write: retention of old
events and unchanged facts, the submissions a profiles file calls for, and the record of the
profiles already alerted about because their provider is no longer offered."""

from __future__ import annotations

import json

from worker.act.resubmit import resubmit_changed, submit_newly_covered
from worker.clock import iso_from_ms, now_ms
from worker.service.bundle import Bundle
from worker.store.db import Database, Db
from worker.store.events import delete_done_before
from worker.store.facts import delete_unchanged_before
from worker.store.meta import get_meta

DAY_S = 86_400.0

# meta key: the profiles already alerted about because their provider is no longer offered.
UNKNOWN_PROVIDERS = "providers_unknown_alerted"


def prune_events(db: Db, retention_days: int) -> int:
    """Delete processed/ignored events older than the retention; ledger, actions stay."""
    return delete_done_before(db, _cutoff(retention_days))


def prune_unchanged_facts(db: Db, retention_days: int) -> int:
    """Delete facts older than the retention that changed nothing (mostly polls repeating what
    was known: one per poll run per waiting deposit); the facts that moved a deposit stay."""
    return delete_unchanged_before(db, _cutoff(retention_days))


def prune(db: Db, days: int) -> tuple[int, int]:
    """Both retentions at once: (events pruned, facts pruned)."""
    return prune_events(db, days), prune_unchanged_facts(db, days)


def submissions_due(db: Database, bundle: Bundle) -> int:
    """Submissions a (re)loaded profiles file calls for: corrected profiles for rejected or
    refused deposits, and new ones for deposits that no profile covered until now."""
    return resubmit_changed(db, bundle.profiles) + submit_newly_covered(
        db, bundle.profiles, bundle.rules
    )


def alerted_unknown(db: Db) -> set[str]:
    """The profiles already alerted about because their provider is no longer offered."""
    return set(json.loads(get_meta(db, UNKNOWN_PROVIDERS) or "[]"))


def _cutoff(retention_days: int) -> str:
    return iso_from_ms(now_ms() - retention_days * int(DAY_S) * 1000)
