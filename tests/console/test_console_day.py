"""The console for a day's work, over HTTP against a real stack: search by transactionId,
txHash or address; the ledger and the findings of a range of days as CSV (no cell a
spreadsheet would run, money exact); the deposits completed but not booked."""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from tests.support.stacks import MakeStack
from worker.config.shipped import shipped_rules
from worker.console import export
from worker.console.export import FINDING_COLUMNS, cell, to_csv
from worker.console.queries import SEARCH_LIMIT
from worker.dev.harness import Stack
from worker.errors import StorageError
from worker.store import abnormal, ledger
from worker.store import findings as findings_store
from worker.store.findings import Finding

EVIL_WALLET = '=HYPERLINK("http://evil.invalid","open")'
SOURCE = "TConsoleDayPayer0000000000000001"
HOLD_RULES = """\
wallet: 1003
rules:
  - name: tell a person, book nothing
    "on": [needs_details]
    then: [{alert: {severity: warning}}]
"""


def _client() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def _log_in(session: aiohttp.ClientSession, stack: Stack) -> str:
    """Log in; the session's CSRF token."""
    async with session.get(stack.console_url + "/login") as answer:
        found = re.search(r'name="csrf" value="([^"]+)"', await answer.text())
    assert found
    async with session.post(
        stack.console_url + "/login",
        data={"csrf": found.group(1), "token": stack.console_token, "operator": "ana"},
    ) as answer:
        found = re.search(r'name="csrf" value="([^"]+)"', await answer.text())
    assert found
    return found.group(1)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str, str]:
    async with session.get(url, allow_redirects=False) as answer:
        return answer.status, answer.headers.get("Content-Disposition", ""), await answer.text()


async def _state(stack: Stack, tx: str) -> str | None:
    deposit = await stack.deposit(tx)
    return None if deposit is None else deposit.state.value


async def _booked(stack: Stack) -> str:
    """A deposit into wallet 1002 (renamed to a formula) submitted with its fallback profile,
    approved and booked; its transactionId."""
    stack.sandbox.put_wallet(1002, EVIL_WALLET, False)
    tx = str(stack.sandbox.inject_deposit(1002, "USDT", "TRON", "125.50", SOURCE)["transactionId"])
    await stack.wait_for(lambda: _is(stack, tx, "submitted"), what="the submission")
    stack.sandbox.approve_review(tx)
    await stack.wait_for(lambda: _in_ledger(stack, tx), what="the booking")
    return tx


async def _is(stack: Stack, tx: str, state: str) -> bool:
    return await _state(stack, tx) == state


async def _in_ledger(stack: Stack, tx: str) -> bool:
    return any(e["transaction_id"] == tx for e in await stack.ledger())


async def _unbooked(stack: Stack) -> str:
    """A deposit into wallet 1003, whose rules book nothing, blocked then released: credited
    and completed at the provider, not in the ledger."""
    stack.sandbox.put_wallet(1003, "Hold", False)
    tx = str(stack.sandbox.inject_deposit(1003, "USDT", "TRON", "9.99", SOURCE)["transactionId"])
    await stack.wait_for(lambda: _is(stack, tx, "needs_details"), what="the deposit")
    stack.sandbox.block(tx)
    stack.sandbox.release(tx)
    await stack.wait_for(lambda: _is(stack, tx, "completed"), what="the release")
    return tx


def _rules(tmp_path: Path) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir()
    shutil.copy(shipped_rules() / "default.yaml", folder / "default.yaml")
    (folder / "wallet-1003.yaml").write_text(HOLD_RULES)
    return folder


@pytest.mark.usefixtures("engine")  # its stacks on SQLite and on PostgreSQL
async def test_search_export_and_unbooked(start_stack: MakeStack, tmp_path: Path) -> None:
    """A booked deposit is found by its transactionId, its txHash in capitals and its source
    address; it is in the day's ledger CSV with its wallet's formula name escaped and its
    amount exact. A deposit released but never booked is listed as not booked, the booked one
    is not."""
    stack = await start_stack(console=True, rules=_rules(tmp_path))
    booked = await _booked(stack)
    unbooked = await _unbooked(stack)
    tx_hash = stack.sandbox.snapshot()["orders"][0]["transactionHash"]
    today = dt.datetime.now(dt.UTC).date().isoformat()
    base = stack.console_url
    async with _client() as session:
        await _log_in(session, stack)
        for query in (booked, tx_hash.upper(), SOURCE.lower()):
            status, _, html = await _get(session, f"{base}/search?q={query}")
            assert status == 200 and f'href="/deposits/{booked}"' in html, query
        status, _, html = await _get(session, f"{base}/search?q=T-nothing-like-it")
        assert status == 200 and "No deposit has this transactionId" in html
        assert (await _get(session, f"{base}/search?q={'x' * 201}"))[0] == 400

        status, disposition, text = await _get(session, f"{base}/export/ledger.csv?from={today}")
        assert status == 200
        assert disposition == f'attachment; filename="depositd-ledger-{today}-to-{today}.csv"'
        rows = list(csv.DictReader(io.StringIO(text)))
        (row,) = [r for r in rows if r["transactionId"] == booked]
        assert row["walletName"] == "'" + EVIL_WALLET
        assert row["amount"] == "125.50" and row["currency"] == "USDT"
        assert row["fromAddress"] == SOURCE and row["bookedAt"].startswith(today)
        assert unbooked not in text
        yesterday = (dt.date.fromisoformat(today) - dt.timedelta(days=1)).isoformat()
        _, _, text = await _get(
            session, f"{base}/export/ledger.csv?from={yesterday}&to={yesterday}"
        )
        assert text == "transactionId,walletId,walletName,currency,network,amount,fromAddress," \
            "txHash,bookedAt,trigger\r\n"  # fmt: skip

        status, _, html = await _get(session, f"{base}/unbooked")
        assert status == 200
        assert f'href="/deposits/{unbooked}"' in html and booked not in html


@pytest.mark.usefixtures("engine")  # its stacks on SQLite and on PostgreSQL
async def test_findings_export_of_a_day_range(start_stack: MakeStack) -> None:
    """A day reconciled with a report record no deposit backs has a finding; the findings CSV
    of a range holding that day lists it with its exact amount and its formula-like txHash
    escaped; a range that is no range is refused (400)."""
    stack = await start_stack(console=True)
    today = dt.datetime.now(dt.UTC).date().isoformat()
    stack.sandbox.add_discrepancy(
        {
            "kind": "extra",
            "date": today,
            "asset": "USDT",
            "network": "TRON",
            "amount": "42.000100",
            "txHash": "-2+3+cmd",
        }
    )
    base = stack.console_url
    async with _client() as session:
        csrf = await _log_in(session, stack)
        async with session.post(
            f"{base}/reconcile", data={"csrf": csrf, "day": today, "back": "/findings"}
        ) as answer:
            assert answer.status == 200
        week = (dt.date.fromisoformat(today) - dt.timedelta(days=6)).isoformat()
        status, _, text = await _get(session, f"{base}/export/findings.csv?from={week}&to={today}")
        assert status == 200
        rows = list(csv.DictReader(io.StringIO(text)))
        (row,) = [r for r in rows if r["kind"] == "missing_in_ledger"]
        assert row["date"] == today and row["reportAmount"] == "42.000100"
        assert row["txHash"] == "'-2+3+cmd"
        for bad in (f"from={today}&to={week}", "from=yesterday", f"from=2020-01-01&to={today}"):
            assert (await _get(session, f"{base}/export/findings.csv?{bad}"))[0] == 400, bad
        # The report's txHash finds the finding (it has no deposit to find).
        status, _, html = await _get(session, f"{base}/search?q={quote('-2+3+CMD')}")
        assert status == 200 and 'id="search-findings"' in html and "missing_in_ledger" in html

        # An abnormal fund is found by its txHash.
        stack.sandbox.inject_abnormal_fund(
            {
                "amount": "5",
                "currency": "USDT",
                "network": "TRON",
                "fromAddress": "TFromAbnormal",
                "toAddress": "TToAbnormal",
                "txHash": "0xFEED0042",
            },
            notify=True,
        )

        async def stored() -> bool:
            found = await stack.store.read(
                lambda db: abnormal.search_abnormal(db, "0xfeed0042", limit=1)
            )
            return bool(found)

        await stack.wait_for(stored, what="the abnormal fund")
        status, _, html = await _get(session, f"{base}/search?q=0xfeed0042")
        # Shown as stored: a hex txHash in its canonical form, lower-cased where it entered.
        assert status == 200 and 'id="search-abnormal"' in html and "0xfeed0042" in html
        assert 'id="search-abnormal-more"' not in html

        # Many abnormal funds under one txHash (dust sent in a loop): the page lists the
        # first SEARCH_LIMIT and says that more match.
        def dust(db: Any) -> None:
            for n in range(SEARCH_LIMIT + 5):
                row = {"id": f"AB-dust-{n:03d}", "amount": "0.01", "currency": "USDT"}
                abnormal.upsert_abnormal(
                    db, {**row, "tx_hash": "0xDUST"}, f"{today}T00:00:{n:02d}Z"
                )

        await stack.store.write(dust)
        status, _, html = await _get(session, f"{base}/search?q=0xdust")
        assert status == 200 and html.count("AB-dust-") == SEARCH_LIMIT
        assert "AB-dust-049" in html and "AB-dust-050" not in html
        assert 'id="search-abnormal-more"' in html and "more match" in html


def test_no_cell_is_a_formula_and_money_stays_exact() -> None:
    """Every text cell starting with = + - @ (or a tab or carriage return) gets a leading `'`;
    a money cell that is a plain decimal is written as it is; empty is empty."""
    for text in ("=1+1", "+1", "-1+2", "@SUM(A1)", "\tx", "\rx"):
        assert cell(text) == "'" + text
    assert cell("Acme =1") == "Acme =1" and cell(None) == "" and cell(1002) == "1002"
    assert cell("125.50", money=True) == "125.50" and cell("-0.000001", money=True) == "-0.000001"
    assert cell("-1+1", money=True) == "'-1+1"
    text = to_csv(
        FINDING_COLUMNS,
        [{key: None for _, key in FINDING_COLUMNS} | {"note": '=cmd|"/c calc"!A1', "id": 7}],
    )
    assert text.splitlines()[1].startswith("7,") and '"\'=cmd|""/c calc""!A1"' in text


@pytest.mark.usefixtures("engine")  # its stacks on SQLite and on PostgreSQL
async def test_exports_are_streamed_chunk_by_chunk_whole_and_in_order(
    start_stack: MakeStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger and findings CSVs of a range are sent as they are read (chunked, no length
    known beforehand, the console's security headers on them), a chunk of rows at a time:
    every row once, in order, across chunk edges that fall inside runs of equal booking times
    and days; a range with exactly a chunk's worth of rows ends too."""
    monkeypatch.setattr(export, "CHUNK", 4)
    stack = await start_stack(console=True)
    day = "2026-02-03"

    def fill(db: Any) -> None:
        for n in range(11):
            ledger.book_once(
                db,
                transaction_id=f"TX-{n:02d}",
                wallet_id=1001,
                wallet_name="w",
                currency="USDT",
                network="TRON",
                amount=f"{n}.5",
                from_address=None,
                tx_hash=None,
                trigger="credited",
            )
            # Three rows a second: chunks of four cut runs of equal times.
            db.execute(
                "UPDATE ledger SET booked_at = ? WHERE transaction_id = ?",
                [f"{day}T10:00:{n // 3:02d}.000Z", f"TX-{n:02d}"],
            )
        findings_store.save_findings(
            db,
            day,
            [Finding(day=day, kind="missing_in_ledger", subject=f"s{n}") for n in range(8)],
            f"{day}T03:00:00.000Z",
        )

    await stack.store.write(fill)
    base = stack.console_url
    async with _client() as session:
        await _log_in(session, stack)
        async with session.get(f"{base}/export/ledger.csv?from={day}") as answer:
            assert answer.status == 200
            assert answer.headers.get("Transfer-Encoding") == "chunked"
            assert "Content-Length" not in answer.headers
            assert answer.headers["X-Frame-Options"] == "DENY"
            assert answer.headers["Content-Type"] == "text/csv; charset=utf-8"
            text = await answer.text()
        rows = list(csv.DictReader(io.StringIO(text)))
        assert [r["transactionId"] for r in rows] == [f"TX-{n:02d}" for n in range(11)]
        assert [r["amount"] for r in rows] == [f"{n}.5" for n in range(11)]
        status, _, text = await _get(session, f"{base}/export/findings.csv?from={day}")
        assert status == 200
        assert [r["subject"] for r in csv.DictReader(io.StringIO(text))] == [
            f"s{n}" for n in range(8)
        ]

        # The store failing after the first chunk: the download is cut off, never a file
        # that ends as if it were whole.
        whole = ledger.booked_between_after

        def failing(db: Any, *args: Any, **kw: Any) -> Any:
            if args[2] is not None:
                raise StorageError("the store went away")
            return whole(db, *args, **kw)

        monkeypatch.setattr(ledger, "booked_between_after", failing)
        async with session.get(f"{base}/export/ledger.csv?from={day}") as answer:
            assert answer.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await answer.read()
