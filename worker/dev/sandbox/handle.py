"""`Sandbox`: the in-process handle of one sandbox instance.

It owns the state machine, its persistence, webhook delivery and injected faults. The provider
API (`app`) and the control API (`control`) are thin HTTP layers over it, and `depositd demo` or
a test can drive the very same methods in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from aiohttp import web

from worker.clock import now_ms
from worker.dev.sandbox import money
from worker.dev.sandbox.config import SandboxConfig
from worker.dev.sandbox.delivery import Deliverer, envelope
from worker.dev.sandbox.faults import Fault, Faults
from worker.dev.sandbox.records import Event, new_id, parse_amount
from worker.dev.sandbox.state import BAD_VALUE, INCOMPLETE, SandboxState
from worker.dev.sandbox.store import StateFile, state_docs, state_from_docs
from worker.errors import SandboxError, SandboxNotFound, WalletCodeError
from worker.logs import get_logger

log = get_logger(__name__)

ABNORMAL_FUND_NOTIFICATION = "ABNORMAL_FUND_NOTIFICATION"


class Sandbox:
    """One sandbox: state, persistence, delivery and faults behind methods."""

    def __init__(
        self,
        cfg: SandboxConfig,
        *,
        clock: Callable[[], int] | None = None,
        signing_clock: Callable[[], int] | None = None,
    ) -> None:
        """`clock`: the provider's times in its records and events; `signing_clock`: the
        provider's wall clock its deliveries' API-TIMESTAMP is signed by (this machine's by
        default; a test that runs the provider's clock off ours passes the same clock)."""
        self.cfg = cfg
        self.clock = clock or now_ms
        self._file = StateFile(cfg.state_path) if cfg.state_path is not None else None
        docs = self._file.load() if self._file is not None else None
        self.state = (
            state_from_docs(docs, cfg.providers, cfg.main_wallet_id)
            if docs is not None
            else SandboxState.initial(cfg.wallets, cfg.providers, cfg.main_wallet_id)
        )
        # Idempotency-Key -> {"fingerprint": ..., "answer": the first successful answer}.
        self.idempotency: dict[str, dict[str, Any]] = dict((docs or {}).get("idempotency", {}))
        self.deliverer = Deliverer(cfg, on_change=self.persist, clock=signing_clock or now_ms)
        if docs is not None:
            self.deliverer.restore(docs.get("outbox", []), int(docs.get("drops_owed", 0)))
        self.faults = Faults()
        self._timers: set[asyncio.TimerHandle] = set()
        # E-mail verification codes by lowercased address: {"code", "sentAt"} (not persisted).
        self.email_codes: dict[str, dict[str, Any]] = {}

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start webhook delivery."""
        await self.deliverer.start()

    async def stop(self) -> None:
        """Stop delivery and auto-reviews, release held requests, persist and close the file."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self.faults.release.set()
        await self.deliverer.stop()
        self.persist()
        if self._file is not None:
            self._file.close()
            self._file = None

    def persist(self) -> None:
        """Write the whole state to the state file (no-op without one)."""
        if self._file is None:
            return
        docs = state_docs(self.state)
        docs["idempotency"] = self.idempotency
        docs["outbox"] = [d.doc() for d in self.deliverer.pending()]
        docs["drops_owed"] = self.deliverer.drops_owed
        self._file.save(docs)

    def commit(self, events: Iterable[Event] = ()) -> None:
        """Queue the webhooks a change caused and persist the state."""
        self._commit(events)

    def _commit(self, events: Iterable[Event] = ()) -> None:
        now = self.clock()
        for event in events:
            self.deliverer.enqueue(envelope(event, now))
        self.persist()

    async def delivered_idle(self) -> None:
        """Wait until every queued webhook was delivered (dropped ones never are)."""
        await self.deliverer.idle()

    # --- control: deposits --------------------------------------------------------------------

    def inject_deposit(
        self,
        wallet_id: int,
        currency: str,
        network: str,
        amount: Decimal | str,
        from_address: str,
        tx_hash: str | None = None,
        to_address: str | None = None,
    ) -> dict[str, Any]:
        """An on-chain deposit confirmation; returns the order as transaction detail shows it."""
        order, events = self.state.inject_deposit(
            wallet_id=wallet_id,
            currency=currency,
            network=network,
            amount=parse_amount(amount),
            from_address=from_address,
            tx_hash=tx_hash,
            to_address=to_address,
            now=self.clock(),
        )
        log.info("deposit injected", transaction_id=order.transaction_id, wallet_id=wallet_id)
        self._commit(events)
        return order.wire()

    def approve_review(self, tx_id: str) -> dict[str, Any]:
        """The deposit's review passes."""
        order, events = self.state.approve_review(tx_id, self.clock())
        self._commit(events)
        return order.wire()

    def reject_review(self, tx_id: str, fail_message: str) -> dict[str, Any]:
        """The deposit's review rejects with `fail_message`."""
        order, events = self.state.reject_review(tx_id, fail_message, self.clock())
        self._commit(events)
        return order.wire()

    def finish_sweep(self, tx_id: str) -> dict[str, Any]:
        """The auto-collection sweep of a credited deposit ends."""
        order, events = self.state.finish_sweep(tx_id, self.clock())
        self._commit(events)
        return order.wire()

    def block(self, tx_id: str) -> dict[str, Any]:
        """The deposit cannot be credited: creditStatus BLOCKED."""
        order = self.state.block(tx_id, self.clock())
        self._commit()
        return order.wire()

    def release(self, tx_id: str) -> dict[str, Any]:
        """A BLOCKED deposit is released and credited."""
        order, events = self.state.release(tx_id, self.clock())
        self._commit(events)
        return order.wire()

    def fail_order(self, tx_id: str) -> dict[str, Any]:
        """The deposit fails: status FAIL."""
        order, events = self.state.fail_order(tx_id, self.clock())
        self._commit(events)
        return order.wire()

    # --- control: abnormal funds, settlement ------------------------------------------------

    def inject_abnormal_fund(self, spec: Mapping[str, Any], notify: bool = False) -> dict[str, Any]:
        """A new abnormal fund record (fields as the list shows them); `notify` also sends
        ABNORMAL_FUND_NOTIFICATION with the record as data."""
        funds = self.state.abnormal_funds
        record = money.abnormal_fund(max(funds, default=0) + 1, spec, self.clock())
        funds[record["id"]] = record
        events = []
        if notify:
            ref = str(record["id"])
            events.append(Event(ABNORMAL_FUND_NOTIFICATION, ref, record["status"], dict(record)))
        self._commit(events)
        return record

    def set_abnormal_status(self, fund_id: int, status: str) -> dict[str, Any]:
        """Change an abnormal fund's status (e.g. after it was linked to an order)."""
        record = self.state.abnormal_funds.get(fund_id)
        if record is None:
            raise SandboxNotFound(f"no abnormal fund {fund_id}")
        if not status:
            raise SandboxError("status must not be empty")
        record["status"] = status
        self._commit()
        return record

    def add_discrepancy(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """A discrepancy in one day's settlement report (drop, amount, extra, status)."""
        change = money.discrepancy(spec)
        if change["kind"] != "extra" and change["transactionId"] not in self.state.orders:
            raise SandboxNotFound(f"no deposit {change['transactionId']}")
        self.state.settlement_changes.append(change)
        self._commit()
        return change

    def clear_discrepancies(self) -> None:
        """Every settlement report is built from the deposits alone again."""
        self.state.settlement_changes.clear()
        self._commit()

    # --- control: addresses, wallets, webhooks, faults ----------------------------------------

    def approve_address(self, address_id: str) -> dict[str, Any]:
        """A source address review passes: ACTIVE."""
        record, events = self.state.approve_address(address_id, self.clock())
        self._commit(events)
        return record.wire()

    def reject_address(self, address_id: str, fail_message: str) -> dict[str, Any]:
        """A source address review rejects: FAILED."""
        record, events = self.state.reject_address(address_id, fail_message, self.clock())
        self._commit(events)
        return record.wire()

    def put_wallet(
        self,
        wallet_id: int | None,
        name: str,
        auto_collection: bool = False,
        wallet_type: str | None = None,
    ) -> dict[str, Any]:
        """Create or update a wallet; returns its wallet group."""
        wallet = self.state.put_wallet(wallet_id, name, auto_collection, wallet_type)
        self._commit()
        return self.state.wallet_group(wallet)

    def drop_webhooks(self, n: int) -> None:
        """Drop the next `n` webhooks silently (simulated loss)."""
        if n < 0:
            raise SandboxError("count must not be negative")
        self.deliverer.drop(n)
        self._commit()

    def set_fault(
        self,
        endpoint_pattern: str,
        kind: str = "5xx",
        count: int | None = 1,
        latency_s: float = 0.0,
        code: str = "10000104",
        http_status: int = 429,
        retry_after_s: int | None = None,
    ) -> dict[str, Any]:
        """Inject a fault on provider endpoints matching `endpoint_pattern`."""
        fault = Fault(endpoint_pattern, kind, count, latency_s, code, http_status, retry_after_s)
        self.faults.add(fault)
        return fault.doc()

    def clear_faults(self) -> None:
        """Remove every fault (held "timeout" requests are let go)."""
        self.faults.clear()

    def snapshot(self) -> dict[str, Any]:
        """Everything at a glance: orders, balances, addresses, wallets, webhooks, faults,
        abnormal funds, settlement discrepancies, stable and collection orders."""
        st = self.state
        return {
            "orders": [o.wire() for o in st.history()],
            "balances": [
                {
                    "walletId": wid,
                    "currency": cur,
                    "available": bal.available,
                    "unavailable": bal.unavailable,
                }
                for (wid, cur), bal in sorted(st.balances.items(), key=lambda kv: kv[0])
            ],
            "addresses": [a.wire() for a in st.addresses.values()],
            "wallets": [st.wallet_group(w) for w in st.wallets.values()],
            "webhooks": {
                "pending": [d.doc() for d in self.deliverer.pending()],
                "recent": [d.doc() for d in self.deliverer.history],
                "dropsOwed": self.deliverer.drops_owed,
            },
            "faults": [f.doc() for f in self.faults.active],
            "abnormalFunds": list(st.abnormal_funds.values()),
            "settlementDiscrepancies": st.settlement_changes,
            "stableOrders": list(st.stable_orders.values()),
            "collectOrders": list(st.collect_orders.values()),
        }

    # --- provider operations (answers are the wallet envelope's data) ---------------------------

    def submit(self, tx_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Payer details for a received deposit."""
        order = self.state.submit(tx_id, body, self.clock())
        log.info("payer details submitted", transaction_id=tx_id)
        self._commit()
        if self.cfg.auto_review:
            self._later(self._auto_approve_review, tx_id)
        wls = order.white_list_status
        return {"transactionId": tx_id, "whiteListStatus": wls.value if wls else None}

    def register_address(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """A new source address record (PROCESSING)."""
        record = self.state.register_address(body, self.clock())
        log.info("source address registered", address_id=record.id, wallet_id=record.wallet_id)
        self._commit()
        if self.cfg.auto_review:
            self._later(self._auto_approve_address, record.id)
        return record.wire()

    def disable_address(self, address_id: str) -> dict[str, Any]:
        """Disable a source address record."""
        record = self.state.disable_address(address_id, self.clock())
        self._commit()
        return record.wire()

    def create_sub_wallet(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a sub-wallet: body name (mandatory), autoCollection, walletType."""
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            raise WalletCodeError(INCOMPLETE, "name is mandatory to create a sub-wallet")
        auto = body.get("autoCollection", False)
        kind = body.get("walletType")
        if not isinstance(auto, bool) or not (kind is None or isinstance(kind, str)):
            raise WalletCodeError(
                BAD_VALUE, "autoCollection must be a boolean, walletType a string"
            )
        return self.put_wallet(None, name, auto, kind)

    def add_withdraw_whitelist(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Record a withdrawal whitelist entry (address and network mandatory)."""
        missing = [f for f in ("address", "network") if not body.get(f)]
        if missing:
            raise WalletCodeError(INCOMPLETE, f"{', '.join(missing)} is mandatory")
        wallet_id = body.get("walletId")
        if wallet_id is not None:
            self.state.wallet(wallet_id)
        entry = {**body, "id": new_id("W"), "createTime": self.clock()}
        self.state.withdraw_whitelist.append(entry)
        self._commit()
        return entry

    # --- auto review --------------------------------------------------------------------------

    def _later(self, fn: Callable[[str], object], arg: str) -> None:
        loop = asyncio.get_running_loop()
        holder: list[asyncio.TimerHandle] = []

        def run() -> None:
            self._timers.discard(holder[0])
            with contextlib.suppress(SandboxError):
                fn(arg)

        holder.append(loop.call_later(self.cfg.auto_review_delay_s, run))
        self._timers.add(holder[0])

    def _auto_approve_review(self, tx_id: str) -> None:
        self.approve_review(tx_id)

    def _auto_approve_address(self, address_id: str) -> None:
        self.approve_address(address_id)


SANDBOX_KEY = web.AppKey("sandbox", Sandbox)
