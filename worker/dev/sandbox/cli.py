"""`depositd sandbox --config FILE [--port N] [--state FILE] [--auto-review]`: run the sandbox
until signalled; `depositd sandbox inject --amount A`: a deposit into the running one."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import urllib.error
import urllib.request
from pathlib import Path

from aiohttp import web
from yarl import URL

from worker.config.settings import Settings, load_settings
from worker.dev.sandbox.app import create_app
from worker.dev.sandbox.config import SandboxConfig
from worker.logs import configure, get_logger

log = get_logger(__name__)


# How long an --auto-review sandbox takes to pass a review: long enough to see `submitted`.
AUTO_REVIEW_DELAY_S = 2.0
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def sandbox_config(settings: Settings, state_path: Path | None = None) -> SandboxConfig:
    """The sandbox's view of the worker's configuration (same keys, the other side)."""
    webhook = settings.webhook
    # A worker listening on every interface is reached over loopback.
    host = (
        "127.0.0.1" if webhook.host in ("0.0.0.0", "::", "") else webhook.listen.rpartition(":")[0]
    )
    return SandboxConfig(
        api_key=settings.provider.api_key.get_secret_value(),
        api_secret=settings.provider.api_secret.get_secret_value(),
        webhook_url=f"http://{host}:{webhook.port}{webhook.path}",
        webhook_api_key=webhook.api_key.get_secret_value(),
        webhook_secret=webhook.secret[0].get_secret_value(),
        signature=settings.provider.scheme,
        webhook_signature=webhook.scheme,
        state_path=state_path,
    )


def listen_address(base_url: str, port: int | None = None) -> tuple[str, int]:
    """Host and port of provider.base_url (`port` overrides)."""
    url = URL(base_url)
    host = url.host or "127.0.0.1"
    return host, port if port is not None else (url.port or 80)


def run(args: argparse.Namespace) -> int:
    """Run the sandbox until SIGINT/SIGTERM; exit 0 after a clean stop."""
    if getattr(args, "sandbox_command", None) == "inject":
        return inject(args)
    settings = load_settings(args.config)
    configure(settings.log.format, settings.log.level)
    state = getattr(args, "state", None)
    cfg = sandbox_config(settings, Path(state) if state else None)
    if getattr(args, "auto_review", False):
        cfg.auto_review = True
        cfg.auto_review_delay_s = AUTO_REVIEW_DELAY_S
    host, port = listen_address(settings.provider.base_url, getattr(args, "port", None))
    if settings.log.level in ("warning", "error"):
        # The start line is logged at info; a quieter log still says where the sandbox is.
        print(f"sandbox listening on {host}:{port}", file=sys.stderr, flush=True)
    log.info(
        "sandbox starting",
        listen=f"{host}:{port}",
        deliver_to=cfg.webhook_url,
        state_path=str(cfg.state_path) if cfg.state_path else None,
        auto_review=cfg.auto_review,
    )
    # run_app installs SIGINT/SIGTERM handlers and runs the cleanup contexts on the way out.
    try:
        web.run_app(create_app(cfg), host=host, port=port, print=None, access_log=None)
    except OSError as exc:  # the port is taken, or not ours to bind
        log.error("sandbox cannot listen", listen=f"{host}:{port}", error=exc.strerror or str(exc))
        return 1
    log.info("sandbox stopped")
    return 0


def inject(args: argparse.Namespace) -> int:
    """POST one deposit to the running sandbox's control API; print its transactionId."""
    settings = load_settings(args.config)
    source = args.from_address or "T" + "".join(secrets.choice(_BASE58) for _ in range(33))
    body = {
        "walletId": args.wallet,
        "currency": args.currency,
        "network": args.network,
        "amount": args.amount,
        "fromAddress": source,
    }
    url = f"{settings.provider.base_url}/_sandbox/deposits"
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            order = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        error = json.loads(exc.read() or b"{}").get("error", exc.reason)
        print(f"depositd: the sandbox refused the deposit: {error}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        print(
            f"depositd: no sandbox at {settings.provider.base_url} ({reason}); start it with"
            f" `depositd sandbox --config {settings.config_path}`",
            file=sys.stderr,
        )
        return 1
    print(
        f"deposit {order['transactionId']}: {args.amount} {args.currency} ({args.network}) into"
        f" wallet {args.wallet} from {source}"
    )
    return 0
