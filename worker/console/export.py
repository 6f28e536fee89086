"""The console's downloads: CSV exports of the ledger and the reconciliation findings of a range
of days, and one deposit's evidence bundle (without personal data).

A spreadsheet runs a cell that starts with `=`, `+`, `-` or `@` (and, in some, a tab or a
carriage return) as a formula: such a text cell is written with a leading `'`, so a value
that came from outside (a wallet name, an address, a note) is shown, never run. Money columns
are the stored exact decimal strings, written as they are (a plain decimal is no formula).
docs/console.md, "CSV export".
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from aiohttp import web

from worker.console.auth import SESSION_KEY, security_headers
from worker.console.state import CONSOLE
from worker.logs import get_logger
from worker.store import evidence, findings, ledger
from worker.store.evidence_file import Encoder
from worker.store.journal import Head

log = get_logger(__name__)

MAX_DAYS = 366
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")

# (CSV header, row key) per export; the ledger's headers are the keys of `ledger --json`.
LEDGER_COLUMNS = (
    ("transactionId", "transaction_id"),
    ("walletId", "wallet_id"),
    ("walletName", "wallet_name"),
    ("currency", "currency"),
    ("network", "network"),
    ("amount", "amount"),
    ("fromAddress", "from_address"),
    ("txHash", "tx_hash"),
    ("bookedAt", "booked_at"),
    ("trigger", "trigger"),
)
FINDING_COLUMNS = (
    ("id", "id"),
    ("date", "day"),
    ("kind", "kind"),
    ("transactionId", "transaction_id"),
    ("txHash", "tx_hash"),
    ("subject", "subject"),
    ("ledgerAmount", "ledger_amount"),
    ("reportAmount", "report_amount"),
    ("currency", "currency"),
    ("network", "network"),
    ("walletId", "wallet_id"),
    ("detail", "detail"),
    ("firstSeen", "first_seen"),
    ("lastSeen", "last_seen"),
    ("resolvedAt", "resolved_at"),
    ("acknowledgedBy", "acknowledged_by"),
    ("acknowledgedAt", "acknowledged_at"),
    ("note", "note"),
)
MONEY = frozenset({"amount", "ledger_amount", "report_amount"})


def cell(value: Any, *, money: bool = False) -> str:
    """One CSV cell: empty for None, a money value as its exact decimal string, any other text
    that a spreadsheet would run as a formula with a leading `'`."""
    if value is None:
        return ""
    text = str(value)
    if money and _DECIMAL.fullmatch(text):
        return text
    return "'" + text if text.startswith(_FORMULA_START) else text


def to_csv(columns: Sequence[tuple[str, str]], rows: Iterable[Mapping[str, Any]]) -> str:
    """The rows as CSV text (a header line, then one line per row; RFC 4180 quoting)."""
    return csv_lines(columns, None) + csv_lines(columns, rows)


def csv_lines(columns: Sequence[tuple[str, str]], rows: Iterable[Mapping[str, Any]] | None) -> str:
    """CSV lines of the rows (RFC 4180 quoting); of the header when `rows` is None."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    if rows is None:
        writer.writerow([header for header, _ in columns])
    for row in rows or ():
        writer.writerow([cell(row[key], money=key in MONEY) for _, key in columns])
    return out.getvalue()


def day_range(query: Mapping[str, str]) -> tuple[str, str]:
    """`from` and `to` (YYYY-MM-DD, UTC; `to` defaults to `from`, `from` to today): 400 when
    either is no date, `to` is before `from`, or the range is over `MAX_DAYS` days."""
    today = dt.datetime.now(dt.UTC).date().isoformat()
    raw_first = query.get("from") or today
    raw_last = query.get("to") or raw_first
    try:
        first, last = dt.date.fromisoformat(raw_first), dt.date.fromisoformat(raw_last)
    except ValueError:
        raise web.HTTPBadRequest(text="from and to must be dates, YYYY-MM-DD") from None
    if last < first:
        raise web.HTTPBadRequest(text="to must not be before from")
    if (last - first).days + 1 > MAX_DAYS:
        raise web.HTTPBadRequest(text=f"a range is at most {MAX_DAYS} days")
    return first.isoformat(), last.isoformat()


# Rows read and sent at a time: an export of a year holds one chunk in memory, and each chunk is
# a read of its own, so a slow download never holds the store's reader.
CHUNK = 1000

Page = Callable[..., list[dict[str, Any]]]  # (db, after=...) -> one chunk


async def _stream(
    request: web.Request,
    name: str,
    columns: Sequence[tuple[str, str]],
    page: Page,
    key: Callable[[dict[str, Any]], Any],
) -> web.StreamResponse:
    """Send the CSV as it is read: the header, then `page(db, after=)` chunk by chunk (`after`:
    `key` of the previous chunk's last row, None at first) until a chunk comes short."""
    console = request.app[CONSOLE]
    rows = await console.store.read(partial(page, after=None))  # a failed read: still a 503
    response = web.StreamResponse(
        headers={
            # Sent with the first bytes: the guard's headers cannot be added after them.
            **security_headers(console.hosted_origin),
            "Content-Type": "text/csv; charset=utf-8",
            "Content-Disposition": f'attachment; filename="{name}"',
        }
    )
    await response.prepare(request)
    await response.write(csv_lines(columns, None).encode())
    try:
        while rows:
            await response.write(csv_lines(columns, rows).encode())
            if len(rows) < CHUNK:
                break
            rows = await console.store.read(partial(page, after=key(rows[-1])))
    except Exception as exc:
        _cut_off(request, response, "CSV export", exc)
        return response
    await response.write_eof()
    return response


async def ledger_csv(request: web.Request) -> web.StreamResponse:
    """GET /export/ledger.csv?from=&to=: the deposits booked on those days, streamed."""
    first, last = day_range(request.query)
    return await _stream(
        request,
        f"depositd-ledger-{first}-to-{last}.csv",
        LEDGER_COLUMNS,
        lambda db, after: ledger.booked_between_after(db, first, last, after, limit=CHUNK),
        lambda row: (row["booked_at"], row["transaction_id"]),
    )


async def findings_csv(request: web.Request) -> web.StreamResponse:
    """GET /export/findings.csv?from=&to=: every finding of those days, streamed."""
    first, last = day_range(request.query)
    return await _stream(
        request,
        f"depositd-findings-{first}-to-{last}.csv",
        FINDING_COLUMNS,
        lambda db, after: findings.findings_between_after(db, first, last, after, limit=CHUNK),
        lambda row: (row["day"], row["id"]),
    )


# Proof digests read and sent at a time (64 hex digits each).
DIGESTS_CHUNK = 10_000


def _cut_off(request: web.Request, response: web.StreamResponse, what: str, exc: Exception) -> None:
    """A download that failed after its first bytes ends without its last ones: a file that
    ends early never looks whole."""
    log.error(f"{what} stopped half-way", path=request.path, error=str(exc))
    response.force_close()
    if request.transport is not None:
        request.transport.close()


async def evidence_json(request: web.Request) -> web.StreamResponse:
    """GET /deposits/{tx}/evidence.json: the deposit's evidence bundle without personal data
    (docs/console.md), as `depositd evidence` writes it; the proof's digests streamed."""
    console = request.app[CONSOLE]
    tx = request.match_info["tx"]
    by = f"{request[SESSION_KEY].operator}@{request.remote or '-'} (console)"
    receipt = console.ops.webhook_checks()
    content = await console.store.read(
        partial(evidence.gather, transaction_id=tx, personal_data=False, receipt=receipt, by=by)
    )
    if content is None:
        raise web.HTTPNotFound(text=f"no deposit {tx}")
    encoder = Encoder(content)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", tx)[:100]
    response = web.StreamResponse(
        headers={
            **security_headers(console.hosted_origin),
            "Content-Type": "application/json",
            "Content-Disposition": f'attachment; filename="depositd-evidence-{name}.json"',
        }
    )
    await response.prepare(request)
    log.info("console evidence download", subject=tx, by=by)
    await response.write(encoder.start())
    proof = content["journal"]["proof"]
    try:
        if proof is not None:
            after, upto = int(proof["from"]) - 1, Head.parse(proof["head"]).seq
            while after < upto:
                chunk = await console.store.read(
                    partial(evidence.digests, after=after, upto=upto, limit=DIGESTS_CHUNK)
                )
                if not chunk:
                    break  # a gap in the journal: the bundle's check names it
                await response.write(encoder.digests(chunk))
                after += len(chunk)
    except Exception as exc:
        _cut_off(request, response, "evidence download", exc)
        return response
    await response.write(encoder.end())
    await response.write_eof()
    return response


def add_routes(app: web.Application) -> None:
    """The export routes (GET: they change nothing)."""
    app.router.add_get("/export/ledger.csv", ledger_csv)
    app.router.add_get("/export/findings.csv", findings_csv)
    app.router.add_get("/deposits/{tx}/evidence.json", evidence_json)
