"""The known-address flow (`depositd register-address`).

Register the source address with a stored profile's payer details (this form carries
walletAddress and network), poll the address detail until ACTIVE or FAILED, alert on FAILED;
with `--replace-failed` a FAILED record for the same address is disabled and a new one registered
(a record cannot be edited). Records are kept in the `addresses` table; WALLET_ADDRESS_UPDATED
webhooks update them too.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import time
from functools import partial
from typing import Any

import sqlite_utils

from worker.check import load_bundle
from worker.errors import ConfigError, ProviderError
from worker.logs import configure
from worker.notify.channels import notifiers_from_settings, send_all
from worker.notify.message import build_alert
from worker.provider import jsonio
from worker.provider.client import ProviderClient
from worker.provider.models import AddressStatus, SourceAddress
from worker.provider.payer import PayerValidationError, content_hash, validate_payer
from worker.queries import utc_now
from worker.settings import Settings, load_settings
from worker.store import Store

FINAL = (AddressStatus.ACTIVE, AddressStatus.FAILED, AddressStatus.DISABLED)


def register_body(
    profile_body: dict[str, Any],
    *,
    wallet_id: int,
    address: str,
    network: str,
    memo: str | None = None,
    tx_hash: str | None = None,
) -> dict[str, Any]:
    """The register body: the payer details plus the source address fields."""
    body: dict[str, Any] = {
        **profile_body,
        "walletId": wallet_id,
        "walletAddress": address,
        "network": network,
    }
    if memo:
        body["memo"] = memo
    if tx_hash:
        body["txHash"] = tx_hash
    return body


def save_address(db: sqlite_utils.Database, record: SourceAddress, profile: str | None) -> None:
    """Insert or update one address row."""
    now = utc_now()
    db.execute(
        "INSERT INTO addresses (id, wallet_id, wallet_address, network, memo, status, fail_message,"
        " profile, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)"
        " ON CONFLICT(id) DO UPDATE SET status=excluded.status,"
        " fail_message=excluded.fail_message, updated_at=excluded.updated_at,"
        " profile=COALESCE(excluded.profile, addresses.profile)",
        [
            record.id,
            record.walletId,
            record.walletAddress,
            record.network,
            record.memo,
            record.status.value,
            record.failMessage,
            profile,
            now,
            now,
        ],
    )


def _say(text: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{text}", end="", file=sys.stderr, flush=True)
    else:
        print(text, file=sys.stderr)


async def register(
    settings: Settings,
    client: ProviderClient,
    store: Store,
    *,
    wallet_id: int,
    address: str,
    network: str,
    profile: str,
    memo: str | None = None,
    tx_hash: str | None = None,
    replace_failed: bool = False,
    wait: bool = True,
    poll_s: float = 2.0,
    timeout_s: float = 3600.0,
) -> SourceAddress:
    """Run the known-address flow; returns the final (or last seen) record."""
    bundle = load_bundle(settings)
    if profile not in bundle.profiles.names():
        raise ConfigError([f"{settings.profiles}: no profile named {profile!r}"])
    body = register_body(
        bundle.profiles.body(profile),
        wallet_id=wallet_id,
        address=address,
        network=network,
        memo=memo,
        tx_hash=tx_hash,
    )
    try:
        validate_payer(body, form="register")
    except PayerValidationError as exc:
        fields = ", ".join(p.field for p in exc.problems)
        raise ConfigError([f"profile {profile!r} cannot register an address: {fields}"]) from None

    replaced: list[str] = []
    if replace_failed:
        page = await client.list_addresses(status="FAILED", page_size=100)
        for old in page.records:
            if old.walletAddress == address and old.network == network:
                disabled = await client.disable_address(old.id, idempotency_key=f"disable-{old.id}")
                old_done = disabled or old.model_copy(update={"status": AddressStatus.DISABLED})
                await store.write(partial(save_address, record=old_done, profile=None))
                replaced.append(old.id)
                _say(f"disabled FAILED record {old.id}\n")

    # Same address + payer content: same key, so a retried command does not register twice;
    # a new key once a FAILED record was replaced, or the provider would replay the old answer.
    key = hashlib.sha256(
        f"{wallet_id}:{address}:{network}:{content_hash(body)}:{','.join(replaced)}".encode()
    ).hexdigest()[:40]
    record = await client.register_address(body, idempotency_key=key)
    await store.write(lambda db: save_address(db, record, profile))
    _say(f"registered {record.id}: {record.status.value}\n")
    deadline = time.monotonic() + timeout_s
    while wait and record.status not in FINAL and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
        record = await client.address_detail(record.id)
        await store.write(partial(save_address, record=record, profile=profile))
        _say(f"address {record.id}: {record.status.value}")
    if wait:
        _say("\n")
    if record.status is AddressStatus.FAILED:
        alert = build_alert(
            "address_failed",
            "warning",
            None,
            detail=f"{address} on {network} (record {record.id}): {record.failMessage or ''}",
            profile=profile,
        )
        await send_all(notifiers_from_settings(settings.notify), alert, None)
    return record


async def _main(args: argparse.Namespace, settings: Settings) -> int:
    store = Store(settings.storage.path, synchronous=settings.storage.synchronous)
    await store.open()
    try:
        async with ProviderClient.from_settings(settings.provider) as client:
            record = await register(
                settings,
                client,
                store,
                wallet_id=args.wallet,
                address=args.address,
                network=args.network,
                profile=args.profile,
                memo=args.memo,
                tx_hash=args.tx_hash,
                replace_failed=args.replace_failed,
                wait=not args.no_wait,
            )
    except ProviderError as exc:
        print(f"depositd: provider refused: {exc}", file=sys.stderr)
        return 1
    finally:
        await store.close()
    print(jsonio.dumps(record.to_json_dict()))
    return 0 if record.status is not AddressStatus.FAILED else 1


def run(args: argparse.Namespace) -> int:
    """`depositd register-address`."""
    settings = load_settings(args.config)
    # Logs go to stderr: stdout carries only the final record as JSON.
    configure(settings.log.format, settings.log.level)
    return asyncio.run(_main(args, settings))
