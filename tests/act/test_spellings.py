"""Values as the provider writes them (docs/design.md, "Provider values at the boundary"), on
both engines: "not known yet" as `""` or blanks, hashes and codes padded or in another case.
A credited deposit is booked once, with the canonical values, whatever the spelling of its
first fact; a second id of one transaction is held, not booked twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.booking import (
    NOW,
    Env,
    alerts,
    deliver,
    fact_of,
    ok,
    order,
    rows,
    webhook,
)
from worker.act.kinds.book import WAITING_FOR_TX_HASH
from worker.config.profiles import Profiles
from worker.store.schema import _migrate_canonical_deposits

DONE = {"status": "SUCCESS", "whiteListStatus": None}
LATER = 1_700_000_000_005


async def booked(env: Env) -> list[dict[str, Any]]:
    """The ledger, as a user reads it."""
    return await rows(
        env.store,
        "SELECT transaction_id, tx_hash, currency, network, amount, from_address FROM ledger"
        " ORDER BY transaction_id",
    )


async def deposit(env: Env, tx: str) -> dict[str, Any]:
    [row] = await rows(env.store, "SELECT * FROM deposits WHERE transaction_id = ?", tx)
    return row


@pytest.mark.parametrize("unknown", ["", "  ", "\t", " \u200b"])
async def test_a_txhash_first_written_empty_is_booked_once_the_hash_comes_by_poll(
    env: Env, unknown: str
) -> None:
    """A credited deposit whose first record has `transactionHash: ""` (or blanks) waits for
    its hash: nothing booked, the deposit's txHash unknown (so the detail poll reads it
    again); the next record with the hash books it once, with the hash."""
    await env.processor.observe_fact(fact_of(order("TXA", **DONE, transactionHash=unknown)))
    assert await booked(env) == []
    assert (await deposit(env, "TXA"))["tx_hash"] is None
    [held] = await rows(env.store, "SELECT outcome FROM actions WHERE action = 'book'")
    assert held["outcome"] == WAITING_FOR_TX_HASH
    env.provider.details["TXA"] = _detail(order("TXA", **DONE, transactionHash="0xFEED"))
    await env.poller.poll_detail()  # reads the deposit: its txHash is not known
    [row] = await booked(env)
    assert (row["transaction_id"], row["tx_hash"]) == ("TXA", "0xfeed")
    await env.poller.poll_detail()
    assert len(await booked(env)) == 1
    assert await alerts(env.store) == []


async def test_a_txhash_first_written_empty_is_booked_once_the_hash_comes_by_webhook(
    env: Env,
) -> None:
    """The webhook path: a DEPOSIT_ORDER_NOTIFICATION at SUCCESS with `transactionHash: ""`,
    then another with the hash: booked once, with it."""
    first = webhook("DEPOSIT_ORDER_NOTIFICATION", "TXW", NOW, status="SUCCESS", transactionHash="")
    await deliver(env.store, first)
    await env.processor.run_until_idle()
    assert await booked(env) == []
    assert (await deposit(env, "TXW"))["tx_hash"] is None
    second = webhook(
        "DEPOSIT_ORDER_NOTIFICATION", "TXW", NOW + 1, status="SUCCESS", transactionHash=" 0xBEEF "
    )
    await deliver(env.store, second)
    await env.processor.run_until_idle()
    assert [(r["transaction_id"], r["tx_hash"]) for r in await booked(env)] == [("TXW", "0xbeef")]


@pytest.mark.parametrize(
    ("field", "first", "real", "stored"),
    [
        ("currency", "", "USDT", "USDT"),
        ("currency", "  ", "usdt", "USDT"),
        ("currency", " USDT ", "USDT", "USDT"),
        ("network", "", "TRON", "TRON"),
        ("network", "tron ", "TRON", "TRON"),
        ("toAddress", "", "TMerchant", "TMerchant"),
        ("toAddress", " TMerchant", "TMerchant", "TMerchant"),
        ("fromAddress", "  ", "TPayer1", "TPayer1"),
        ("fromAddress", "TPayer1\n", "TPayer1", "TPayer1"),
    ],
)
async def test_a_blank_or_padded_first_value_then_the_real_one_is_no_conflict(
    env: Env, field: str, first: str, real: str, stored: str
) -> None:
    """A first record with a field blank or padded, then the real value: no fixed-field
    conflict, no hold, no alert; booked once with the canonical value."""
    await env.processor.observe_fact(fact_of(order("TXC", **DONE, **{field: first})))
    await env.processor.observe_fact(
        fact_of(order("TXC", **DONE, **{field: real}, updateTime=LATER))
    )
    assert await rows(env.store, "SELECT * FROM conflicts") == []
    assert await alerts(env.store) == []
    [row] = await booked(env)
    column = {"toAddress": "to_address", "fromAddress": "from_address"}.get(field, field)
    assert (await deposit(env, "TXC"))[column] == stored
    if column in ("currency", "network"):
        assert row[column] == stored  # the ledger waited for it


@pytest.mark.parametrize("unknown", ["", "  "])
async def test_a_deposit_is_never_booked_with_a_blank_currency(env: Env, unknown: str) -> None:
    """A credited deposit whose currency is written blank waits for it (a ledger row needs
    it); booked once a record states it."""
    await env.processor.observe_fact(fact_of(order("TXB", **DONE, currency=unknown)))
    assert await booked(env) == []
    [held] = await rows(env.store, "SELECT outcome FROM actions WHERE action = 'book'")
    assert held["outcome"].startswith("held: waiting for the currency")
    await env.processor.observe_fact(fact_of(order("TXB", **DONE, updateTime=LATER)))
    [row] = await booked(env)
    assert row["currency"] == "USDT"
    [*_, last] = await rows(env.store, "SELECT outcome FROM actions WHERE action = 'book'")
    assert last["outcome"] == "booked (the currency is known now)"


@pytest.mark.parametrize("spelling", ["0xABC ", " 0xabc", "0XABC", "0xAbC\t"])
async def test_a_padded_txhash_of_a_booked_transaction_is_held_not_booked(
    env: Env, spelling: str
) -> None:
    """A second transactionId for the same transaction and amount, its txHash written with
    blanks around or in another case: held as a likely duplicate with one critical alert;
    the ledger holds the money once."""
    await env.processor.observe_fact(fact_of(order("TXA", **DONE, transactionHash="0xabc")))
    await env.processor.observe_fact(fact_of(order("TXB", **DONE, transactionHash=spelling)))
    assert [r["transaction_id"] for r in await booked(env)] == ["TXA"]
    assert [a for a in await alerts(env.store) if a[0] == "TXB"] == [
        ("TXB", "duplicate_tx_hash", "critical")
    ]


async def test_a_padded_txhash_in_one_webhook_batch_is_held_not_booked(env: Env) -> None:
    """The batch booking statement: both ids in one processor batch, the second's txHash
    padded: one ledger row, the second held."""
    await deliver(
        env.store,
        webhook("DEPOSIT_ORDER_NOTIFICATION", "TXA", NOW, status="SUCCESS", transactionHash="0xab"),
    )
    await deliver(
        env.store,
        webhook(
            "DEPOSIT_ORDER_NOTIFICATION", "TXB", NOW + 1, status="SUCCESS", transactionHash="0xAB "
        ),
    )
    await env.processor.run_until_idle()
    assert [r["transaction_id"] for r in await booked(env)] == ["TXA"]
    assert ("TXB", "duplicate_tx_hash", "critical") in await alerts(env.store)


def test_a_padded_source_address_finds_its_stored_profile(tmp_path: Path) -> None:
    """A profile stored for an address is the one for a deposit from that address written
    with blanks around (the deposit's address is trimmed where it enters), and an address
    key written with blanks in the profiles file names the same address."""
    text = (
        "profiles:\n  p:\n    correspondentType: INDIVIDUAL\n    firstName: Ann\n"
        "    lastName: Lee\n    birthday: '1980-01-02'\n    countryCode: GB\n"
        "    residentialAddress: 1 Lane, Bristol\n"
        "    walletType: SELF_HOSTED\naddresses:\n  ' TPayer1 ': p\n"
    )
    path = tmp_path / "profiles.yaml"
    path.write_text(text)
    profiles = Profiles.load(path)
    fact = fact_of(order("TXP", fromAddress="  TPayer1\t"))
    assert fact.from_address == "TPayer1"
    match = profiles.for_deposit(1001, fact.from_address)
    assert match is not None and (match.name, match.via) == ("p", "address")


def _detail(record: dict[str, Any]) -> bytes:
    return ok(record)


async def test_stored_deposits_are_rewritten_into_the_canonical_forms(env: Env) -> None:
    """The upgrade's migration: a deposit stored with txHash `""`, a padded currency and
    address and a hex hash in capitals reads in the canonical forms (so the detail poll
    reads the first again); a deposit already canonical, and a base58 hash, are left as
    they are."""
    rows_in = [
        ("TXU1", "", " usdt ", "tron", " TPayer1\t", None),
        ("TXU2", "0XABCDEF", "USDT", "TRON", "TPayer1", "main"),
        ("TXU3", "5VfydnLu4XwV2H2dLHPv22JxhLbYJruaM9YTaGY30TZjd4re", "USDT", "TRON", "TP", "w"),
    ]
    for tx, tx_hash, currency, network, from_address, wallet_name in rows_in:
        await env.store.write(
            lambda db, v=(tx, tx_hash, currency, network, from_address, wallet_name): db.execute(
                "INSERT INTO deposits (transaction_id, tx_hash, currency, network, from_address,"
                " wallet_name, state, updated_at) VALUES (?, ?, ?, ?, ?, ?, 'credited',"
                " '2026-01-01T00:00:00.000Z')",
                list(v),
            )
        )
    await env.store.write(_migrate_canonical_deposits)
    got = await rows(
        env.store,
        "SELECT transaction_id, tx_hash, currency, network, from_address, wallet_name"
        " FROM deposits ORDER BY transaction_id",
    )
    assert [tuple(r.values()) for r in got] == [
        ("TXU1", None, "USDT", "TRON", "TPayer1", None),
        ("TXU2", "0xabcdef", "USDT", "TRON", "TPayer1", "main"),
        rows_in[2],
    ]
