"""`depositd sandbox --config FILE [--port N] [--state FILE]`: run the sandbox until signalled."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiohttp import web
from yarl import URL

from worker.logs import configure, get_logger
from worker.sandbox.app import create_app
from worker.sandbox.config import SandboxConfig
from worker.settings import Settings, load_settings

log = get_logger(__name__)


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
        signature=settings.provider.signature,
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
    host, port = listen_address(settings.provider.base_url, getattr(args, "port", None))
    log.info(
        "sandbox starting",
        listen=f"{host}:{port}",
        deliver_to=cfg.webhook_url,
        state_path=str(cfg.state_path) if cfg.state_path else None,
    )
    # run_app installs SIGINT/SIGTERM handlers and runs the cleanup contexts on the way out.
    try:
        web.run_app(create_app(cfg), host=host, port=port, print=None, access_log=None)
    except OSError as exc:  # the port is taken, or not ours to bind
        log.error("sandbox cannot listen", listen=f"{host}:{port}", error=exc.strerror or str(exc))
        return 1
    log.info("sandbox stopped")
    return 0
