"""A fake provider history for the catch-up and backfill tests: `count` deposits, one every
`step_ms` from `base_ms`, made per page on demand (nothing held), with the time filters and
paging of the history endpoint, a request log and injectable failures."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

WALLET = 1002


def record(i: int, base_ms: int, step_ms: int) -> dict[str, Any]:
    """Deposit number `i`: an ordinary deposit (no whitelist), SUCCESS."""
    created = base_ms + i * step_ms
    return {
        "transactionId": f"T{i:07d}",
        "transactionHash": f"0x{i:064x}",
        "transactionType": "DEPOSIT",
        "walletId": WALLET,
        "walletName": "Ops",
        "currency": "USDT",
        "network": "TRON",
        "amount": f"{i % 1000}.25",
        "fromAddress": f"TSource{i % 97:026d}",
        "toAddress": "TWalletOps0000000000000000000001",
        "status": "SUCCESS",
        "whiteListStatus": None,
        "createTime": created,
        "updateTime": created + 1,
    }


@dataclass
class FakeHistory:
    """The history endpoint's state: what it holds, what was asked, what must fail."""

    base_ms: int
    count: int
    step_ms: int = 100
    requests: list[tuple[int | None, int | None, int]] = field(default_factory=list)
    # (startTime, pageNum) -> HTTP status to answer once instead of the page
    fail: dict[tuple[int, int], int] = field(default_factory=dict)
    # transactionIds whose record is sent without one
    no_id: set[int] = field(default_factory=set)
    # a server that ignores pageNum for the window starting then: every page is the first
    repeat_window: int | None = None
    # totalRow is off by one in this many answers (the history changing while it is paged)
    shifting_totals: int = 0

    def indexes(self, start: int | None, end: int | None) -> range:
        """The deposits created in [start, end] (both inclusive, as the sandbox filters)."""
        lo = 0 if start is None else max(0, math.ceil((start - self.base_ms) / self.step_ms))
        hi = self.count - 1 if end is None else (end - self.base_ms) // self.step_ms
        return range(lo, min(hi, self.count - 1) + 1)

    async def history(self, request: web.Request) -> web.Response:
        """GET /v1/wallet/history without whiteListStatus."""
        q = request.query
        start = int(q["startTime"]) if "startTime" in q else None
        end = int(q["endTime"]) if "endTime" in q else None
        page_num, size = int(q.get("pageNum", 1)), int(q.get("pageSize", 50))
        self.requests.append((start, end, page_num))
        status = self.fail.pop((start or 0, page_num), None)
        if status is not None:
            return web.json_response({"error": "injected"}, status=status)
        rows = self.indexes(start, end)
        if start is not None and start == self.repeat_window:
            page_num = 1
        total = len(rows)
        if self.shifting_totals and len(self.requests) % 2 == 0:
            self.shifting_totals -= 1
            total += 1
        chosen = rows[(page_num - 1) * size : page_num * size]
        records = []
        for i in chosen:
            one = record(i, self.base_ms, self.step_ms)
            if i in self.no_id:
                del one["transactionId"]
            records.append(one)
        data = {
            "pageNumber": page_num,
            "pageSize": size,
            "totalPage": math.ceil(len(rows) / size),
            "totalRow": total,
            "records": records,
        }
        return web.json_response({"status": 200, "code": None, "msg": "OK", "data": data})

    def app(self) -> web.Application:
        """The aiohttp app serving the history at both spellings."""
        app = web.Application()
        app.router.add_get("/v1/wallet/history", self.history)
        return app
