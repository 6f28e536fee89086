"""The known-address flow (`depositd register-address`).

Register the source address with a stored profile's payer details (this form carries
walletAddress and network), poll the address detail until ACTIVE or FAILED, alert on FAILED;
with `--replace-failed` a FAILED record for the same address is disabled and a new one registered
(a record cannot be edited). Records are kept in the `addresses` table; WALLET_ADDRESS_UPDATED
webhooks update them too.

Payer details are personal data (docs/rules.md): what this command prints and logs names the
profile and the payer fields a provider message mentions, never a value. The FAILED alert carries
the provider's failMessage (the review's reason), as a deposit's rejection alert does.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from worker.clock import utc_now
from worker.config.profiles import Profiles
from worker.config.settings import Settings, load_settings
from worker.errors import (
    ConfigError,
    ProviderAuthError,
    ProviderError,
    ProviderProtocolError,
    ProviderUnavailable,
)
from worker.logs import configure, get_logger
from worker.notify.channels import notifiers_from_settings, send_all
from worker.notify.message import build_alert
from worker.provider import jsonio
from worker.provider.client import ProviderClient
from worker.provider.codes import code_rule
from worker.provider.models import AddressStatus, SourceAddress
from worker.provider.payer import (
    PayerValidationError,
    content_hash,
    fields_named,
    validate_payer,
)
from worker.store.addresses import (
    address_status,
    insert_registered,
    keep_profile,
    update_registered,
)
from worker.store.db import Db
from worker.store.sqlitestore import Store
from worker.store.writelock import command_store

log = get_logger(__name__)

FINAL = (AddressStatus.ACTIVE, AddressStatus.FAILED, AddressStatus.DISABLED)
# A record only moves forward: PROCESSING, then ACTIVE or FAILED (a review), then DISABLED. An
# answer of an earlier status is an old one (the provider replays the first register answer to a
# retried command), so it never overwrites a later status; `apply_address_update` keeps the same
# order for webhooks.
_STATUS_RANK = {
    AddressStatus.PROCESSING.value: 0,
    AddressStatus.ACTIVE.value: 1,
    AddressStatus.FAILED.value: 1,
    AddressStatus.DISABLED.value: 2,
}


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


def registration(
    settings: Settings,
    *,
    profile: str,
    wallet_id: int,
    address: str,
    network: str,
    memo: str | None = None,
    tx_hash: str | None = None,
) -> dict[str, Any]:
    """The register body for `profile`; `ConfigError` naming the profile when there is none.

    Reads the profiles file only (a broken rules file does not stop a registration), so the
    command can check its arguments before it opens (and creates) the database.
    """
    if settings.profiles is None:
        raise ConfigError(
            [f"profiles: no profiles file is configured, so there is no profile named {profile!r}"]
        )
    profiles = Profiles.load(settings.profiles)
    if profile not in profiles.names():
        raise ConfigError([f"{settings.profiles}: no profile named {profile!r}"])
    body = register_body(
        profiles.body(profile),
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
    return body


def save_address(db: Db, record: SourceAddress, profile: str | None) -> None:
    """Insert or update one address row; a status never gives way to an earlier one."""
    now = utc_now()
    stored = address_status(db, record.id)
    if stored is None:
        insert_registered(
            db,
            record.id,
            wallet_id=record.walletId,
            wallet_address=record.walletAddress,
            network=record.network,
            memo=record.memo,
            status=record.status.value,
            fail_message=record.failMessage,
            profile=profile,
            now=now,
        )
    elif _STATUS_RANK.get(stored, 0) > _STATUS_RANK[record.status.value]:
        # An old answer: the newer status stays; only the profile it was registered with is kept.
        keep_profile(db, record.id, profile)
    else:
        update_registered(
            db,
            record.id,
            status=record.status.value,
            fail_message=record.failMessage,
            profile=profile,
            now=now,
        )


def record_json(record: SourceAddress) -> dict[str, Any]:
    """The record's declared fields only: an answer's extra keys (payer data?) never print."""
    return record.model_dump(
        mode="json", include=set(SourceAddress.model_fields), exclude_unset=True
    )


_KINDS: dict[type[ProviderError], str] = {
    ProviderAuthError: "authentication refused",
    ProviderUnavailable: "provider unavailable",
    ProviderProtocolError: "unreadable answer",
}


def refusal(exc: ProviderError, body: Mapping[str, Any]) -> str:
    """A failed provider call for the CLI: code, meaning and the payer fields named, no values."""
    if exc.code is None and exc.http_status is None:
        # No answer was read (timeout, connection error, data of the wrong shape): the message
        # is depositd's own and carries nothing the provider said.
        return f"provider call failed: {exc.msg}"
    if exc.code is None:
        head = f"provider call failed: {_KINDS.get(type(exc), 'failed')} (HTTP {exc.http_status})"
    else:
        rule = code_rule(exc.code)
        head = f"provider refused: code {exc.code}" + (f" ({rule.meaning})" if rule else "")
    fields = fields_named(exc.msg, body)
    named = f"names {', '.join(fields)}" if fields else "names no payer field"
    trace = f" (traceId {exc.trace_id})" if exc.trace_id else ""
    return f"{head}; the provider's message {named}{trace}"


def _progress(text: str) -> None:
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
    body = registration(
        settings,
        profile=profile,
        wallet_id=wallet_id,
        address=address,
        network=network,
        memo=memo,
        tx_hash=tx_hash,
    )
    return await register_prepared(
        settings,
        client,
        store,
        body,
        profile=profile,
        replace_failed=replace_failed,
        wait=wait,
        poll_s=poll_s,
        timeout_s=timeout_s,
    )


async def register_prepared(
    settings: Settings,
    client: ProviderClient,
    store: Store,
    body: dict[str, Any],
    *,
    profile: str,
    replace_failed: bool = False,
    wait: bool = True,
    poll_s: float = 2.0,
    timeout_s: float = 3600.0,
    say: Callable[[str], None] | None = None,
) -> SourceAddress:
    """`register` with the body `registration` built for `profile`; `say`: where the progress
    lines go (default: stderr, redrawn in place on a terminal)."""
    _say = say or _progress
    wallet_id, address, network = body["walletId"], body["walletAddress"], body["network"]
    replaced: list[str] = []
    if replace_failed:
        failed = [
            old
            async for old in client.iter_addresses(
                status="FAILED", page_size=100, max_pages=settings.scheduler.max_pages
            )
        ]
        for old in failed:
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
    await store.write(partial(save_address, record=record, profile=profile))
    _say(f"registered {record.id}: {record.status.value}\n")
    if record.status not in FINAL:
        # A retried command gets the first answer again (same key), PROCESSING even when the
        # record was reviewed since: read what it is now, with or without --no-wait.
        first, record = record.status, await client.address_detail(record.id)
        await store.write(partial(save_address, record=record, profile=profile))
        if record.status is not first:
            _say(f"address {record.id}: {record.status.value}\n")
    deadline = time.monotonic() + timeout_s
    while wait and record.status not in FINAL and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
        record = await client.address_detail(record.id)
        await store.write(partial(save_address, record=record, profile=profile))
        _say(f"address {record.id}: {record.status.value}")
    if wait:
        _say("\n")
    if record.status is AddressStatus.FAILED:
        await _alert_failed(settings, record, profile)
    return record


async def _alert_failed(settings: Settings, record: SourceAddress, profile: str) -> None:
    """Alert a FAILED record on every configured channel, else log it (docs/configuration.md)."""
    alert = build_alert(
        "address_failed",
        "warning",
        None,
        detail=(
            f"{record.walletAddress} on {record.network} (record {record.id}):"
            f" {record.failMessage or ''}"
        ),
        profile=profile,
    )
    notifiers = notifiers_from_settings(settings.notify)
    # The provider's failMessage stays out of the log: only the payer fields it names.
    where = {
        "condition": alert.condition,
        "addressId": record.id,
        "walletAddress": record.walletAddress,
        "network": record.network,
        "profile": profile,
        "failFields": fields_named(record.failMessage, {}),
    }
    if not notifiers:
        log.warning("alert", title=alert.title, channels="none configured", **where)
        return
    for channel, error in (await send_all(notifiers, alert, None)).items():
        if error is not None:
            log.warning("alert not sent", channel=channel, error=error, **where)


async def _main(args: argparse.Namespace, settings: Settings, body: dict[str, Any]) -> int:
    try:
        async with (
            command_store(settings.storage) as store,
            ProviderClient.from_settings(settings.provider) as client,
        ):
            record = await register_prepared(
                settings,
                client,
                store,
                body,
                profile=args.profile,
                replace_failed=args.replace_failed,
                wait=not args.no_wait,
            )
    except ProviderError as exc:
        print(f"depositd: {refusal(exc, body)}", file=sys.stderr)
        return 1
    print(jsonio.dumps(record_json(record)))
    return 0 if record.status is not AddressStatus.FAILED else 1


def run(args: argparse.Namespace) -> int:
    """`depositd register-address`."""
    settings = load_settings(args.config)
    # Logs go to stderr: stdout carries only the final record as JSON.
    configure(settings.log.format, settings.log.level)
    # The profile and arguments are checked before the database is opened: a refused command
    # leaves no database (or folder) behind.
    body = registration(
        settings,
        profile=args.profile,
        wallet_id=args.wallet,
        address=args.address,
        network=args.network,
        memo=args.memo,
        tx_hash=args.tx_hash,
    )
    return asyncio.run(_main(args, settings, body))
