"""The verification read a few rows at a time: entries, ledger rows and submissions on either
side of a chunk's edge are checked as in one read; a row edited or inserted by hand with an entry
appended for it is found; a purge verifies; an entry removed is a gap. On SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from tests.support.journalrows import book, by_hand, drop_append_only, purge, submit
from tests.support.stores import StoreMaker
from worker.store import journal, submissions
from worker.store.sqlitestore import Store
from worker.store.verification import Verification, verify

PAYER = {"payerType": "ENTITY", "fullName": "Example Trading Ltd", "countryCode": "SG"}


async def verified(store: Store, chunk: int = 2, **kw: Any) -> Verification:
    return await verify(store.read, at="2026-05-04T03:00:00.000Z", chunk=chunk, **kw)


async def test_everything_across_chunk_edges_verifies(store: Store) -> None:
    def write(db: Any) -> list[int]:
        ids = []
        for n in range(1, 6):
            book(db, f"tx-{n}", amount=f"{n}.5")
            ids.append(submit(db, f"tx-{n}", {**PAYER, "fullName": f"Payer {n}"}))
        purge(db, ids[:3])
        return ids

    await store.write(write)
    head = await store.read(journal.head)
    for chunk in (1, 2, 3, 1000):
        outcome = await verified(store, chunk=chunk)
        assert outcome.problem is None, chunk
        assert (outcome.entries, outcome.head) == (11, head)
        assert (outcome.ledger_rows, outcome.submissions) == (5, 5)


async def test_a_row_edited_and_booked_again_by_hand_is_found(store: Store) -> None:
    """A row edited by hand and a correctly chained entry appended for it (anyone with write
    access can append): the deposit is booked twice in the journal, which no booking does."""

    def write(db: Any) -> None:
        book(db, "tx-1")
        book(db, "tx-2")
        db.execute("UPDATE ledger SET amount = '1000000' WHERE transaction_id = 'tx-1'")
        row = db.execute(
            f"SELECT {', '.join(journal.LEDGER_FIELDS)} FROM ledger WHERE transaction_id = 'tx-1'"
        ).fetchone()
        body = journal.ledger_body(dict(zip(journal.LEDGER_FIELDS, tuple(row), strict=True)))
        journal.append(db, journal.BOOKED, "tx-1", body)

    await store.write(write)
    outcome = await verified(store)
    # The row is compared with the deposit's first entry, not with the one appended later.
    assert (
        outcome.problem == "ledger row tx-1: amount differs from journal entry 1 (edited by hand?)"
    )


async def test_a_second_entry_booking_a_deposit_is_found(store: Store) -> None:
    def write(db: Any) -> None:
        first = book(db, "tx-1")
        journal.append(db, journal.BOOKED, "tx-1", first.body)

    await store.write(write)
    outcome = await verified(store)
    assert outcome.problem == (
        "journal entry 2 (booked tx-1): a second entry booking the deposit (the first is entry"
        " 1); a deposit is booked once (appended by hand?)"
    )


async def test_a_row_inserted_and_adopted_by_hand_is_found(store: Store) -> None:
    """A row inserted by hand with an `adopted` entry appended after the journal began."""

    def write(db: Any) -> None:
        book(db, "tx-1")
        db.execute(
            "INSERT INTO ledger (transaction_id, amount, currency, booked_at, trigger)"
            " VALUES ('tx-forged', '500', 'USDT', '2026-05-01T00:00:00.000Z', 'credited')"
        )
        row = db.execute(
            f"SELECT {', '.join(journal.LEDGER_FIELDS)} FROM ledger"
            " WHERE transaction_id = 'tx-forged'"
        ).fetchone()
        body = journal.ledger_body(dict(zip(journal.LEDGER_FIELDS, tuple(row), strict=True)))
        journal.append(db, journal.ADOPTED, "tx-forged", body)

    await store.write(write)
    outcome = await verified(store)
    assert outcome.problem is not None
    assert outcome.problem.startswith("journal entry 2 (adopted tx-forged): an adopted entry")


async def test_a_submission_retried_under_its_action_keeps_each_payload(store: Store) -> None:
    """A failed submission retried (`retry-failed`) after its profile was corrected sends
    another payload under the same action: each payload is kept with its entry, and the
    journal verifies (it once kept the first only, and verify called the second tampered);
    the same payload sent again adds an entry and no record."""

    def write(db: Any) -> int:
        action_id = submit(db, "tx-1", PAYER)
        for payload in ({**PAYER, "fullName": "Example Trading Pte Ltd"}, PAYER):
            digest = submissions.record_sent(
                db,
                action_id=action_id,
                transaction_id="tx-1",
                profile="acme",
                body=payload,
                sent_at="2026-01-03T03:04:05.000Z",
                outcome="done",
            )
            body = {
                "action_id": action_id,
                "profile": "acme",
                "fields": submissions.field_names(payload),
                "payload_sha256": digest,
                "outcome": "done",
            }
            journal.append(db, journal.SUBMITTED, "tx-1", body)
        return action_id

    action_id = await store.write(write)
    kept = await store.read(lambda db: submissions.of_deposit(db, "tx-1"))
    assert [k["action_id"] for k in kept] == [action_id, action_id]
    outcome = await verified(store)
    assert outcome.problem is None and outcome.submissions == 2


async def test_an_entry_removed_by_hand_is_a_gap(store: Store, make_store: StoreMaker) -> None:
    await store.write(lambda db: [book(db, f"tx-{n}") for n in range(1, 5)])
    storage = make_store.storage()
    by_hand(storage, *drop_append_only(storage), "DELETE FROM journal WHERE seq = 3")
    outcome = await verified(store)
    assert outcome.problem == "journal entry 3 is missing (the next one is 4)"
    # Verified up to the entry before the gap.
    assert outcome.entries == 2 and outcome.head is not None and outcome.head.seq == 2


async def test_the_last_entries_removed_are_found_by_an_anchor(
    store: Store, make_store: StoreMaker
) -> None:
    """Removing the newest entries with their rows leaves a shorter chain that holds: only a
    head kept elsewhere shows what is gone."""
    await store.write(lambda db: [book(db, f"tx-{n}") for n in range(1, 5)])
    kept = await store.read(journal.head)
    assert kept is not None
    storage = make_store.storage()
    by_hand(
        storage,
        *drop_append_only(storage),
        "DELETE FROM journal WHERE seq = 4",
        "DELETE FROM ledger WHERE transaction_id = 'tx-4'",
    )
    assert (await verified(store)).problem is None
    outcome = await verified(store, anchor=kept)
    assert outcome.problem == (
        "the journal ends at entry 3, before the anchor's entry 4: entries were removed, or the"
        " anchor is another database's"
    )
