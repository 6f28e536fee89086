"""`depositd backfill` and the full-history read against a fake provider history."""

from __future__ import annotations

import asyncio
import io
import os
import pty
import sqlite3
import subprocess
import sys
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from tests.support.configs import make_config, write_config
from tests.support.fakehistory import FakeHistory
from tests.support.processes import Processes
from worker.act.reactor import RuleReactor
from worker.clock import iso_from_ms, now_ms
from worker.commands.backfill import ProgressLine, backfill
from worker.commands.cli import main
from worker.config.settings import Settings, load_settings
from worker.dev.harness import shipped_profiles, shipped_rules
from worker.poll.catchup import HistoryReader, ReadStats, covered_until
from worker.provider.client import ProviderClient
from worker.schedule.catchup import DAY_MS, CatchUp, previous_day
from worker.service.bundle import load_bundle
from worker.store.sqlitestore import Store

ROOT = Path(__file__).resolve().parents[2]
BASE = now_ms() - 3_600_000  # the fake history starts an hour ago

MakeServer = Callable[..., Awaitable[TestServer]]


def backfill_config(tmp_path: Path, url: str, **scheduler: Any) -> Path:
    """A depositd.yaml for the fake provider at `url`, shipped rules and profiles."""
    cfg = make_config(
        tmp_path / "depositd.db",
        url,
        provider={"timeout_s": 5},
        webhook={"listen": "127.0.0.1:1"},
        scheduler={"page_size": 50, "catchup_window_s": 10, **scheduler},
        rules=str(shipped_rules()),
        profiles=str(shipped_profiles()),
        log={"level": "warning"},
    )
    return write_config(tmp_path, cfg)


async def serve_fake(aiohttp_server: MakeServer, fake: FakeHistory) -> str:
    """The fake history on a loopback port; its base URL."""
    server = await aiohttp_server(fake.app())
    return str(server.make_url("")).rstrip("/")


def db_rows(settings: Settings, sql: str) -> list[tuple[Any, ...]]:
    """Rows of a query on the test's database."""
    with sqlite3.connect(settings.storage.path) as conn:
        return [tuple(r) for r in conn.execute(sql)]


def snapshot(settings: Settings) -> tuple[Any, ...]:
    """Everything a second read must leave as it is."""
    return (
        db_rows(settings, "SELECT * FROM ledger ORDER BY transaction_id"),
        db_rows(settings, "SELECT transaction_id, state, emitted FROM deposits ORDER BY 1"),
        db_rows(settings, "SELECT id, action, status FROM actions ORDER BY id"),
        db_rows(settings, "SELECT COUNT(*) FROM facts WHERE changed = 1"),
    )


async def run_backfill(settings: Settings, since: int, until: int) -> tuple[int, str]:
    """backfill() in process with its output captured (not a terminal)."""
    out = io.StringIO()
    code = await backfill(settings, since, until, out=out, retries=0)
    return code, out.getvalue()


async def read_into(settings: Settings, start: int, end: int) -> tuple[ReadStats, int | None]:
    """A catch-up read (it may set the first mark) of [start, end]; its figures and the mark."""
    bundle = load_bundle(settings)
    reactor = RuleReactor(lambda: bundle.rules, lambda: bundle.profiles)
    store = Store(settings.storage.path)
    await store.open()
    try:
        async with ProviderClient.from_settings(settings.provider, retries=0) as client:
            reader = HistoryReader(client, store, lambda: reactor, page_size=50, max_pages=100)
            stats = await reader.read(start, end, 10_000, may_start=True)
        return stats, await store.read(covered_until)
    finally:
        await store.close()


async def test_backfill_books_each_deposit_once_and_a_second_run_changes_nothing(
    tmp_path: Path, aiohttp_server: MakeServer
) -> None:
    """Every deposit of the range is booked once; a backfill overlapping it changes nothing."""
    fake = FakeHistory(BASE, 250)
    settings = load_settings(backfill_config(tmp_path, await serve_fake(aiohttp_server, fake)))
    code, out = await run_backfill(settings, BASE, BASE + 25_000)
    assert code == 0, out
    assert "complete" in out and "new deposits 250" in out
    booked = db_rows(settings, "SELECT transaction_id FROM ledger")
    assert len(booked) == 250 == len(set(booked))
    before = snapshot(settings)

    code, out = await run_backfill(settings, BASE - 60_000, BASE + 60_000)
    assert code == 0, out
    assert "new deposits 0" in out and "new facts 0" in out
    assert snapshot(settings) == before


async def test_record_without_transaction_id_is_skipped_and_reported(
    tmp_path: Path, aiohttp_server: MakeServer
) -> None:
    """A history record without a transactionId is skipped, counted, and the rest is booked."""
    fake = FakeHistory(BASE, 20, no_id={7})
    settings = load_settings(backfill_config(tmp_path, await serve_fake(aiohttp_server, fake)))
    code, out = await run_backfill(settings, BASE, BASE + 5_000)
    assert code == 0, out
    assert "skipped records 1" in out
    assert len(db_rows(settings, "SELECT * FROM ledger")) == 19


async def test_backfill_cut_short_by_an_outage_exits_1_and_a_rerun_completes(
    tmp_path: Path, aiohttp_server: MakeServer
) -> None:
    """A provider failing mid-range makes backfill say INCOMPLETE and exit 1; run again, it
    books what was left, nothing twice, and exits 0."""
    fake = FakeHistory(BASE, 300)
    settings = load_settings(backfill_config(tmp_path, await serve_fake(aiohttp_server, fake)))
    fake.fail[(BASE + 20_000, 1)] = 502
    code, out = await run_backfill(settings, BASE, BASE + 30_000)
    assert code == 1 and "INCOMPLETE" in out and "HTTP 502" in out, out
    assert len(db_rows(settings, "SELECT * FROM ledger")) == 201  # two windows, both ends in
    code, out = await run_backfill(settings, BASE, BASE + 30_000)
    assert code == 0, out
    booked = db_rows(settings, "SELECT transaction_id FROM ledger")
    assert len(booked) == 300 == len(set(booked))


async def test_outage_mid_window_keeps_the_mark_at_the_last_complete_window(
    tmp_path: Path, aiohttp_server: MakeServer, processes: Processes
) -> None:
    """An outage on the second window's second page leaves the mark at the first window's end;
    the next read starts there, skips nothing and books nothing twice."""
    fake = FakeHistory(BASE, 300)  # 30 s of history: three windows of 10 s, two pages each
    settings = load_settings(backfill_config(tmp_path, await serve_fake(aiohttp_server, fake)))
    fake.fail[(BASE + 10_000, 2)] = 503
    first, mark = await read_into(settings, BASE, BASE + 30_000)
    assert not first.complete and "503" in (first.error or "")
    assert mark == BASE + 10_000
    fake.requests.clear()

    second, mark = await read_into(settings, mark, BASE + 30_000)
    assert second.complete and mark == BASE + 30_000
    assert all(start is not None and start >= BASE + 10_000 for start, _, _ in fake.requests)
    booked = db_rows(settings, "SELECT transaction_id FROM ledger")
    assert len(booked) == 300 == len(set(booked))
    status = processes.own(
        await asyncio.create_subprocess_exec(
            *[
                sys.executable,
                "-m",
                "worker",
                "status",
                "--config",
                str(tmp_path / "depositd.yaml"),
            ],
            stdout=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )
    )
    shown, _ = await status.communicate()
    assert f'"historyCoveredUntil": "{iso_from_ms(BASE + 30_000)}"' in shown.decode()


async def test_repeating_pages_leave_the_mark_and_a_changing_total_is_read_again(
    tmp_path: Path, aiohttp_server: MakeServer
) -> None:
    """A window whose pages repeat ends bounded and keeps the mark before it (the next window is
    still read and booked); a total that changes while paging makes the window be read again,
    then the mark moves."""
    fake = FakeHistory(BASE, 200, repeat_window=BASE)  # two windows of two pages each
    settings = load_settings(backfill_config(tmp_path, await serve_fake(aiohttp_server, fake)))
    stats, mark = await read_into(settings, BASE, BASE + 20_000)
    assert not stats.complete and stats.error == "paging cut short"
    assert mark is None and stats.pages == 4
    booked = db_rows(settings, "SELECT transaction_id FROM ledger ORDER BY 1")
    assert len(booked) == 150  # page 1 of the first window, all of the second

    fake.repeat_window, fake.shifting_totals = None, 1
    fake.requests.clear()
    stats, mark = await read_into(settings, BASE, BASE + 10_000)
    assert stats.complete and mark == BASE + 10_000
    assert [page for _, _, page in fake.requests] == [1, 2, 3, 1, 2, 3]  # 101 records
    assert len(db_rows(settings, "SELECT * FROM ledger")) == 200


async def test_sweep_reads_the_previous_day_without_setting_a_first_mark(
    tmp_path: Path, aiohttp_server: MakeServer
) -> None:
    """The daily sweep books what the previous UTC day holds; with no mark yet it sets none."""
    day_start, day_end = previous_day(BASE + DAY_MS)
    fake = FakeHistory(day_start + 1000, 30, step_ms=DAY_MS // 40)
    settings = load_settings(backfill_config(tmp_path, await serve_fake(aiohttp_server, fake)))
    settings.scheduler.catchup_window_s = 86_400 / 4
    bundle = load_bundle(settings)
    reactor = RuleReactor(lambda: bundle.rules, lambda: bundle.profiles)
    store = Store(settings.storage.path)
    await store.open()
    try:
        async with ProviderClient.from_settings(settings.provider, retries=0) as client:
            reader = HistoryReader(client, store, lambda: reactor, page_size=50, max_pages=100)
            catchup = CatchUp(reader, store, settings.scheduler, clock=lambda: day_end + 5_000)
            stats = await catchup.sweep()
            mark = await store.read(covered_until)
    finally:
        await store.close()
    assert stats is not None and stats.complete and stats.new_deposits == 30
    assert mark is None
    assert {(s, e) for s, e, _ in fake.requests} == {
        (day_start + i * DAY_MS // 4, day_start + (i + 1) * DAY_MS // 4) for i in range(4)
    }


def test_progress_is_plain_lines_when_not_a_terminal() -> None:
    """Off a terminal the progress is whole lines, never carriage returns."""
    out = io.StringIO()
    line = ProgressLine(out)
    for pages in range(1, 251):
        line(ReadStats(pages=pages, records=pages * 50, new_deposits=pages, new_facts=pages))
    line.end(ReadStats(pages=250))
    text = out.getvalue()
    assert "\r" not in text
    assert text.splitlines()[0] == "pages 100  records 5000  new deposits 100  new facts 100"
    assert len(text.splitlines()) == 2


def test_backfill_refuses_a_bad_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--since after --until, or not a time: exit 2 and nothing read."""
    config = str(backfill_config(tmp_path, "http://127.0.0.1:9"))
    args = ["backfill", "--config", config, "--since", "2026-01-02", "--until", "2026-01-01"]
    assert main(args) == 2
    assert main(["backfill", "--config", config, "--since", "yesterday"]) == 2
    assert "--since" in capsys.readouterr().err
    assert not (tmp_path / "depositd.db").exists()


def run_on_pty(processes: Processes, args: list[str]) -> tuple[int, int, bytes]:
    """Run a command with stdout on a pseudo-terminal: exit status, peak RSS (KiB), output."""
    master, slave = pty.openpty()
    proc = processes.own(
        subprocess.Popen(
            args, stdout=slave, stderr=subprocess.DEVNULL, cwd=ROOT, env={**os.environ}
        )
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, status, usage = os.wait4(proc.pid, 0)  # reaped here: its rusage is this child's alone
    os.close(master)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss, b"".join(chunks)


async def test_backfill_of_100k_deposits_streams_in_bounded_memory_with_progress_on_a_terminal(
    tmp_path: Path, aiohttp_server: MakeServer, processes: Processes
) -> None:
    """100k deposits are backfilled one page at a time: the peak memory is that of a small
    backfill plus little, and a terminal shows one progress line redrawn with carriage returns."""
    fake = FakeHistory(BASE, 100_000, step_ms=10)  # 1000 s of history
    url = await serve_fake(aiohttp_server, fake)
    runs = {}
    for name, count in (("small", 1_000), ("large", 100_000)):
        folder = tmp_path / name
        folder.mkdir()
        config = backfill_config(folder, url, page_size=500, max_pages=250, catchup_window_s=1200)
        since, until = iso_from_ms(BASE), iso_from_ms(BASE + count * 10 - 1)
        args = [sys.executable, "-m", "worker", "backfill", "--config", str(config)]
        runs[name] = await asyncio.to_thread(
            run_on_pty, processes, [*args, "--since", since, "--until", until]
        )
    code, small_kib, _ = runs["small"]
    assert code == 0
    code, large_kib, output = runs["large"]
    text = output.decode()
    assert code == 0, text
    # Holding the history would take well over 100 MB (a dict per record); a stream does not.
    assert large_kib - small_kib < 40_000, (small_kib, large_kib)
    # The terminal turns each "\n" into "\r\n"; redraws are "\r" + erase-line + figures.
    redraws = text.replace("\r\n", "\n").split("\r\x1b[K")
    assert len(redraws) > 2, text
    last = redraws[-1]
    assert last.startswith("pages 200  records 100000  new deposits 100000  new facts 100000\n")
    assert "\n" not in "".join(redraws[1:-1]), "every redraw but the last stays on one line"
    assert "complete" in last
    print(f"peak RSS: small backfill {small_kib} KiB, 100k backfill {large_kib} KiB")
    settings = load_settings(tmp_path / "large" / "depositd.yaml")
    assert db_rows(settings, "SELECT COUNT(DISTINCT transaction_id) FROM ledger") == [(100_000,)]


def test_backfill_refuses_a_since_before_the_history_floor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--since 0001-01-01`: exit 2 naming the floor (no deposit is older), nothing read."""
    config = str(backfill_config(tmp_path, "http://127.0.0.1:9"))
    assert main(["backfill", "--config", config, "--since", "0001-01-01"]) == 2
    assert "2009-01-03T00:00:00Z" in capsys.readouterr().err
    assert not (tmp_path / "depositd.db").exists()


async def test_a_ten_year_read_makes_its_windows_as_it_reads_them(
    tmp_path: Path, aiohttp_server: MakeServer
) -> None:
    """A read of ten years in ten-minute windows (525,960 of them) stopped after its first
    page: it made the windows it read, not all of them first (memory stays flat)."""
    url = await serve_fake(aiohttp_server, FakeHistory(BASE, 10, step_ms=10))
    settings = load_settings(backfill_config(tmp_path, url))
    bundle = load_bundle(settings)
    reactor = RuleReactor(lambda: bundle.rules, lambda: bundle.profiles)
    store = Store(settings.storage.path)
    await store.open()
    ten_years = 3653 * DAY_MS
    try:
        async with ProviderClient.from_settings(settings.provider, retries=0) as client:
            reader = HistoryReader(client, store, lambda: reactor, page_size=50, max_pages=100)
            tracemalloc.start()
            try:
                stats = await reader.read(
                    BASE, BASE + ten_years, 600_000, progress=lambda _: reader.stop()
                )
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    finally:
        await store.close()
    assert (stats.windows, stats.records, stats.complete) == (1, 10, False)
    # All windows first: over 50 MB (two ints and a tuple each); one at a time: little.
    assert peak < 5_000_000, peak
