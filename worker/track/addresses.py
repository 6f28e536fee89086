"""WALLET_ADDRESS_UPDATED events: the `addresses` row of a deposit address, by id."""

from __future__ import annotations

from worker.clock import utc_now
from worker.provider.models import AddressStatus, AddressUpdatedData
from worker.store.addresses import address_status, insert_announced, update_announced
from worker.store.db import Db

_FINAL_ADDRESS = (AddressStatus.ACTIVE.value, AddressStatus.FAILED.value)


def apply_address_update(db: Db, data: AddressUpdatedData) -> None:
    """Update the `addresses` row by id, or insert it; a late PROCESSING never undoes a review
    and nothing undoes DISABLED."""
    stored = address_status(db, data.id)
    now = utc_now()
    status = data.status.value
    if stored is None:
        insert_announced(
            db,
            data.id,
            wallet_address=data.walletAddress,
            network=data.network,
            status=status,
            fail_message=data.failMessage,
            now=now,
        )
        return
    if stored == AddressStatus.DISABLED.value and status != stored:
        return  # a disabled record stays disabled (a late or redelivered update says nothing new)
    if status == AddressStatus.PROCESSING.value and stored in _FINAL_ADDRESS:
        return
    update_announced(
        db,
        data.id,
        wallet_address=data.walletAddress,
        network=data.network,
        status=status,
        fail_message=data.failMessage,
        now=now,
    )
