"""`depositd sandbox --config FILE [--port N] [--state FILE] [--auto-review]`: run the sandbox
until signalled (its control verbs, `depositd sandbox inject ...`, are `worker.dev.sandboxctl`)."""

from __future__ import annotations

import argparse
import sys
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
