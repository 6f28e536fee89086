"""A generated model test of the money path (docs/testing.md, "The model test").

Hypothesis draws histories of what a provider does and what reaches depositd: deposits with
their own, shared or (at first) unknown txHashes and receiving addresses; reviews, credits
around midnight UTC and completions; webhooks delivered once, twice, out of order, late or
never; detail reads applied at once or after later changes (a read in flight); the history
poll; the outbox's submissions; corrected profiles; restarts; `depositd resolve`; and the
reconciliation of any day, again later too. The provider's clock runs from 10 minutes behind
to 10 minutes ahead of ours, and its records carry `updateTime` or not.

The provider here is a small reference model written for this test (`Truth`), served on
loopback; the real store, processor, tracker, rules, booking, outbox, poller and reconciler run
against it. After every step the money invariants are checked against the model, and at the
end of each history everything is delivered and read, and the final state is checked too.

`make model EXAMPLES=N` runs it for N examples per engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import io
import itertools
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from aiohttp import web
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from worker.act.kinds import SPECS
from worker.act.outbox import Outbox
from worker.act.reactor import RuleReactor
from worker.act.resubmit import resubmit_changed
from worker.clock import now_ms
from worker.commands.cli import main
from worker.config.profiles import Profiles
from worker.config.settings import SchedulerSettings
from worker.poll.poller import Poller
from worker.provider import jsonio
from worker.provider.client import ProviderClient
from worker.provider.models import DepositOrder
from worker.reconcile.reconciler import Reconciler
from worker.rules import RuleBook
from worker.store import journal
from worker.store.findings import ledger_rows_for_day
from worker.store.pg import connect as pg_connect
from worker.store.pgstore import PgStore
from worker.store.sqlitestore import Store, event_row
from worker.track.facts import fact_from_order
from worker.track.processor import Processor

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
WALLET = 1001
FROM = "TModelPayer00000000000000000000001"
ADDRESSES = ("TModelWalletA000000000000000000001", "TModelWalletB000000000000000000002")
AMOUNTS = ("100", "100.00", "7")
DAY_MS = 86_400_000
PAYER = {
    "correspondentType": "INDIVIDUAL",
    "firstName": "Philippa",
    "lastName": "Wexcombe",
    "birthday": "1984-07-19",
    "countryCode": "GB",
    "walletType": "SELF_HOSTED",
}
# Examples per engine in `make test` (a PostgreSQL history costs several times a SQLite one);
# DEPOSITD_MODEL_EXAMPLES sets both (`make model EXAMPLES=N`).
EXAMPLES = {"sqlite": 300, "postgres": 80}
STEPS = int(os.environ.get("DEPOSITD_MODEL_STEPS", "30"))


# --- the provider's truth ----------------------------------------------------------------------


@dataclass
class Deposit:
    """One deposit as the provider knows it."""

    tx: str
    amount: str
    to_address: str
    tx_hash: str
    whitelist: bool
    created: int  # the provider's clock
    hash_shown: bool = True
    to_shown: bool = True
    status: str = "PROCESSING"
    wl: str | None = None  # init, pending, rejected, approved; None: not behind the whitelist
    credit: str = "PENDING"
    updated: int = 0
    credit_time: int | None = None
    fail_message: str | None = None
    rejections: int = 0

    def record(self, *, update_time: bool) -> dict[str, Any]:
        """Its history record or transaction detail."""
        out: dict[str, Any] = {
            "transactionId": self.tx,
            "transactionType": "DEPOSIT",
            "walletId": WALLET,
            "walletName": "main",
            "currency": "USDT",
            "network": "TRON",
            "amount": self.amount,
            "fromAddress": FROM,
            "status": self.status,
            "whiteListStatus": self.wl,
            "creditStatus": self.credit,
            "createTime": self.created,
        }
        if update_time:
            out["updateTime"] = self.updated
        if self.hash_shown:
            out["transactionHash"] = self.tx_hash
        if self.to_shown:
            out["toAddress"] = self.to_address
        if self.fail_message is not None:
            out["failMessage"] = self.fail_message
        return out

    def event(self, event_type: str, at: int, **extra: Any) -> dict[str, Any]:
        """A webhook envelope about it, stamped `at` (the provider's clock)."""
        data: dict[str, Any] = {
            "transactionId": self.tx,
            "transactionType": "DEPOSIT",
            "amount": Decimal(self.amount),
            "currency": "USDT",
            "network": "TRON",
            "fromAddress": FROM,
            "walletId": WALLET,
            "walletName": "main",
            "status": self.status,
            "timestamp": at,
            "whiteListStatus": self.wl,
            **extra,
        }
        if self.hash_shown:
            data["transactionHash"] = self.tx_hash
        return {
            "eventId": uuid.uuid4().hex,
            "eventType": event_type,
            "referenceId": self.tx,
            "status": self.status,
            "timestamp": at,
            "data": data,
        }


@dataclass
class Truth:
    """What the provider knows: its deposits, its clock, the webhooks it has yet to deliver."""

    offset_ms: int
    update_time: bool
    deposits: dict[str, Deposit] = field(default_factory=dict)
    outbound: list[dict[str, Any]] = field(default_factory=list)
    submits: int = 0

    def now(self) -> int:
        """The provider's clock."""
        return now_ms() + self.offset_ms

    def emit(self, deposit: Deposit, event_type: str, at: int, **extra: Any) -> None:
        self.outbound.append(deposit.event(event_type, at, **extra))

    def report(self, day: str) -> dict[str, Deposit]:
        """The daily settlement report's IN records of `day` (UTC, by the provider's clock)."""
        return {
            d.tx: d
            for d in self.deposits.values()
            if d.credit == "CREDITED" and d.credit_time is not None and _day(d.credit_time) == day
        }

    # --- its HTTP interface (`provider_app`) --------------------------------------------------

    async def _detail(self, request: web.Request) -> web.Response:
        deposit = self.deposits.get(request.match_info["tx"])
        if deposit is None:
            return _wallet(None, code="10000100", msg="transaction not found")
        return _wallet(deposit.record(update_time=self.update_time))

    async def _history(self, request: web.Request) -> web.Response:
        status = request.query.get("whiteListStatus")
        records = [
            d.record(update_time=self.update_time)
            for d in self.deposits.values()
            if d.wl is not None and (status is None or d.wl == status)
        ]
        page = {"pageNumber": 1, "pageSize": 50, "totalPage": 1, "totalRow": len(records)}
        return _wallet({**page, "records": records})

    async def _submit(self, request: web.Request) -> web.Response:
        deposit = self.deposits.get(request.match_info["tx"])
        if deposit is None:
            return _wallet(None, code="10000100", msg="transaction not found")
        self.submits += 1
        if deposit.wl in ("init", "rejected"):
            deposit.wl, deposit.updated = "pending", self.now()
        return _wallet({"transactionId": deposit.tx, "whiteListStatus": deposit.wl})

    async def _daily(self, request: web.Request) -> web.Response:
        day = request.query["settlement_date"]
        records = [
            {
                "settlement_record_id": "SR" + d.tx,
                "settlement_date": day,
                "record_type": "IN",
                "business_type": "DEPOSIT",
                "platform_order_id": d.tx,
                "asset": "USDT",
                "network": "TRON",
                "amount": d.amount,
                "tx_hash": d.tx_hash,
                "reconciliation_status": "MATCHED",
                "settled_at": _iso(d.credit_time or 0),
            }
            for d in sorted(self.report(day).values(), key=lambda d: d.tx)
        ]
        total = str(sum((Decimal(r["amount"]) for r in records), Decimal(0)))
        summary = {
            "opening_balance": "0",
            "closing_balance": total,
            "total_in_amount": total,
            "total_out_amount": "0",
            "total_fee_amount": "0",
            "net_amount": total,
            "adjustment_amount": "0",
            "record_count": len(records),
            "matched_count": len(records),
            "mismatched_count": 0,
            "manual_review_count": 0,
        }
        data = {
            "settlement_date": day,
            "timezone": "UTC",
            "summary": summary,
            "records": records,
            "page": 1,
            "page_size": max(1, len(records)),
            "total": len(records),
            "generated_at": _iso(self.now()),
        }
        body = {"code": "SUCCESS", "message": "success", "data": data, "trace_id": "t"}
        return web.Response(body=jsonio.dumpb(body), content_type="application/json")

    async def _balances(self, request: web.Request) -> web.Response:
        return _wallet([])  # no balances: the held-balance check finds nothing to compare


def provider_app(box: list[Truth]) -> web.Application:
    """The provider's interface, answered from the truth of the history being run."""

    def to(name: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            answer: web.Response = await getattr(box[0], name)(request)
            return answer

        return handler

    app = web.Application()
    app.router.add_get("/v1/wallet/transactions/{tx}", to("_detail"))
    app.router.add_get("/v1/wallet/history", to("_history"))
    app.router.add_post("/v1/wallet/deposit-whitelist/transactions/{tx}/submit", to("_submit"))
    app.router.add_get("/api/v1/settlement/daily-records", to("_daily"))
    app.router.add_get("/v1/wallet/asset-balance", to("_balances"))
    return app


def _wallet(data: Any, *, code: str | None = None, msg: str = "OK") -> web.Response:
    body = {"status": 200, "code": code, "msg": msg, "success": code is None, "data": data}
    return web.Response(body=jsonio.dumpb(body), content_type="application/json")


def _iso(ms: int) -> str:
    at = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _day(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).date().isoformat()


# What one deposit arriving at the provider is drawn from (`MoneyPath.arrives`).
ARRIVALS = st.fixed_dictionaries(
    {
        "whitelist": st.booleans(),
        "amount": st.sampled_from(AMOUNTS),
        "to_address": st.sampled_from((*ADDRESSES[:1] * 3, *ADDRESSES[1:])),
        "shared": st.one_of(st.none(), st.integers(0, 10)),
        "upper": st.booleans(),
        "hide_hash": st.booleans(),
        "hide_to": st.booleans(),
    }
)


# --- the machine -------------------------------------------------------------------------------


class Engine:
    """Where each history's store lives: a new SQLite file, or a PostgreSQL database emptied."""

    def __init__(self, name: str, url: str | None, tmp: Path) -> None:
        self.name, self.url, self.tmp = name, url, tmp
        self._count = itertools.count()

    def fresh(self) -> dict[str, str]:
        """The `storage` of an empty store for one history."""
        if self.url is None:
            return {"path": str(self.tmp / f"model-{next(self._count)}.db")}
        conn = pg_connect(self.url)
        try:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                ).fetchall()
            ]
            emptied = [t for t in tables if t != "meta"]
            if emptied:
                conn.execute(f"TRUNCATE {', '.join(emptied)} RESTART IDENTITY")
            if "meta" in tables:
                conn.execute("DELETE FROM meta WHERE key <> 'schema_version'")
            conn.commit()
        finally:
            conn.close()
        return {"url": self.url}


class MoneyPath(RuleBasedStateMachine):
    """The real money path against the provider's truth (`Truth`)."""

    engine: Engine
    loop: asyncio.AbstractEventLoop
    runner: web.AppRunner
    base_url: str
    truth_box: list[Truth]
    rulebook: RuleBook  # the shipped rules, read once

    def __init__(self) -> None:
        super().__init__()
        self.storage = self.engine.fresh()
        self.dir = Path(tempfile.mkdtemp(dir=self.engine.tmp))
        self.profiles_path = self.dir / "profiles.yaml"
        self.profile_version = 0
        self._write_profiles()
        self.inflight: list[tuple[int, dict[str, Any]]] = []
        self.decided_distinct: set[str] = set()
        self.decided_duplicate: set[str] = set()
        self.reconciled: dict[str, str] = {}
        self.client = ProviderClient(self.base_url, "k", "s", retries=0, timeout_s=5)
        self.store: Any = None
        self._run(self._open())

    # --- plumbing ----------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def _write_profiles(self) -> None:
        payer = {**PAYER, "residentialAddress": f"{self.profile_version} Wexcombe Lane, Bristol"}
        doc = {"profiles": {"model-payer": payer}, "wallets": {WALLET: "model-payer"}}
        self.profiles_path.write_text(yaml.safe_dump(doc))
        self.profiles = Profiles.load(self.profiles_path)

    async def _open(self) -> None:
        if "url" in self.storage:
            self.store = PgStore(self.storage["url"])
        else:
            self.store = Store(Path(self.storage["path"]))
        await self.store.open()
        rulebook = self.rulebook
        reactor = RuleReactor(lambda: rulebook, lambda: self.profiles)
        self.processor = Processor(self.store, reactor=reactor)
        sched = SchedulerSettings.model_validate({"history_interval_s": 60})
        self.poller = Poller(self.client, self.store, self.processor.observe_fact, sched)
        self.outbox = Outbox(
            self.store,
            client=self.client,
            notifiers={},
            profiles=lambda: self.profiles,
            observe=self.processor.observe_fact,
            rules=lambda: rulebook,
            backoff_s=0.0,
        )
        self.reconciler = Reconciler(self.client, self.store, lambda: rulebook, drift_after_s=10**9)

    async def _close(self) -> None:
        await self.store.close()

    def teardown(self) -> None:
        try:
            self.settle_everything()
        finally:
            self._run(self._close())
            self._run(self.client.close())

    def _rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return self._run(
            self.store.read(lambda db: [dict(r) for r in db.execute(sql, args).fetchall()])
        )

    def _all(self) -> list[Deposit]:
        truth = getattr(self, "truth", None)
        return [] if truth is None else [truth.deposits[tx] for tx in sorted(truth.deposits)]

    def _tick(self) -> None:
        """Let this machine's clock move on (two steps are never in the same millisecond)."""
        start = now_ms()
        while now_ms() <= start:
            pass

    # --- the provider ------------------------------------------------------------------------

    @initialize(
        offset_ms=st.sampled_from([-600_000, -60_000, -1_000, 0, 1_000, 60_000, 600_000]),
        update_time=st.booleans(),
        first=st.lists(ARRIVALS, min_size=2, max_size=5),
    )
    def provider(self, offset_ms: int, update_time: bool, first: list[dict[str, Any]]) -> None:
        """The provider's clock against ours, whether its records carry updateTime, and the
        deposits it has when the history starts."""
        self.truth = Truth(offset_ms, update_time)
        self.truth_box[0] = self.truth
        for arrival in first:
            self.arrives(**arrival)

    @rule(arrival=ARRIVALS)
    def another_arrives(self, arrival: dict[str, Any]) -> None:
        """Another deposit reaches the provider (`arrives`)."""
        self.arrives(**arrival)

    def arrives(
        self,
        whitelist: bool,
        amount: str,
        to_address: str,
        shared: int | None,
        upper: bool,
        hide_hash: bool,
        hide_to: bool,
    ) -> None:
        """A deposit reaches the provider: its own txHash, or one of an earlier deposit (a batch
        transfer's other output, or the same money listed twice), in either case."""
        self._tick()
        known = sorted(self.truth.deposits.values(), key=lambda d: d.tx)
        tx_hash = f"0xm{uuid.uuid4().hex[:16]}"
        if shared is not None and known:
            tx_hash = known[shared % len(known)].tx_hash
        tx_hash = tx_hash.upper().replace("0X", "0x") if upper else tx_hash.lower()
        at = self.truth.now()
        deposit = Deposit(
            tx=f"TXM{len(known) + 1:03d}",
            amount=amount,
            to_address=to_address,
            tx_hash=tx_hash,
            whitelist=whitelist,
            created=at,
            hash_shown=not hide_hash,
            to_shown=not hide_to,
            wl="init" if whitelist else None,
            updated=at,
        )
        self.truth.deposits[deposit.tx] = deposit
        if whitelist:
            self.truth.emit(deposit, "DEPOSIT_WHITELIST_REQUIRED", at)

    def _creditable(self) -> list[Deposit]:
        return [
            d
            for d in self._all()
            if d.credit == "PENDING" and (not d.whitelist or d.wl == "pending")
        ]

    @precondition(lambda self: bool(self._creditable()))
    @rule(
        pick=st.integers(0, 50), when=st.sampled_from(["now", "before midnight", "after midnight"])
    )
    def credits(self, pick: int, when: str) -> None:
        """The provider credits a deposit: a plain one completes (SUCCESS); one behind the
        whitelist is approved once its details are under review (CREDITED). Its credit time
        is now, or just either side of the last midnight UTC by the provider's clock."""
        self._tick()
        ready = self._creditable()
        d = ready[pick % len(ready)]
        now = self.truth.now()
        midnight = now - now % DAY_MS
        at = {"now": now, "before midnight": midnight - 1, "after midnight": midnight}[when]
        d.credit, d.credit_time, d.updated = "CREDITED", at, now
        if d.whitelist:
            d.wl = "approved"
            self.truth.emit(d, "DEPOSIT_WHITELIST_CREDITED", at, creditTime=at)
        else:
            d.status = "SUCCESS"
            self.truth.emit(d, "DEPOSIT_ORDER_NOTIFICATION", at)

    def _completable(self) -> list[Deposit]:
        return [d for d in self._all() if d.credit == "CREDITED" and d.status != "SUCCESS"]

    @precondition(lambda self: bool(self._completable()))
    @rule(pick=st.integers(0, 50))
    def completes(self, pick: int) -> None:
        """A credited deposit behind the whitelist completes (SUCCESS)."""
        self._tick()
        ready = self._completable()
        d = ready[pick % len(ready)]
        d.status, d.updated = "SUCCESS", self.truth.now()
        self.truth.emit(d, "DEPOSIT_ORDER_NOTIFICATION", d.updated)

    def _under_review(self) -> list[Deposit]:
        return [d for d in self._all() if d.wl == "pending"]

    @precondition(lambda self: bool(self._under_review()))
    @rule(pick=st.integers(0, 50))
    def rejects(self, pick: int) -> None:
        """The review rejects the details under review."""
        self._tick()
        ready = self._under_review()
        d = ready[pick % len(ready)]
        d.rejections += 1
        d.wl, d.updated = "rejected", self.truth.now()
        d.fail_message = f"rejection {d.rejections}"
        self.truth.emit(d, "DEPOSIT_WHITELIST_FAILED", d.updated, failMessage=d.fail_message)

    def _hidden(self) -> list[Deposit]:
        return [d for d in self._all() if not (d.hash_shown and d.to_shown)]

    @precondition(lambda self: bool(self._hidden()))
    @rule(pick=st.integers(0, 50))
    def shows_hash(self, pick: int) -> None:
        """The provider's records and webhooks now carry the txHash and receiving address."""
        ready = self._hidden()
        d = ready[pick % len(ready)]
        d.hash_shown = d.to_shown = True

    # --- what reaches depositd ---------------------------------------------------------------

    @precondition(lambda self: bool(self.truth.outbound))
    @rule(pick=st.integers(0, 50), again=st.booleans())
    def delivers(self, pick: int, again: bool) -> None:
        """One waiting webhook is delivered (any of them: out of order); `again`: it stays
        waiting, to be delivered a second time later."""
        self._tick()
        i = pick % len(self.truth.outbound)
        envelope = self.truth.outbound[i] if again else self.truth.outbound.pop(i)
        self._deliver(envelope)

    @precondition(lambda self: bool(self.truth.outbound))
    @rule(pick=st.integers(0, 50))
    def loses(self, pick: int) -> None:
        """One waiting webhook is never delivered."""
        self.truth.outbound.pop(pick % len(self.truth.outbound))

    def _deliver(self, envelope: dict[str, Any]) -> None:
        signed = str(self.truth.now())  # signed at each attempt, by the provider's clock
        row = event_row(
            envelope["eventId"],
            envelope["eventType"],
            envelope["referenceId"],
            envelope["data"]["transactionId"],
            jsonio.dumpb(envelope, decimals_as_numbers=True),
            {"API-TIMESTAMP": signed, "Content-Type": "application/json"},
            dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        )

        async def go() -> None:
            await self.store.queue_event(row)
            await self.processor.run_until_idle()

        self._run(go())

    @precondition(lambda self: bool(self._all()))
    @rule(pick=st.integers(0, 50), later=st.booleans())
    def reads_a_detail(self, pick: int, later: bool) -> None:
        """A transaction detail read of any deposit (`reads_detail`)."""
        deposits = self._all()
        self.reads_detail(deposits[pick % len(deposits)].tx, later)

    def reads_detail(self, tx: str, later: bool) -> None:
        """A transaction detail read: applied at once, or kept in flight and applied after
        whatever happens next (its request was sent now)."""
        self._tick()
        sent_at = now_ms()
        record = self.truth.deposits[tx].record(update_time=self.truth.update_time)
        if later:
            self.inflight.append((sent_at, record))
        else:
            self._apply_read(sent_at, record)

    @precondition(lambda self: bool(self.inflight))
    @rule(pick=st.integers(0, 20))
    def read_arrives(self, pick: int) -> None:
        """A read that was in flight is applied now."""
        self._tick()
        sent_at, record = self.inflight.pop(pick % len(self.inflight))
        self._apply_read(sent_at, record)

    def _apply_read(self, sent_at: int, record: dict[str, Any]) -> None:
        order = DepositOrder.model_validate(record)
        self._run(self.processor.observe_fact(fact_from_order(order, sent_at=sent_at)))

    @rule()
    def polls_history(self) -> None:
        """The history poll reads the init and rejected queues."""
        self._tick()
        self._run(self.poller.poll_history())

    @rule()
    def runs_outbox(self) -> None:
        """The outbox runs what is due: submissions (to the provider) and alerts."""
        self._tick()
        self._run(self.outbox.run_until_idle(include_delayed=True))

    @rule()
    def corrects_profile(self) -> None:
        """The payer profile is corrected and reloaded: rejected deposits are resubmitted."""
        self._tick()
        self.profile_version += 1
        self._write_profiles()
        profiles = self.profiles
        self._run(self.store.write(lambda db: resubmit_changed(db, profiles)))

    @rule()
    def restarts(self) -> None:
        """depositd stops and starts again (between two commits)."""
        self._run(self._close())
        self.inflight.clear()  # a read in flight dies with the process
        self._run(self._open())

    @precondition(lambda self: bool(self._all()))
    @rule(pick=st.integers(0, 50), distinct=st.booleans())
    def resolves(self, pick: int, distinct: bool) -> None:
        """A person decides a likely duplicate: its own deposit (no), or a duplicate (yes)."""
        held = self._rows(
            "SELECT transaction_id FROM conflicts WHERE field = 'duplicate'"
            " AND decided_at IS NULL ORDER BY transaction_id"
        )
        if not held:
            return
        tx = held[pick % len(held)]["transaction_id"]
        cfg = self.dir / "depositd.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "provider": {"base_url": self.base_url, "api_key": "k", "api_secret": "s"},
                    "webhook": {"listen": "127.0.0.1:9", "api_key": "a", "secret": "b"},
                    "storage": self.storage,
                    "scheduler": {"enabled": False},
                }
            )
        )
        value = "no" if distinct else "yes"
        args = ["resolve", "--config", str(cfg), tx, "--set", f"duplicate={value}", "--by", "ann"]
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(args) == 0
        (self.decided_distinct if distinct else self.decided_duplicate).add(tx)

    @rule(which=st.sampled_from(["yesterday", "today"]))
    def reconciles(self, which: str) -> None:
        """A day is reconciled (again, later, as often as asked)."""
        self._tick()
        now = self.truth.now()
        day = _day(now if which == "today" else now - DAY_MS)
        result = self._run(self.reconciler.run(dt.date.fromisoformat(day)))
        if result.outcome == "clean":
            booked = self._run(
                self.store.read(lambda db: [tuple(r) for r in ledger_rows_for_day(db, day)])
            )
            ledger = {str(r[0]): Decimal(str(r[1])) for r in booked}
            report = {tx: Decimal(d.amount) for tx, d in self.truth.report(day).items()}
            assert ledger == report, f"{day} reconciled clean: ledger {ledger}, report {report}"
        self.reconciled[day] = result.outcome

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def money(self) -> None:
        """Booked once, as the provider states it; no likely duplicate booked twice unless a
        person decided; nothing booked that the provider did not credit; a deposit never reads
        rejected while the provider has it otherwise."""
        if not hasattr(self, "truth"):
            return
        ledger = self._rows("SELECT transaction_id, amount, currency FROM ledger")
        ids = [r["transaction_id"] for r in ledger]
        assert len(ids) == len(set(ids)), f"booked twice: {ids}"
        seen: dict[tuple[str, Decimal, str], str] = {}
        for row in ledger:
            truth = self.truth.deposits[row["transaction_id"]]
            assert truth.credit == "CREDITED", f"{truth.tx} booked, not credited"
            assert Decimal(row["amount"]) == Decimal(truth.amount), f"{truth.tx} amount"
            assert row["currency"] == "USDT"
            key = (truth.tx_hash.lower(), Decimal(truth.amount), truth.to_address)
            other = seen.get(key)
            if other is not None:
                assert {other, truth.tx} & self.decided_distinct, (
                    f"{other} and {truth.tx} booked: same txHash, amount, currency and address"
                )
            seen[key] = truth.tx
        for row in self._rows("SELECT transaction_id, state FROM deposits"):
            if row["state"] == "rejected":
                truth = self.truth.deposits[row["transaction_id"]]
                assert truth.wl == "rejected", f"{truth.tx} reads rejected, provider: {truth.wl}"

    @invariant()
    def journal_holds(self) -> None:
        """The journal is one intact chain, and each ledger row has exactly one BOOKED (or
        ADOPTED) entry whose fields are the row's."""
        if not hasattr(self, "truth"):
            return
        entries = self._run(self.store.read(lambda db: list(journal.entries(db))))
        assert journal.chain_problem(entries) is None
        booked: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            if entry.kind in (journal.BOOKED, journal.ADOPTED):
                booked.setdefault(entry.subject, []).append(journal.ledger_body(entry.body))
        ledger = {
            r["transaction_id"]: journal.ledger_body(r) for r in self._rows("SELECT * FROM ledger")
        }
        assert {tx: [row] for tx, row in ledger.items()} == booked

    # --- the end of a history ----------------------------------------------------------------

    def _stats(self) -> None:
        if os.environ.get("DEPOSITD_MODEL_DEBUG"):
            ledger = self._rows("SELECT COUNT(*) AS n FROM ledger")[0]["n"]
            credited = sum(d.credit == "CREDITED" for d in self._all())
            print("DEBUG", len(self._all()), credited, ledger, self.truth.offset_ms)

    def settle_everything(self) -> None:
        """Everything known to the provider reaches depositd; then every credited deposit is
        booked or held with one open alert, and every rejected one reads rejected, alerted."""
        if not hasattr(self, "truth"):
            return
        for d in self.truth.deposits.values():
            d.hash_shown = d.to_shown = True
        while self.truth.outbound:
            self._deliver(self.truth.outbound.pop(0))
        for sent_at, record in self.inflight:
            self._apply_read(sent_at, record)
        self.inflight.clear()
        for tx in sorted(self.truth.deposits):
            self._tick()
            self.reads_detail(tx, later=False)
        self._run(self.outbox.run_until_idle(include_delayed=True))
        self._stats()
        self.money()
        booked = {r["transaction_id"] for r in self._rows("SELECT transaction_id FROM ledger")}
        alerts: dict[tuple[str, str], int] = {}
        for r in self._rows("SELECT transaction_id, params FROM actions WHERE action='alert'"):
            key = (r["transaction_id"], jsonio.loads(r["params"])["condition"])
            alerts[key] = alerts.get(key, 0) + 1
        states = {r["transaction_id"]: r["state"] for r in self._rows("SELECT * FROM deposits")}
        for d in self.truth.deposits.values():
            if d.credit == "CREDITED" and d.tx not in booked:
                held = alerts.get((d.tx, "duplicate_tx_hash"), 0)
                if d.tx in self.decided_duplicate:
                    continue
                assert held == 1, f"{d.tx} credited, not booked, {held} duplicate alerts"
            if d.wl == "rejected":
                assert states.get(d.tx) == "rejected", f"{d.tx}: {states.get(d.tx)}"
                assert alerts.get((d.tx, "rejected"), 0) >= 1, f"{d.tx} rejection not alerted"
            assert alerts.get((d.tx, "rejected"), 0) <= d.rejections, f"{d.tx} alerted twice"


@pytest.mark.timeout(0 if os.environ.get("DEPOSITD_MODEL_EXAMPLES") else 600)
def test_money_path_against_the_providers_truth(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Any history of provider changes, deliveries, reads, submissions, decisions, restarts and
    reconciliations keeps the money invariants (`MoneyPath`)."""
    url = request.getfixturevalue("pg_cluster").create_database() if engine == "postgres" else None
    # SQLite files in memory where the machine has it: each history's fsyncs cost nothing.
    shm = Path("/dev/shm")
    if url is None and shm.is_dir():
        tmp_path = Path(tempfile.mkdtemp(prefix="depositd-model-", dir=shm))
        request.addfinalizer(lambda: shutil.rmtree(tmp_path, ignore_errors=True))
    truth_box = [Truth(0, True)]
    loop = asyncio.new_event_loop()

    async def serve() -> tuple[web.AppRunner, str]:
        runner = web.AppRunner(provider_app(truth_box))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return runner, f"http://127.0.0.1:{port}"

    try:
        runner, base_url = loop.run_until_complete(serve())
    except BaseException:
        loop.close()
        raise
    machine = type(
        "MoneyPathRun",
        (MoneyPath,),
        {
            "engine": Engine(engine, url, tmp_path),
            "loop": loop,
            "runner": runner,
            "base_url": base_url,
            "truth_box": truth_box,
            "rulebook": RuleBook.load(ROOT / "rules" / "default.yaml", specs=SPECS),
        },
    )
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=int(os.environ.get("DEPOSITD_MODEL_EXAMPLES", EXAMPLES[engine])),
                stateful_step_count=STEPS,
                deadline=None,
                derandomize=os.environ.get("DEPOSITD_MODEL_SEED") is None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()
