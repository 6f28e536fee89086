"""The sandbox's state machine: deposit orders, source addresses, wallets and balances.

No I/O: every operation takes the current time, changes the state and returns the webhook
events it causes; the caller (`handle.Sandbox`) persists and delivers them. The rows followed
are the provider interface's Transitions and Combined reading tables; where the interface is
silent (FAIL, BLOCKED, disable) the choices are written next to the code.

Provider-facing operations raise `WalletCodeError` with the interface's wallet code; control
operations raise `SandboxNotFound` / `SandboxError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from worker.dev.sandbox.config import WalletSpec
from worker.dev.sandbox.records import (
    Address,
    Balance,
    Event,
    Order,
    Wallet,
    new_id,
    new_tx_hash,
    status_value,
)
from worker.errors import SandboxError, SandboxNotFound, WalletCodeError
from worker.provider.codes import WalletCode
from worker.provider.models import (
    AddressStatus,
    CreditStatus,
    EventType,
    OrderStatus,
    WhiteListStatus,
)
from worker.provider.payer import PayerValidationError, validate_payer

NOT_FOUND = WalletCode.NOT_FOUND.value
REVIEW_COMPLETED = WalletCode.REVIEW_COMPLETED.value
INCOMPLETE = WalletCode.INCOMPLETE.value
BAD_VALUE = WalletCode.BAD_VALUE.value
CANNOT_SUBMIT_NOW = WalletCode.CANNOT_SUBMIT_NOW.value
DUPLICATE = WalletCode.DUPLICATE.value
WALLET_INVALID = WalletCode.WALLET_INVALID.value


@dataclass
class SandboxState:
    """Everything the sandbox knows; persisted as documents by `store`."""

    providers: list[str]
    main_wallet_id: int | None = None
    wallets: dict[int, Wallet] = field(default_factory=dict)
    orders: dict[str, Order] = field(default_factory=dict)
    addresses: dict[str, Address] = field(default_factory=dict)
    balances: dict[tuple[int, str], Balance] = field(default_factory=dict)
    withdraw_whitelist: list[dict[str, Any]] = field(default_factory=list)
    # Abnormal fund records by id, and settlement report discrepancies (see `money`).
    abnormal_funds: dict[int, dict[str, Any]] = field(default_factory=dict)
    settlement_changes: list[dict[str, Any]] = field(default_factory=list)
    # Hosted Travel Rule page tokens: token -> {walletId, transactionId, expiresTime}.
    travel_rule_tokens: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Stable and collection orders by orderId (see `orders`), onboardings and quotes (`partner`).
    stable_orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    collect_orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    onboardings: dict[str, dict[str, Any]] = field(default_factory=dict)
    quotes: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def initial(
        cls, wallets: Iterable[WalletSpec], providers: list[str], main_wallet_id: int | None = None
    ) -> SandboxState:
        """A fresh state with the configured wallets and nothing else."""
        state = cls(providers=list(providers), main_wallet_id=main_wallet_id)
        for spec in wallets:
            state.wallets[spec.wallet_id] = Wallet(
                spec.wallet_id, spec.name, spec.auto_collection, spec.wallet_type
            )
        return state

    # --- lookups ------------------------------------------------------------------------------

    def wallet(self, wallet_id: int) -> Wallet:
        """A wallet of ours, or 10000107."""
        found = self.wallets.get(wallet_id)
        if found is None:
            raise WalletCodeError(WALLET_INVALID, f"wallet {wallet_id} is invalid or not created")
        return found

    def order(self, tx_id: str) -> Order:
        """A deposit order of ours, or 10000100."""
        found = self.orders.get(tx_id)
        if found is None or found.wallet_id not in self.wallets:
            raise WalletCodeError(NOT_FOUND, f"transaction {tx_id} not found")
        return found

    def address(self, address_id: str) -> Address:
        """A source address record of ours, or 10000100."""
        found = self.addresses.get(address_id)
        if found is None:
            raise WalletCodeError(NOT_FOUND, f"source address {address_id} not found")
        return found

    def balance(self, wallet_id: int, currency: str) -> Balance:
        """The balance row of a wallet and currency (created at zero when new)."""
        return self.balances.setdefault((wallet_id, currency), Balance())

    def history(
        self,
        *,
        white_list_status: WhiteListStatus | None = None,
        wallet_id: int | None = None,
        currency: str | None = None,
        start_time: int | None = None,
        end_time: int | None = None,
    ) -> list[Order]:
        """Deposit orders matching every given filter, oldest first (stable pages)."""
        rows = [
            o
            for o in self.orders.values()
            if (
                white_list_status is None
                # The work queues hold deposits waiting for details: never a failed one.
                or (o.white_list_status == white_list_status and o.status is not OrderStatus.FAIL)
            )
            and (wallet_id is None or o.wallet_id == wallet_id)
            and (currency is None or o.currency == currency)
            and (start_time is None or o.create_time >= start_time)
            and (end_time is None or o.create_time <= end_time)
            and o.wallet_id in self.wallets
        ]
        return sorted(rows, key=lambda o: (o.create_time, o.transaction_id))

    def _control_order(self, tx_id: str) -> Order:
        found = self.orders.get(tx_id)
        if found is None:
            raise SandboxNotFound(f"no deposit {tx_id}")
        return found

    def _control_address(self, address_id: str) -> Address:
        found = self.addresses.get(address_id)
        if found is None:
            raise SandboxNotFound(f"no source address {address_id}")
        return found

    def _active_source(self, wallet_id: int, from_address: str, network: str) -> bool:
        return any(
            a.status is AddressStatus.ACTIVE
            and a.wallet_id == wallet_id
            and a.wallet_address == from_address
            and a.network == network
            for a in self.addresses.values()
        )

    # --- deposits -----------------------------------------------------------------------------

    def inject_deposit(
        self,
        *,
        wallet_id: int,
        currency: str,
        network: str,
        amount: Decimal,
        from_address: str,
        now: int,
        tx_hash: str | None = None,
        to_address: str | None = None,
    ) -> tuple[Order, list[Event]]:
        """A deposit confirmed on chain: gated (init) unless the source address is ACTIVE."""
        wallet = self.wallets.get(wallet_id)
        if wallet is None:
            raise SandboxNotFound(f"no wallet {wallet_id}")
        for name, text in (("currency", currency), ("network", network), ("from", from_address)):
            if not text:
                raise SandboxError(f"{name} must not be empty")
        order = Order(
            transaction_id=new_id("T"),
            transaction_hash=tx_hash or new_tx_hash(network),
            wallet_id=wallet_id,
            wallet_name=wallet.name,
            currency=currency,
            network=network,
            amount=amount,
            from_address=from_address,
            to_address=to_address or wallet.deposit_address(network),
            status=OrderStatus.PROCESSING,
            white_list_status=WhiteListStatus.INIT,
            credit_status=CreditStatus.PENDING,
            create_time=now,
            update_time=now,
        )
        self.orders[order.transaction_id] = order
        balance = self.balance(wallet_id, currency)
        if not self._active_source(wallet_id, from_address, network):
            balance.unavailable += amount
            return order, [order.event(EventType.DEPOSIT_WHITELIST_REQUIRED, now)]
        # An ACTIVE source: an ordinary deposit, credited at once, never a whitelist event.
        order.white_list_status = None
        order.credit_status = CreditStatus.CREDITED
        order.credit_time = now
        balance.available += amount
        if wallet.auto_collection:
            return order, []
        order.status = OrderStatus.SUCCESS
        return order, [order.event(EventType.DEPOSIT_ORDER_NOTIFICATION, now)]

    def submit(self, tx_id: str, body: Mapping[str, Any], now: int) -> Order:
        """Payer details for a received deposit: init or rejected -> pending."""
        order = self.order(tx_id)
        wls = order.white_list_status
        if order.status is OrderStatus.FAIL:
            raise WalletCodeError(REVIEW_COMPLETED, f"deposit {tx_id} failed; nothing to submit")
        if wls is None:
            raise WalletCodeError(
                REVIEW_COMPLETED, f"deposit {tx_id} is not subject to the deposit whitelist"
            )
        if wls is WhiteListStatus.APPROVED:
            raise WalletCodeError(REVIEW_COMPLETED, f"review already completed for {tx_id}")
        if wls is WhiteListStatus.PENDING:
            raise WalletCodeError(
                CANNOT_SUBMIT_NOW, f"deposit {tx_id} is under review (processing)"
            )
        try:
            validate_payer(body, form="submit", providers=self.providers)
        except PayerValidationError as exc:
            raise WalletCodeError(exc.code, str(exc)) from None
        order.white_list_status = WhiteListStatus.PENDING
        order.fail_message = None
        order.update_time = now
        return order

    def _under_review(self, tx_id: str) -> Order:
        """The order, if a review decision may be taken on it: PROCESSING, whiteListStatus
        pending, not BLOCKED (a failed or blocked deposit is never decided later)."""
        order = self._control_order(tx_id)
        if order.white_list_status is not WhiteListStatus.PENDING:
            raise SandboxError(
                f"deposit {tx_id} is not under review ({status_value(order.white_list_status)})"
            )
        if order.status is not OrderStatus.PROCESSING:
            raise SandboxError(f"deposit {tx_id} is {order.status.value}, not PROCESSING")
        if order.credit_status is CreditStatus.BLOCKED:
            raise SandboxError(f"deposit {tx_id} is BLOCKED")
        return order

    def approve_review(self, tx_id: str, now: int) -> tuple[Order, list[Event]]:
        """Review passes: approved + CREDITED; SUCCESS at once without auto-collection."""
        order = self._under_review(tx_id)
        order.white_list_status = WhiteListStatus.APPROVED
        order.credit_status = CreditStatus.CREDITED
        order.credit_time = now
        order.update_time = now
        balance = self.balance(order.wallet_id, order.currency)
        balance.unavailable -= order.amount
        balance.available += order.amount
        wallet = self.wallets.get(order.wallet_id)
        if wallet is not None and wallet.auto_collection:
            return order, [order.event(EventType.DEPOSIT_WHITELIST_CREDITED, now, creditTime=now)]
        order.status = OrderStatus.SUCCESS
        return order, [
            order.event(EventType.DEPOSIT_WHITELIST_CREDITED, now, creditTime=now),
            order.event(EventType.DEPOSIT_ORDER_NOTIFICATION, now),
        ]

    def reject_review(self, tx_id: str, fail_message: str, now: int) -> tuple[Order, list[Event]]:
        """Review rejects: rejected with failMessage; order PROCESSING, funds stay unavailable."""
        order = self._under_review(tx_id)
        if not fail_message:
            raise SandboxError("failMessage must not be empty")
        order.white_list_status = WhiteListStatus.REJECTED
        order.fail_message = fail_message
        order.update_time = now
        return order, [
            order.event(EventType.DEPOSIT_WHITELIST_FAILED, now, failMessage=fail_message)
        ]

    def finish_sweep(self, tx_id: str, now: int) -> tuple[Order, list[Event]]:
        """Auto-collection sweep ends: a credited PROCESSING order becomes SUCCESS."""
        order = self._control_order(tx_id)
        if order.status is not OrderStatus.PROCESSING:
            raise SandboxError(f"deposit {tx_id} is {order.status.value}, not PROCESSING")
        if order.credit_status is not CreditStatus.CREDITED:
            raise SandboxError(f"deposit {tx_id} is not credited ({order.credit_status.value})")
        wallet = self.wallets.get(order.wallet_id)
        if wallet is None or not wallet.auto_collection:
            raise SandboxError(f"wallet {order.wallet_id} has no auto-collection: nothing sweeps")
        self._sweep_funds(order)
        order.status = OrderStatus.SUCCESS
        order.update_time = now
        return order, [order.event(EventType.DEPOSIT_ORDER_NOTIFICATION, now)]

    def _sweep_funds(self, order: Order) -> None:
        """Auto-collection: the credited amount leaves the receiving wallet for the main
        account (stays put when no main account is configured)."""
        main = self.main_wallet_id
        if main is None or main not in self.wallets or main == order.wallet_id:
            return
        self.balance(order.wallet_id, order.currency).available -= order.amount
        self.balance(main, order.currency).available += order.amount

    def block(self, tx_id: str, now: int) -> Order:
        """creditStatus BLOCKED (not shown by the interface: no webhook, detail shows it)."""
        order = self._control_order(tx_id)
        if order.status is not OrderStatus.PROCESSING or order.credit_status is not (
            CreditStatus.PENDING
        ):
            raise SandboxError(f"only an uncredited PROCESSING deposit can be blocked ({tx_id})")
        order.credit_status = CreditStatus.BLOCKED
        order.update_time = now
        return order

    def release(self, tx_id: str, now: int) -> tuple[Order, list[Event]]:
        """A BLOCKED deposit is released: CREDITED (approved where the whitelist applied),
        unavailable -> available, order SUCCESS (an auto-collection sweep ends with it)."""
        order = self._control_order(tx_id)
        if order.credit_status is not CreditStatus.BLOCKED:
            raise SandboxError(f"deposit {tx_id} is not BLOCKED ({order.credit_status.value})")
        balance = self.balance(order.wallet_id, order.currency)
        balance.unavailable -= order.amount
        balance.available += order.amount
        order.credit_status = CreditStatus.CREDITED
        order.credit_time = now
        order.update_time = now
        events: list[Event] = []
        if order.white_list_status is not None:
            order.white_list_status = WhiteListStatus.APPROVED
            order.fail_message = None
            events.append(order.event(EventType.DEPOSIT_WHITELIST_CREDITED, now, creditTime=now))
        wallet = self.wallets.get(order.wallet_id)
        if wallet is not None and wallet.auto_collection:
            self._sweep_funds(order)
        order.status = OrderStatus.SUCCESS
        events.append(order.event(EventType.DEPOSIT_ORDER_NOTIFICATION, now))
        return order, events

    def fail_order(self, tx_id: str, now: int) -> tuple[Order, list[Event]]:
        """Order FAIL (not shown by the interface): the held funds leave the unavailable balance."""
        order = self._control_order(tx_id)
        if order.status is not OrderStatus.PROCESSING or order.credit_status is (
            CreditStatus.CREDITED
        ):
            raise SandboxError(f"only an uncredited PROCESSING deposit can fail ({tx_id})")
        self.balance(order.wallet_id, order.currency).unavailable -= order.amount
        order.status = OrderStatus.FAIL
        order.update_time = now
        return order, [order.event(EventType.DEPOSIT_ORDER_NOTIFICATION, now)]

    # --- source addresses ---------------------------------------------------------------------

    def register_address(self, body: Mapping[str, Any], now: int) -> Address:
        """Register a source address with payer details: a new PROCESSING record."""
        try:
            details = validate_payer(body, form="register", providers=self.providers)
        except PayerValidationError as exc:
            raise WalletCodeError(exc.code, str(exc)) from None
        if details.walletId is None:
            raise WalletCodeError(INCOMPLETE, "walletId is mandatory to register a source address")
        self.wallet(details.walletId)
        assert details.walletAddress is not None and details.network is not None
        for other in self.addresses.values():
            if (
                other.wallet_id == details.walletId
                and other.wallet_address == details.walletAddress
                and other.network == details.network
                and other.status in (AddressStatus.PROCESSING, AddressStatus.ACTIVE)
            ):
                raise WalletCodeError(
                    DUPLICATE, f"source address already registered as {other.id} (duplicate)"
                )
        record = Address(
            id=new_id("A"),
            wallet_id=details.walletId,
            wallet_address=details.walletAddress,
            network=details.network,
            memo=details.memo,
            status=AddressStatus.PROCESSING,
            create_time=now,
            update_time=now,
        )
        self.addresses[record.id] = record
        return record

    def _decide_address(
        self, address_id: str, to: AddressStatus, fail_message: str | None, now: int
    ) -> tuple[Address, list[Event]]:
        record = self._control_address(address_id)
        if record.status is not AddressStatus.PROCESSING:
            raise SandboxError(f"source address {address_id} is {record.status.value}")
        record.status = to
        record.fail_message = fail_message
        record.update_time = now
        return record, [record.event()]

    def approve_address(self, address_id: str, now: int) -> tuple[Address, list[Event]]:
        """Address review passes: PROCESSING -> ACTIVE."""
        return self._decide_address(address_id, AddressStatus.ACTIVE, None, now)

    def reject_address(
        self, address_id: str, fail_message: str, now: int
    ) -> tuple[Address, list[Event]]:
        """Address review rejects: PROCESSING -> FAILED with failMessage."""
        if not fail_message:
            raise SandboxError("failMessage must not be empty")
        return self._decide_address(address_id, AddressStatus.FAILED, fail_message, now)

    def disable_address(self, address_id: str, now: int) -> Address:
        """Disable a record (any status); disabling twice changes nothing."""
        record = self.address(address_id)
        if record.status is not AddressStatus.DISABLED:
            record.status = AddressStatus.DISABLED
            record.update_time = now
        return record

    # --- wallets ------------------------------------------------------------------------------

    def put_wallet(
        self, wallet_id: int | None, name: str, auto_collection: bool, wallet_type: str | None
    ) -> Wallet:
        """Create a wallet (next free id when None) or update its name and auto-collection."""
        if not name:
            raise SandboxError("wallet name must not be empty")
        if wallet_id is None:
            wallet_id = max(self.wallets, default=1000) + 1
        found = self.wallets.get(wallet_id)
        if found is None:
            found = Wallet(wallet_id, name, auto_collection, wallet_type or "collection_prime")
            self.wallets[wallet_id] = found
        else:
            found.name = name
            found.auto_collection = auto_collection
            found.wallet_type = wallet_type or found.wallet_type
        return found

    def wallet_group(self, wallet: Wallet) -> dict[str, Any]:
        """The wallet list's group shape with the wallet's balances."""
        rows = sorted(
            (
                (currency, bal)
                for (wid, currency), bal in self.balances.items()
                if wid == wallet.wallet_id
            ),
            key=lambda row: row[0],
        )
        return {
            "walletId": wallet.wallet_id,
            "name": wallet.name,
            "walletType": wallet.wallet_type,
            "autoCollection": wallet.auto_collection,
            "wallets": [
                {
                    "currency": currency,
                    "available": bal.available,
                    "unavailable": bal.unavailable,
                }
                for currency, bal in rows
            ],
        }
