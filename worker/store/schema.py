"""The SQLite schema (docs/design.md) and its forward migrations.

`MIGRATIONS[i]` brings a database from version i to version i + 1; `worker.store.writer.migrate`
applies them, each in one transaction with its version record.
"""

from __future__ import annotations

from collections.abc import Callable

from worker.clock import now_ms
from worker.store.db import Db
from worker.store.journal import adopt_ledger
from worker.store.pg import is_postgres

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT UNIQUE NOT NULL,
    event_type TEXT,
    reference_id TEXT,
    transaction_id TEXT,
    body BLOB NOT NULL,
    headers TEXT,
    received_at TEXT,
    status TEXT NOT NULL DEFAULT 'pending',
    error TEXT,
    processed_at TEXT
);
CREATE INDEX IF NOT EXISTS events_status ON events (status, seq);
CREATE INDEX IF NOT EXISTS events_transaction ON events (transaction_id);
CREATE TABLE IF NOT EXISTS deposits (
    transaction_id TEXT PRIMARY KEY,
    wallet_id INTEGER,
    wallet_name TEXT,
    currency TEXT,
    network TEXT,
    amount TEXT,
    from_address TEXT,
    to_address TEXT,
    tx_hash TEXT,
    status TEXT,
    white_list_status TEXT,
    credit_status TEXT,
    fail_message TEXT,
    state TEXT,
    emitted TEXT,
    whitelisted INTEGER,
    fact_time INTEGER,
    source TEXT,
    created_at TEXT,
    updated_at TEXT
);
CREATE INDEX IF NOT EXISTS deposits_state ON deposits (state);
CREATE TABLE IF NOT EXISTS facts (
    id INTEGER PRIMARY KEY,
    transaction_id TEXT,
    source TEXT,
    event_id TEXT,
    observed_at INTEGER,
    fact TEXT,
    changed INTEGER,
    recorded_at TEXT
);
CREATE INDEX IF NOT EXISTS facts_transaction ON facts (transaction_id);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY,
    transaction_id TEXT,
    event_id TEXT,
    trigger TEXT,
    rule_set TEXT,
    rule_set_version TEXT,
    rule TEXT,
    action TEXT,
    params TEXT,
    idempotency_key TEXT,
    status TEXT,
    attempts INTEGER,
    next_attempt_at TEXT,
    outcome TEXT,
    created_at TEXT,
    updated_at TEXT
);
CREATE INDEX IF NOT EXISTS actions_status ON actions (status, next_attempt_at);
CREATE INDEX IF NOT EXISTS actions_transaction ON actions (transaction_id);
CREATE TABLE IF NOT EXISTS ledger (
    transaction_id TEXT PRIMARY KEY,
    wallet_id INTEGER,
    wallet_name TEXT,
    currency TEXT,
    network TEXT,
    amount TEXT,
    from_address TEXT,
    tx_hash TEXT,
    booked_at TEXT,
    trigger TEXT
);
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY,
    dedupe_key TEXT UNIQUE,
    transaction_id TEXT,
    condition TEXT,
    severity TEXT,
    channel TEXT,
    status TEXT,
    attempts INTEGER,
    last_error TEXT,
    created_at TEXT,
    sent_at TEXT
);
CREATE TABLE IF NOT EXISTS addresses (
    id TEXT PRIMARY KEY,
    wallet_id INTEGER,
    wallet_address TEXT,
    network TEXT,
    memo TEXT,
    status TEXT,
    fail_message TEXT,
    profile TEXT,
    created_at TEXT,
    updated_at TEXT
);
"""


def _migrate_v1(db: Db) -> None:
    for statement in _SCHEMA_V1.split(";"):
        if statement.strip():
            db.execute(statement)


def _migrate_v2(db: Db) -> None:
    # The reactor asks, per processed event, whether rules already ran on it: without this
    # index that is a scan of every action ever recorded.
    db.execute("CREATE INDEX IF NOT EXISTS actions_event ON actions (event_id, trigger)")
    # Retention deletes the facts that changed nothing (repeated polls) by age, daily, inside
    # the group transaction that webhooks wait for: a range, not a scan of every fact.
    db.execute("CREATE INDEX IF NOT EXISTS facts_unchanged ON facts (changed, recorded_at)")


def _migrate_fixed_field_conflicts(db: Db) -> None:
    # A later fact contradicting a field the first fact fixed (amount, wallet, currency,
    # network, addresses): held for a human's decision (`depositd resolve`), who/when/note kept.
    db.execute(
        "CREATE TABLE IF NOT EXISTS conflicts (id INTEGER PRIMARY KEY,"
        " transaction_id TEXT NOT NULL, field TEXT NOT NULL, fixed_value TEXT, seen_value TEXT,"
        " source TEXT, event_id TEXT, observed_at INTEGER, created_at TEXT, decided_value TEXT,"
        " decided_by TEXT, decided_at TEXT, note TEXT, UNIQUE (transaction_id, field, seen_value))"
    )
    # Booking refuses a txHash already in the ledger under another transactionId.
    db.execute("CREATE INDEX IF NOT EXISTS ledger_tx_hash ON ledger (tx_hash)")


def _migrate_findings_and_abnormal(db: Db) -> None:
    # Reconciliation (the ledger against the provider's daily report): one row per finding of a
    # day (kind and subject: a txHash, wallet:currency, or the report itself), with when it was
    # first seen, resolved (gone on a re-run) and acknowledged; and one row per run.
    db.execute(
        "CREATE TABLE IF NOT EXISTS findings (id INTEGER PRIMARY KEY, day TEXT NOT NULL,"
        " kind TEXT NOT NULL, subject TEXT NOT NULL, transaction_id TEXT, tx_hash TEXT,"
        " ledger_amount TEXT, report_amount TEXT, currency TEXT, network TEXT, wallet_id INTEGER,"
        " detail TEXT, first_seen TEXT, last_seen TEXT, resolved_at TEXT, acknowledged_by TEXT,"
        " acknowledged_at TEXT, note TEXT, UNIQUE (day, kind, subject))"
    )
    db.execute("CREATE INDEX IF NOT EXISTS findings_open ON findings (resolved_at, kind)")
    db.execute(
        "CREATE TABLE IF NOT EXISTS reconcile_runs (id INTEGER PRIMARY KEY, day TEXT NOT NULL,"
        " started_at TEXT, finished_at TEXT, outcome TEXT, findings INTEGER, error TEXT)"
    )
    # Abnormal funds (money that matched no order), by the provider's id; no payer data kept.
    db.execute(
        "CREATE TABLE IF NOT EXISTS abnormal_funds (id TEXT PRIMARY KEY, amount TEXT,"
        " currency TEXT, network TEXT, tx_hash TEXT, tx_time INTEGER, expires_time INTEGER,"
        " status TEXT, order_id TEXT, address_risk_status TEXT, first_seen TEXT,"
        " updated_at TEXT, alerted_at TEXT, expiring_alerted_at TEXT)"
    )


def _migrate_orders(db: Db) -> None:
    # Stable, collection and wallet transfer orders from their webhooks (STABLE_ORDER_UPDATED,
    # Collect Order Updated, WALLET_TRANSFER_ORDER_UPDATED) and the detail read after each.
    db.execute(
        "CREATE TABLE IF NOT EXISTS orders (kind TEXT NOT NULL, order_id TEXT NOT NULL,"
        " merchant_order_id TEXT, order_status TEXT, business_type TEXT, currency TEXT,"
        " network TEXT, amount TEXT, record TEXT NOT NULL, read_status TEXT NOT NULL,"
        " event_id TEXT, created_at TEXT, updated_at TEXT, PRIMARY KEY (kind, order_id))"
    )
    db.execute("CREATE INDEX IF NOT EXISTS orders_updated ON orders (updated_at)")


def _migrate_operator_actions(db: Db) -> None:
    # What operators did in the console (retries, re-runs, acknowledgements, detail reads),
    # each with its time and the note typed.
    db.execute(
        "CREATE TABLE IF NOT EXISTS operator_actions (id INTEGER PRIMARY KEY, at TEXT NOT NULL,"
        " kind TEXT NOT NULL, subject TEXT NOT NULL, note TEXT NOT NULL DEFAULT '',"
        " outcome TEXT NOT NULL, remote TEXT)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS operator_actions_subject ON operator_actions (subject)")


def _migrate_instances(db: Db) -> None:
    # Several instances on one database: named leases (the scheduler's leader), and who runs
    # an action row or sends an alert to a channel until when (a claim another instance takes
    # over once it expires, with the row's same Idempotency-Key).
    db.execute(
        "CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL,"
        " expires_at TEXT NOT NULL, acquired_at TEXT NOT NULL)"
    )
    db.execute("ALTER TABLE actions ADD COLUMN claimed_by TEXT")
    db.execute("ALTER TABLE actions ADD COLUMN lease_until TEXT")
    db.execute("ALTER TABLE alerts ADD COLUMN claimed_by TEXT")
    db.execute("ALTER TABLE alerts ADD COLUMN lease_until TEXT")


def _migrate_ledger_tx_hash_case_blind(db: Db) -> None:
    # txHashes are compared case-blind (booking's likely-duplicate check under the txHash lock,
    # reconciliation's matching of records without an id): an index on the lower-cased hash.
    db.execute("CREATE INDEX IF NOT EXISTS ledger_tx_hash_lower ON ledger (lower(tx_hash))")


def _migrate_pending_events_index(db: Db) -> None:
    # PostgreSQL: an event's row is updated once (pending -> processed), which leaves a dead
    # version behind until VACUUM, and `events_status` keeps an entry for it under 'pending':
    # the claim (`events._CLAIM`) then read every event processed since the last VACUUM, and
    # slowed down as the table grew. VACUUM now comes sooner on this table (after 2% of its
    # rows changed, not 20%), and the claim has an index of the pending events alone: a
    # processed event has no entry in it once vacuumed, and the processed ones in between
    # are not under it at all. SQLite removes an updated row's old entry at once: nothing
    # to do there.
    if not is_postgres(db):
        return
    db.execute("CREATE INDEX IF NOT EXISTS events_pending ON events (seq) WHERE status = 'pending'")
    db.execute(
        "ALTER TABLE events SET (autovacuum_vacuum_scale_factor = 0.02,"
        " autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02)"
    )


def _migrate_reconcile_runs_ledger_mark(db: Db) -> None:
    # What ledger side a completed run compared (its rows' count and ids, `findings.ledger_mark`):
    # a day whose ledger side is another now is reconciled again (`findings.days_due`).
    db.execute("ALTER TABLE reconcile_runs ADD COLUMN ledger_mark TEXT")


def _migrate_journal(db: Db) -> None:
    # The journal of money and Travel Rule decisions (`worker.store.journal`, docs/audit.md):
    # seq is given by the appender (the head's + 1), never generated. Its rows are never
    # updated nor deleted: the engine refuses both (whoever drops that refusal first is still
    # found by the hash chain against a head kept elsewhere). The ledger rows booked before
    # the journal existed are adopted, one entry each.
    db.execute(
        "CREATE TABLE IF NOT EXISTS journal (seq INTEGER NOT NULL PRIMARY KEY, at TEXT NOT NULL,"
        " kind TEXT NOT NULL, subject TEXT NOT NULL, body TEXT NOT NULL, digest TEXT NOT NULL,"
        " prev_hash TEXT NOT NULL, hash TEXT NOT NULL)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS journal_subject ON journal (subject, seq)")
    # What each submission sent, as sent (`worker.store.submissions`): `body` holds the payer
    # values until retention removes them (`purged_at`), its hash stays in the journal. One row
    # per action and payload: a failed submission retried after its profile was corrected
    # sends another payload under the same action.
    db.execute(
        "CREATE TABLE IF NOT EXISTS submissions (action_id INTEGER NOT NULL,"
        " transaction_id TEXT NOT NULL, profile TEXT NOT NULL, fields TEXT NOT NULL, body TEXT,"
        " payload_sha256 TEXT NOT NULL, sent_at TEXT NOT NULL, outcome TEXT, purged_at TEXT,"
        " PRIMARY KEY (action_id, payload_sha256))"
    )
    db.execute("CREATE INDEX IF NOT EXISTS submissions_transaction ON submissions (transaction_id)")
    if is_postgres(db):
        db.execute(
            "CREATE OR REPLACE FUNCTION journal_append_only() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'the journal is append-only'; END $$"
        )
        db.execute(
            "CREATE TRIGGER journal_append_only BEFORE UPDATE OR DELETE ON journal"
            " FOR EACH ROW EXECUTE FUNCTION journal_append_only()"
        )
    else:
        for event in ("UPDATE", "DELETE"):
            db.execute(
                f"CREATE TRIGGER IF NOT EXISTS journal_no_{event.lower()} BEFORE {event} ON journal"
                " BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END"
            )
    adopt_ledger(db)


def _migrate_waits(db: Db) -> None:
    # Deposits waiting on a person, one row per wait (`worker.store.waits`, docs/rules.md,
    # "Deadlines"): the deadline job reads the open ones through `waits_open`, never every
    # deposit. The deposits waiting already are counted from now: when they started to wait
    # is not known in this machine's clock.
    db.execute(
        "CREATE TABLE IF NOT EXISTS waits (id INTEGER PRIMARY KEY, transaction_id TEXT NOT NULL,"
        " reason TEXT NOT NULL, started_at INTEGER NOT NULL, severity TEXT NOT NULL,"
        " channels TEXT, escalated_at INTEGER, ended_at INTEGER)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS waits_open ON waits (started_at) WHERE ended_at IS NULL")
    db.execute("CREATE INDEX IF NOT EXISTS waits_transaction ON waits (transaction_id, reason)")
    now = now_ms()
    db.execute(
        "INSERT INTO waits (transaction_id, reason, started_at, severity)"
        " SELECT d.transaction_id, d.state, CAST(? AS BIGINT),"
        " CASE WHEN d.state = 'blocked' THEN 'critical' ELSE 'warning' END FROM deposits d"
        " WHERE d.state IN ('rejected', 'blocked') OR (d.state = 'needs_details'"
        " AND NOT EXISTS (SELECT 1 FROM actions a WHERE a.transaction_id = d.transaction_id"
        " AND a.action = 'submit_profile' AND a.status <> 'skipped'))",
        [now],
    )
    db.execute(
        "INSERT INTO waits (transaction_id, reason, started_at, severity)"
        " SELECT DISTINCT transaction_id, 'held', CAST(? AS BIGINT), 'critical' FROM conflicts"
        " WHERE decided_at IS NULL",
        [now],
    )


def _migrate_submissions_unpurged(db: Db) -> None:
    # Retention's daily run (`worker.store.retention`) reads the submissions still holding
    # payer values, in action id order: those alone, not every submission ever purged.
    db.execute(
        "CREATE INDEX IF NOT EXISTS submissions_unpurged ON submissions (action_id)"
        " WHERE purged_at IS NULL"
    )


# Append only.
MIGRATIONS: list[Callable[[Db], None]] = [
    _migrate_v1,
    _migrate_v2,
    _migrate_fixed_field_conflicts,
    _migrate_findings_and_abnormal,
    _migrate_orders,
    _migrate_operator_actions,
    _migrate_instances,
    _migrate_ledger_tx_hash_case_blind,
    _migrate_pending_events_index,
    _migrate_reconcile_runs_ledger_mark,
    _migrate_journal,
    _migrate_waits,
    _migrate_submissions_unpurged,
]
SCHEMA_VERSION = len(MIGRATIONS)
