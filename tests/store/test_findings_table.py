"""The findings and reconcile_runs tables as reconciliation, `findings`, `status` and the console
read them: the credit day of a booking, one run's findings saved at once (new, seen again, gone),
held-balance drifts, the runs, and the lists a person pages through."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlite_utils

from worker.store import findings as fs
from worker.store import ledger
from worker.store.actions import queue_alert
from worker.store.findings import DRIFT, Finding
from worker.store.sqlitestore import Store

D0, D1, D2 = "2026-11-19", "2026-11-20", "2026-11-21"


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


async def test_a_booking_belongs_to_the_day_its_credit_fell_on(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credited a millisecond before midnight, booked after it: the credit's day. Without a
    credit time (or without a deposit row): the booking's day. By id and by txHash alike."""
    times = iter(
        ["2026-11-21T00:00:05.000Z", "2026-11-20T10:00:00.000Z", "2026-11-21T01:00:00.000Z"]
    )
    monkeypatch.setattr(ledger, "utc_now", lambda: next(times))

    def seed(db: sqlite_utils.Database) -> None:
        late = ms("2026-11-20T23:59:59.999")
        db.execute(
            "INSERT INTO deposits (transaction_id, fact_time) VALUES (?, ?)",
            ["tx-late", f'{{"credit_status": {late}, "status": {late + 10}}}'],
        )
        db.execute(
            "INSERT INTO deposits (transaction_id, fact_time) VALUES (?, ?)",
            ["tx-nocredit", f'{{"status": {ms("2026-11-20T12:00:00")}}}'],
        )
        for tx, hash_ in (("tx-late", "0xLate"), ("tx-norow", "0xNoRow"), ("tx-nocredit", "0xNo")):
            ledger.insert_booking(
                db,
                transaction_id=tx,
                wallet_id=1,
                wallet_name="w",
                currency="USDT",
                network="TRON",
                amount="5.5",
                from_address="TFrom",
                tx_hash=hash_,
                trigger="credited",
            )

    await store.write(seed)
    day1 = await store.read(lambda db: [tuple(r) for r in fs.ledger_rows_for_day(db, D1)])
    assert day1 == [
        ("tx-late", "5.5", "USDT", "TRON", "0xLate", D1),
        ("tx-norow", "5.5", "USDT", "TRON", "0xNoRow", D1),
    ]
    day2 = await store.read(lambda db: [tuple(r) for r in fs.ledger_rows_for_day(db, D2)])
    assert day2 == [("tx-nocredit", "5.5", "USDT", "TRON", "0xNo", D2)]
    by_id = await store.read(lambda db: fs.ledger_row_by_id(db, "tx-late"))
    assert by_id == ("tx-late", "5.5", "USDT", "TRON", "0xLate", D1)
    assert await store.read(lambda db: fs.ledger_row_by_id(db, "tx-none")) is None
    by_hash = await store.read(lambda db: fs.ledger_row_by_tx_hash(db, " 0XNOROW "))
    assert by_hash == ("tx-norow", "5.5", "USDT", "TRON", "0xNoRow", D1)
    assert await store.read(lambda db: fs.ledger_row_by_tx_hash(db, "0xother")) is None


def test_held_amounts_and_tracked_wallets(db: sqlite_utils.Database) -> None:
    """The held amounts of the deposits in the states asked (with a wallet and an amount),
    and every wallet a deposit names, once, in order."""
    rows = [
        ("tx-1", 2002, "USDT", "1.5", "held"),
        ("tx-2", 1001, "USDT", "2", "blocked"),
        ("tx-3", 1001, "USDC", "3", "booked"),
        ("tx-4", None, "USDT", "4", "held"),
        ("tx-5", 3003, "USDT", None, "held"),
        ("tx-6", 1001, "USDT", "6", "held"),
    ]
    with db.conn:
        for row in rows:
            db.execute(
                "INSERT INTO deposits (transaction_id, wallet_id, currency, amount, state)"
                " VALUES (?, ?, ?, ?, ?)",
                list(row),
            )
    held = sorted(tuple(r) for r in fs.held_amounts(db, ["held", "blocked"]))
    assert held == [(1001, "USDT", "2"), (1001, "USDT", "6"), (2002, "USDT", "1.5")]
    assert [tuple(r) for r in fs.held_amounts(db, ["booked"])] == [(1001, "USDC", "3")]
    assert fs.tracked_wallets(db) == [1001, 2002, 3003]


def finding(kind: str, subject: str, day: str = D1, **more: Any) -> Finding:
    return Finding(day=day, kind=kind, subject=subject, **more)


def state(db: sqlite_utils.Database) -> dict[tuple[str, str, str], dict[str, Any]]:
    rows = db.execute("SELECT * FROM findings ORDER BY id").fetchall()
    return {(r["day"], r["kind"], r["subject"]): dict(r) for r in rows}


def save(db: sqlite_utils.Database, day: str, found: list[Finding], now: str) -> list[int]:
    with db.conn:
        return fs.save_findings(db, day, found, now)


def test_a_run_saves_new_findings_with_every_field(db: sqlite_utils.Database) -> None:
    """Each new finding is stored with its fields and the run's time; its id comes back."""
    full = finding(
        "amount_differs",
        "tx-1",
        transaction_id="tx-1",
        tx_hash="0xabc",
        ledger_amount="10",
        report_amount="10.5",
        currency="USDT",
        network="TRON",
        wallet_id=1001,
        detail="the report says 10.5",
    )
    new = save(db, D1, [full, finding("missing_in_ledger", "0xdef")], "t1")
    rows = state(db)
    assert new == [r["id"] for r in rows.values()]
    assert len(set(new)) == 2 and all(i > 0 for i in new)
    stored = rows[(D1, "amount_differs", "tx-1")]
    assert {c: stored[c] for c in fs.FINDING_COLUMNS} == dict(
        zip(fs.FINDING_COLUMNS, full.values(), strict=True)
    )
    assert full.values()[:3] == [D1, "amount_differs", "tx-1"]
    assert (stored["first_seen"], stored["last_seen"], stored["resolved_at"]) == ("t1", "t1", None)


def test_a_later_run_touches_seen_findings_and_resolves_the_gone_ones_of_its_day(
    db: sqlite_utils.Database,
) -> None:
    """Seen again: last_seen and the amounts move, not new. Not seen: resolved, but only on
    the run's day. Seen again once resolved: open again."""
    save(db, D2, [finding("missing_in_ledger", "0xother", day=D2)], "t0")
    save(
        db,
        D1,
        [
            finding("missing_in_ledger", "0xa"),
            finding("amount_differs", "tx-b", ledger_amount="1", report_amount="2", detail="d"),
        ],
        "t1",
    )
    again = finding("amount_differs", "tx-b", ledger_amount="1", report_amount="3", detail="e")
    assert save(db, D1, [again], "t2") == []
    rows = state(db)
    b = rows[(D1, "amount_differs", "tx-b")]
    assert (b["first_seen"], b["last_seen"], b["report_amount"], b["detail"]) == (
        "t1",
        "t2",
        "3",
        "e",
    )
    assert b["resolved_at"] is None
    assert rows[(D1, "missing_in_ledger", "0xa")]["resolved_at"] == "t2"
    assert rows[(D2, "missing_in_ledger", "0xother")]["resolved_at"] is None
    assert save(db, D1, [finding("missing_in_ledger", "0xa")], "t3") == []
    rows = state(db)
    a = rows[(D1, "missing_in_ledger", "0xa")]
    assert (a["resolved_at"], a["last_seen"], a["first_seen"]) == (None, "t3", "t1")
    assert rows[(D1, "amount_differs", "tx-b")]["resolved_at"] == "t3"
    assert [f["subject"] for f in fs.findings_of_day(db, D1)] == ["0xa"]


def test_a_drift_stays_open_until_a_check_no_longer_sees_it(db: sqlite_utils.Database) -> None:
    """A held-balance drift is dated the day it was read: a run of another day that still sees
    it keeps it open; the first run that does not see it resolves it, whatever its day."""
    drift = finding(DRIFT, "1001 USDT", day=D0, detail="held 5, provider 4")
    save(db, D1, [drift], "t1")
    save(db, D2, [drift], "t2")
    assert [(d["day"], d["subject"], d["last_seen"]) for d in fs.open_drift(db)] == [
        (D0, "1001 USDT", "t2")
    ]
    save(db, D1, [finding(DRIFT, "1001 USDC", day=D1)], "t3")
    assert [(d["day"], d["subject"]) for d in fs.open_drift(db)] == [(D1, "1001 USDC")]
    assert state(db)[(D0, DRIFT, "1001 USDT")]["resolved_at"] == "t3"
    save(db, D1, [finding(DRIFT, "1001 USDC", day=D1), finding(DRIFT, "2002 USDT", day=D0)], "t4")
    assert [d["subject"] for d in fs.open_drift(db)] == ["2002 USDT", "1001 USDC"]


def test_runs_say_what_was_reconciled_and_status_shows_it(db: sqlite_utils.Database) -> None:
    """The last run (whatever its outcome), the latest day a run completed, whether a day was
    reconciled, and what `status` shows; none of it before any run or before the table."""
    bare = sqlite_utils.Database(memory=True)
    assert fs.reconciliation_status(bare) is None
    assert fs.last_run(db) is None
    assert fs.last_reconciled_day(db) is None
    empty = fs.reconciliation_status(db)
    assert empty == {"lastRun": None, "lastReconciledDay": None, "openFindings": {}}
    with db.conn:
        fs.record_run(db, D0, started_at="s0", finished_at="f0", outcome="clean", findings=0)
        fs.record_run(db, D1, started_at="s1", finished_at="f1", outcome="findings", findings=2)
        fs.record_run(
            db, D2, started_at="s2", finished_at="f2", outcome="failed", findings=0, error="boom"
        )
    save(db, D1, [finding("missing_in_ledger", "0xa"), finding("missing_in_ledger", "0xb")], "t")
    save(db, D0, [finding("amount_differs", "tx-c", day=D0)], "t")
    assert fs.last_run(db) == {
        "id": 3,
        "day": D2,
        "started_at": "s2",
        "finished_at": "f2",
        "outcome": "failed",
        "findings": 0,
        "error": "boom",
        "ledger_mark": None,
    }
    assert fs.last_reconciled_day(db) == D1
    assert (fs.day_reconciled(db, D0), fs.day_reconciled(db, D1)) == (True, True)
    assert fs.day_reconciled(db, D2) is False
    assert fs.reconciliation_status(db) == {
        "lastRun": {
            "day": D2,
            "outcome": "failed",
            "findings": 0,
            "finishedAt": "f2",
            "error": "boom",
        },
        "lastReconciledDay": D1,
        "openFindings": {"missing_in_ledger": 2, "amount_differs": 1},
    }


def test_lists_of_findings_a_person_reads(db: sqlite_utils.Database) -> None:
    """Open findings (neither resolved nor acknowledged) oldest day first, pages latest day
    first, a period (every finding), one finding, and a search by transactionId or txHash."""
    save(db, D0, [finding("missing_in_ledger", "0xa", day=D0, tx_hash="0xAAA")], "t")
    save(
        db,
        D1,
        [
            finding("amount_differs", "tx-b", transaction_id="tx-b", tx_hash="0xbbb"),
            finding("missing_in_ledger", "0xc", tx_hash="0xccc"),
        ],
        "t",
    )
    save(db, D2, [finding("missing_in_report", "tx-d", day=D2, transaction_id="tx-d")], "t")
    save(db, D2, [], "t2")  # tx-d resolved
    ids = {f["subject"]: f["id"] for f in fs.findings_between(db, D0, D2)}
    with db.conn:
        assert fs.acknowledge(db, ids["tx-b"], by="ana", note="known", now="t3") is True

    def subjects(rows: list[dict[str, Any]]) -> list[str]:
        return [r["subject"] for r in rows]

    assert subjects(fs.open_findings(db)) == ["0xa", "0xc"]
    assert subjects(fs.open_findings(db, limit=1)) == ["0xa"]
    assert fs.open_counts_by_kind(db) == {"missing_in_ledger": 2}
    assert subjects(fs.page_findings(db, open_only=True, limit=10, offset=0)) == ["0xc", "0xa"]
    assert subjects(fs.page_findings(db, open_only=False, limit=10, offset=0)) == [
        "tx-d",
        "tx-b",
        "0xc",
        "0xa",
    ]
    assert subjects(fs.page_findings(db, open_only=False, limit=2, offset=1)) == ["tx-b", "0xc"]
    assert subjects(fs.findings_between(db, D1, D2)) == ["tx-b", "0xc", "tx-d"]
    assert subjects(fs.findings_between(db, D0, D0)) == ["0xa"]
    # The export's chunks: after a (day, id) key, a day's findings cut in the middle.
    chunk = fs.findings_between_after(db, D0, D2, None, limit=2)
    assert subjects(chunk) == ["0xa", "tx-b"]
    after = (chunk[-1]["day"], chunk[-1]["id"])
    assert subjects(fs.findings_between_after(db, D0, D2, after, limit=5)) == ["0xc", "tx-d"]
    assert subjects(fs.findings_between_after(db, D1, D1, (D0, 999), limit=5)) == ["tx-b", "0xc"]
    assert subjects(fs.search_findings(db, "0xccc", limit=0)) == []
    assert subjects(fs.findings_of_day(db, D2)) == []
    got = fs.get_finding(db, ids["tx-b"])
    assert got is not None and (got["subject"], got["acknowledged_by"]) == ("tx-b", "ana")
    assert fs.get_finding(db, 999) is None
    assert subjects(fs.search_findings(db, "tx-b")) == ["tx-b"]
    assert subjects(fs.search_findings(db, "0xaaa")) == ["0xa"]
    assert subjects(fs.search_findings(db, "0XCCC")) == ["0xc"]
    assert fs.search_findings(db, "tx-none") == []


def test_a_search_lists_the_latest_fifty(db: sqlite_utils.Database) -> None:
    """One txHash found on 55 days: the 50 latest days, latest first."""
    days = [f"2026-10-{d:02d}" for d in range(1, 32)] + [f"2026-11-{d:02d}" for d in range(1, 25)]
    for day in days:
        save(db, day, [finding("missing_in_ledger", "0xa", day=day, tx_hash="0xa")], "t")
    found = fs.search_findings(db, "0xA")
    assert [f["day"] for f in found] == sorted(days, reverse=True)[:50]


def test_a_failed_run_is_alerted_once_per_day(db: sqlite_utils.Database) -> None:
    """The reconcile_failed alert queued for a day is found for that day only."""
    with db.conn:
        queue_alert(
            db,
            transaction_id=None,
            condition="reconcile_failed",
            severity="critical",
            trigger="reconcile_failed",
            once_per=D1,
        )
        queue_alert(
            db,
            transaction_id=None,
            condition="other",
            severity="warning",
            trigger="reconcile_finding",
            once_per=D2,
        )
    assert fs.failure_alerted(db, D1) is True
    assert fs.failure_alerted(db, D2) is False
    assert fs.failure_alerted(db, D0) is False


def book_credited(db: sqlite_utils.Database, tx: str, day: str, booked_at: str) -> None:
    """A ledger row of `tx` booked at `booked_at`, its credit at the provider on `day` 12:00."""
    ledger.book_once(
        db,
        transaction_id=tx,
        wallet_id=1,
        wallet_name="w",
        currency="USDT",
        network="TRON",
        amount="1",
        from_address=None,
        tx_hash=None,
        trigger="credited",
    )
    db.execute("UPDATE ledger SET booked_at = ? WHERE transaction_id = ?", [booked_at, tx])
    credited = int(datetime.fromisoformat(f"{day}T12:00:00+00:00").timestamp() * 1000)
    db.execute(
        "INSERT INTO deposits (transaction_id, fact_time) VALUES (?, ?)",
        [tx, json.dumps({"credit_status": credited})],
    )


def run(db: sqlite_utils.Database, day: str, mark: str | None, started: str = "s") -> None:
    """A completed (clean) run of `day` that compared the ledger side `mark`."""
    fs.record_run(
        db, day, started_at=started, finished_at="f", outcome="clean", findings=0, ledger_mark=mark
    )


def test_days_due_compare_the_ledger_side_a_run_saw(db: sqlite_utils.Database) -> None:
    """A completed run's ledger side unchanged: not due; a row booked or moved onto the day
    since: due; a run recorded without its mark (before the mark was kept): due when a row of
    its day was booked after it started. A failed run stands for no run."""
    with db.conn:
        book_credited(db, "A", D0, f"{D0}T10:00:00.000Z")
        book_credited(db, "B", D1, f"{D1}T10:00:00.000Z")
        run(db, D0, fs.ledger_mark(["A"]), f"{D1}T02:30:00.000Z")
        run(db, D1, None, f"{D2}T02:30:00.000Z")
        fs.record_run(
            db, D2, started_at="s", finished_at="f", outcome="failed", findings=0, error="x"
        )
    assert fs.days_due(db, D0, D2) == [(D2, "not reconciled")]
    with db.conn:
        book_credited(db, "C", D0, f"{D2}T09:00:00.000Z")  # credited D0, booked two days later
        book_credited(db, "D", D1, f"{D2}T09:00:00.000Z")  # after D1's run recorded no mark
    assert fs.days_due(db, D0, D2) == [
        (D0, "ledger changed since its run"),
        (D1, "ledger changed since its run"),
        (D2, "not reconciled"),
    ]
    assert fs.ledger_mark(["C", "A"]) == fs.ledger_mark(["A", "C"]) != fs.ledger_mark(["A"])


def test_days_due_without_a_run(db: sqlite_utils.Database) -> None:
    """Before any run only the last day and days with bookings are due; once a run completed,
    every later day no run completed is due, with or without bookings, an earlier one only
    with bookings. A day whose run compared no rows stays done while it has none; so does a
    run without a mark whose day has no row, or whose rows were all booked before it started.
    Rows of as many ids but other ones are another ledger side."""
    d3, d4 = "2026-11-22", "2026-11-23"
    assert fs.days_due(db, D0, D2) == [(D2, "not reconciled")]
    with db.conn:
        book_credited(db, "A", D0, f"{D0}T10:00:00.000Z")
    assert fs.days_due(db, D0, D2) == [(D0, "not reconciled"), (D2, "not reconciled")]
    with db.conn:
        run(db, D1, fs.ledger_mark([]))
    assert fs.days_due(db, "2026-11-18", d3) == [
        (D0, "not reconciled"),
        (D2, "not reconciled"),
        (d3, "not reconciled"),
    ]
    with db.conn:
        run(db, D0, None, f"{D0}T10:00:00.000Z")  # started as A was booked: A was seen
        run(db, D2, fs.ledger_mark([]))
        run(db, d3, fs.ledger_mark(["Z"]))
        book_credited(db, "B", d3, f"{d3}T10:00:00.000Z")
        run(db, d4, None, f"{d4}T02:30:00.000Z")
    assert fs.days_due(db, D0, d4) == [(d3, "ledger changed since its run")]
    with db.conn:
        # Booked after d4's run (without a mark) started, then one booked before it: the
        # latest booking counts, whatever order the rows are read in.
        book_credited(db, "X", d4, f"{d4}T05:00:00.000Z")
        book_credited(db, "Y", d4, f"{d4}T01:00:00.000Z")
    assert fs.days_due(db, d4, d4) == [(d4, "ledger changed since its run")]
    with db.conn:
        # Booked two days before its credit day began: before the day the query reads from.
        book_credited(db, "E", D2, "2026-11-19T23:00:00.000Z")
    assert fs.days_due(db, D2, D2) == []


async def test_days_due_read_the_credit_day_on_either_engine(store: Store) -> None:
    """A booking credited on a day and booked on a later one makes the credit day due."""

    def write(db: Any) -> None:
        book_credited(db, "A", D0, f"{D2}T10:00:00.000Z")
        run(db, D1, fs.ledger_mark([]))

    await store.write(write)
    due = await store.read(lambda db: fs.days_due(db, D0, D2))
    assert due == [(D0, "not reconciled"), (D2, "not reconciled")]
