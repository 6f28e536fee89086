"""The findings table: an acknowledgement stands (never overwritten), on both engines and under
two PostgreSQL connections acknowledging at the same moment."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.support.pgcluster import Cluster
from worker.store import findings as findings_store
from worker.store import journal
from worker.store.findings import Finding
from worker.store.pg import PgDatabase, connect
from worker.store.pgstore import PgStore
from worker.store.sqlitestore import Store


def _one_finding(db: object) -> int:
    found = [Finding(day="2026-11-20", kind="missing_in_ledger", subject="0xabc")]
    return findings_store.save_findings(db, "2026-11-20", found, "2026-11-21T00:00:00Z")[0]  # type: ignore[arg-type]


def differs_run(report: str | None, now: str) -> Any:
    """A run's job that finds TX1's amounts differ on 2026-11-20: ledger 100, report `report`;
    it returns the ids of the findings new or open again."""

    def job(db: Any) -> list[int]:
        found = [
            Finding(
                day="2026-11-20",
                kind="amount_differs",
                subject="TX1",
                transaction_id="TX1",
                ledger_amount="100",
                report_amount=report,
            )
        ]
        return findings_store.save_findings(db, "2026-11-20", found, now)

    return job


async def test_a_second_acknowledgement_changes_nothing(store: Store) -> None:
    """The first acknowledgement's who, when and why stand; the second is refused."""
    finding_id = await store.write(_one_finding)

    async def ack(by: str, now: str) -> bool:
        return await store.write(
            lambda db: findings_store.acknowledge(db, finding_id, by=by, note=by, now=now)
        )

    assert await ack("ana", "2026-11-21T01:00:00Z") is True
    assert await ack("bob", "2026-11-21T02:00:00Z") is False
    row = await store.read(lambda db: findings_store.get_finding(db, finding_id))
    assert row is not None
    assert (row["acknowledged_by"], row["acknowledged_at"], row["note"]) == (
        "ana",
        "2026-11-21T01:00:00Z",
        "ana",
    )
    assert (
        await store.write(lambda db: findings_store.acknowledge(db, 999, by="x", note="x", now="x"))
        is False
    )


async def test_two_connections_acknowledging_at_once_one_wins(pg_cluster: Cluster) -> None:
    """PostgreSQL, READ COMMITTED: while one connection's acknowledgement is uncommitted, a
    second one waits; once the first commits, the second acknowledges nothing."""
    url = pg_cluster.create_database()
    try:
        store = PgStore(url)
        await store.open()
        finding_id = await store.write(_one_finding)
        await store.close()
        one, two = PgDatabase(connect(url)), PgDatabase(connect(url))
        try:
            one.execute("BEGIN")
            first = findings_store.acknowledge(one, finding_id, by="ana", note="a", now="t1")  # type: ignore[arg-type]
            assert first is True
            outcome: list[bool] = []

            def second() -> None:
                two.execute("BEGIN")
                outcome.append(
                    findings_store.acknowledge(two, finding_id, by="bob", note="b", now="t2")  # type: ignore[arg-type]
                )
                two.execute("COMMIT")

            thread = threading.Thread(target=second)
            thread.start()
            thread.join(0.5)  # the second waits on the first's row lock
            one.execute("COMMIT")
            thread.join(10)
            assert not thread.is_alive(), "the second acknowledgement never returned"
            assert outcome == [False]
            row = one.execute(
                "SELECT acknowledged_by, note FROM findings WHERE id=?", [finding_id]
            ).fetchone()
            assert tuple(row) == ("ana", "a")
        finally:
            one.close()
            two.close()
    finally:
        pg_cluster.drop_database(url)


async def test_an_acknowledged_finding_seen_with_other_amounts_is_open_and_new_again(
    store: Store,
) -> None:
    """Acknowledged for ledger 100 against report 90: the next run finding report 10 is another
    difference, open again (and reported as new), the earlier acknowledgement kept in its note;
    the same amounts written otherwise ("90.0") leave the acknowledgement standing."""
    run = differs_run

    [finding_id] = await store.write(run("90", "2026-11-21T00:00:00Z"))  # type: ignore[arg-type]
    assert await store.write(
        lambda db: findings_store.acknowledge(db, finding_id, by="ana", note="fee", now="t1")
    )
    assert await store.write(run("90.0", "2026-11-21T01:00:00Z")) == []  # type: ignore[arg-type]
    assert await store.read(lambda db: findings_store.open_findings(db)) == []
    assert await store.write(run("10", "2026-11-21T02:00:00Z")) == [finding_id]  # type: ignore[arg-type]
    [row] = await store.read(lambda db: findings_store.open_findings(db))
    assert row["id"] == finding_id and row["report_amount"] == "10"
    assert row["acknowledged_at"] is None
    assert "acknowledged by ana at t1 for ledger 100, report 90" in row["note"]
    assert await store.write(
        lambda db: findings_store.acknowledge(db, finding_id, by="bob", note="ok", now="t2")
    )


@pytest.mark.parametrize(
    ("first", "then", "open_again"),
    [
        (None, "10", True),
        ("10", None, True),
        (None, None, False),
        ("n/a", "n/b", True),
        ("n/a", "n/a", False),
    ],
)
async def test_an_amount_stated_or_gone_or_unreadable_is_compared_as_written(
    store: Store, first: str | None, then: str | None, open_again: bool
) -> None:
    """An acknowledged finding whose report amount was not stated and now is (or was and now is
    not) is another difference, open again; two amounts that are no number are compared as
    written; not stated twice is the same difference."""
    run = differs_run
    [finding_id] = await store.write(run(first, "2026-11-21T00:00:00Z"))
    assert await store.write(
        lambda db: findings_store.acknowledge(db, finding_id, by="ana", note="seen", now="t1")
    )
    again = await store.write(run(then, "2026-11-21T01:00:00Z"))
    assert again == ([finding_id] if open_again else [])
    still_open = await store.read(lambda db: findings_store.open_findings(db))
    assert [r["id"] for r in still_open] == ([finding_id] if open_again else [])


async def test_a_run_is_journalled_with_its_day_outcome_count_and_ledger_mark(store: Store) -> None:
    """Each run's RECONCILED journal entry names its day and holds what the run recorded, for
    an auditor reading the journal alone."""
    mark = findings_store.ledger_mark(["TX1", "TX2"])

    def run(db: Any) -> None:
        findings_store.record_run(
            db,
            "2026-11-20",
            started_at="2026-11-21T02:30:00.000Z",
            finished_at="2026-11-21T02:30:01.000Z",
            outcome="findings",
            findings=2,
            ledger_mark=mark,
        )

    await store.write(run)
    (entry,) = await store.read(lambda db: journal.entries_about(db, "day:2026-11-20"))
    assert entry.kind == journal.RECONCILED
    assert dict(entry.body) == {
        "day": "2026-11-20",
        "outcome": "findings",
        "findings": 2,
        "ledger_mark": mark,
    }
