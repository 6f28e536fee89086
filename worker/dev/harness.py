"""`Stack`: the provider sandbox, the worker, an SMTP server and a Slack endpoint, in one process.

Everything listens on 127.0.0.1 free ports and keeps its files under one work folder, so
end-to-end tests and `depositd demo` drive the real pieces (signed webhooks, the provider API,
SQLite, the outbox, the polls, e-mail and Slack alerts) without anything outside the process.

The configuration is a real YAML file written to the work folder (`config_path`), so CLI
commands can run against a live stack: `python -m worker ledger --config <config_path>`.
The Slack and SMTP servers are in `worker.dev.loopback`; what `settle` compares in
`worker.dev.stackdb`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import secrets
import shutil
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from aiohttp import web

from worker import clock
from worker.act.outbox import Outbox
from worker.config.settings import Settings, load_settings
from worker.config.shipped import shipped_rules
from worker.console.app import run_console
from worker.dev.loopback import free_port, listener, notify_config, port_of, start_slack, start_smtp
from worker.dev.sandbox import SANDBOX_KEY, Sandbox, SandboxConfig, create_app
from worker.dev.sandbox.config import wallets_with
from worker.dev.stackdb import db_snapshot, queue_counts
from worker.service.keys import CONSOLE_APP_KEY, PROCESSOR_KEY, SOLE_KEY, STORE_KEY
from worker.service.runtime import Runtime
from worker.service.setup import build_service
from worker.store.actions import actions_of, all_actions
from worker.store.deposits import get_deposit_row
from worker.store.events import events_of
from worker.store.ledger import all_booked
from worker.store.sqlitestore import Store
from worker.track.processor import Processor
from worker.track.tracker import Deposit

WEBHOOK_PATH = "/webhooks/provider"
NOTIFY_RETRY: dict[str, Any] = {"attempts": 2, "backoff_s": 0.01}

Predicate = Callable[[], Awaitable[bool] | bool]


def shipped_profiles() -> Path:
    """The shipped demo payer profiles, `rules/profiles.yaml`."""
    return shipped_rules() / "profiles.yaml"


def _half_a_day_away() -> str:
    """HH:MM (UTC) twelve hours from now."""
    return (datetime.now(UTC) + timedelta(hours=12)).strftime("%H:%M")


class Stack:
    """Sandbox + worker + in-process SMTP server + Slack endpoint, all on 127.0.0.1 free ports."""

    def __init__(
        self,
        workdir: Path,
        *,
        rules: Path | None = None,
        profiles: Path | None = None,
        scheduler: bool = True,
        history_interval_s: float = 0.5,
        detail_interval_s: float = 0.5,
        blocked_interval_s: float = 0.5,
        notify: bool = True,
        auto_collection: dict[int, bool] | None = None,
        outbox_backoff_s: float = 0.05,
        provider_clock_offset_ms: int = 0,
        console: bool = False,
        storage: dict[str, str] | None = None,
        sole: bool = True,
        signature: dict[str, str] | None = None,
        journal_at: str | None = None,
        reconcile_at: str | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        # False: another stack's worker runs on the same `storage` (its claims and lease live).
        self.sole = sole
        # Signature keys (`signature`, `signature_encoding`, ...) for both the provider and the
        # webhook section; the sandbox takes the schemes they select (docs/signatures.md).
        self.signature = dict(signature or {})
        # The `storage` section (a PostgreSQL `url`); by default a SQLite file in `workdir`.
        self.storage = storage
        self.rules_source = rules
        self.profiles_source = profiles
        self.scheduler_enabled = scheduler
        self.history_interval_s = history_interval_s
        self.detail_interval_s = detail_interval_s
        self.blocked_interval_s = blocked_interval_s
        self.notify = notify
        self.auto_collection = dict(auto_collection or {})
        self.outbox_backoff_s = outbox_backoff_s
        # The daily journal job's minute (UTC); by default half a day away, so that a test
        # sees its head alert only when it asks for it.
        self.journal_at = journal_at or _half_a_day_away()
        # The daily reconciliation's minute (UTC), half a day away by default as well: a stack
        # started within the hour after it would reconcile yesterday at once, beside what the
        # test itself runs (worker/schedule/money.py, `MoneyJobs.start`).
        self.reconcile_at = reconcile_at or _half_a_day_away()
        # The sandbox's clock against this machine's (the provider's timestamps come from it).
        self.provider_clock_offset_ms = provider_clock_offset_ms

        # Credentials of this stack only; the YAML file holds them inline.
        self.api_key = "sandbox-" + secrets.token_hex(4)
        self.api_secret = secrets.token_hex(16)
        self.webhook_api_key = self.api_key
        self.webhook_secret = secrets.token_hex(16)

        self.config_path = self.workdir / "depositd.yaml"
        self.db_path = self.workdir / "depositd.db"
        self.profiles_path = self.workdir / "profiles.yaml"

        self.emails: list[EmailMessage] = []
        self.slack: list[dict[str, Any]] = []
        # The Slack endpoint answers with this status (a test sets 500 to make alerts fail).
        self.slack_status = 200

        # The operator console (worker.console), when asked for: its URL and login token.
        self.console = console
        self.console_url = ""
        self.console_token = secrets.token_urlsafe(24)
        self.console_token_path = self.workdir / "console_token"
        self._console_port = 0
        self._console_stack: contextlib.AsyncExitStack | None = None

        self.sandbox_url = ""
        self.worker_url = ""
        self.webhook_url = ""
        self.slack_url = ""
        self.smtp_port = 0
        self._worker_port = 0
        self._settings: Settings | None = None
        self._runtime: Runtime | None = None
        self._app: web.Application | None = None
        self._sandbox_app: web.Application | None = None
        self._worker_runner: web.AppRunner | None = None
        self._sandbox_runner: web.AppRunner | None = None
        self._slack_runner: web.AppRunner | None = None
        self._smtp: Any = None  # aiosmtpd Controller
        self._owned: list[socket.socket] = []  # sockets handed to a running site

    # --- what tests read ---------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings loaded from `config_path`."""
        if self._settings is None:
            raise RuntimeError("the stack is not started")
        return self._settings

    @property
    def runtime(self) -> Runtime:
        """The worker's runtime (rules, profiles, outbox, scheduler, poller, client)."""
        if self._runtime is None:
            raise RuntimeError("the worker is not running")
        return self._runtime

    @property
    def app(self) -> web.Application:
        """The worker's aiohttp application."""
        if self._app is None:
            raise RuntimeError("the worker is not running")
        return self._app

    @property
    def store(self) -> Store:
        """The worker's store."""
        return self.app[STORE_KEY]

    @property
    def processor(self) -> Processor:
        """The worker's inbox processor."""
        return self.app[PROCESSOR_KEY]

    @property
    def outbox(self) -> Outbox:
        """The worker's outbox runner."""
        outbox = self.runtime.outbox
        if outbox is None:
            raise RuntimeError("the worker's outbox is not running")
        return outbox

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox handle: inject deposits, decide reviews, drop webhooks, inject faults."""
        if self._sandbox_app is None:
            raise RuntimeError("the stack is not started")
        return self._sandbox_app[SANDBOX_KEY]

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Stack:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the alert sinks, the sandbox and the worker; stop what started on failure."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        source = self.profiles_source or shipped_profiles()
        if source.resolve() != self.profiles_path.resolve():
            # A copy: rewrite_profiles must never touch the shipped file or a test's fixture.
            shutil.copyfile(source, self.profiles_path)
        if self.notify:
            await self._start_sinks()
        worker_sock, sandbox_sock = listener(), listener()
        try:
            await self._start_sandbox_and_worker(worker_sock, sandbox_sock)
        finally:
            # Sites own their sockets once started; close whatever did not get that far.
            for sock in (worker_sock, sandbox_sock):
                if sock not in self._owned:
                    sock.close()

    async def _start_sandbox_and_worker(
        self, worker_sock: socket.socket, sandbox_sock: socket.socket
    ) -> None:
        self._worker_port = port_of(worker_sock)
        sandbox_port = port_of(sandbox_sock)
        if self.console:
            self._console_port = free_port()
            self.console_url = f"http://127.0.0.1:{self._console_port}"
            self.console_token_path.write_text(self.console_token + "\n", encoding="utf-8")
            self.console_token_path.chmod(0o600)
        self.worker_url = f"http://127.0.0.1:{self._worker_port}"
        self.webhook_url = self.worker_url + WEBHOOK_PATH
        self.sandbox_url = f"http://127.0.0.1:{sandbox_port}"
        self.config_path.write_text(self._config_yaml(), encoding="utf-8")
        self._settings = load_settings(self.config_path)

        offset = self.provider_clock_offset_ms

        def provider_clock() -> int:
            return clock.now_ms() + offset

        self._sandbox_app = create_app(
            self._sandbox_config(), clock=provider_clock, signing_clock=provider_clock
        )
        self._sandbox_runner = web.AppRunner(
            self._sandbox_app, handle_signals=False, access_log=None, shutdown_timeout=1.0
        )
        await self._sandbox_runner.setup()
        await web.SockSite(self._sandbox_runner, sandbox_sock).start()
        self._owned.append(sandbox_sock)
        await self._start_worker(worker_sock)

    async def stop(self) -> None:
        """Stop the worker, then the sandbox, then the alert sinks; safe to call twice."""
        await self._stop_worker()
        if self._sandbox_runner is not None:
            runner, self._sandbox_runner = self._sandbox_runner, None
            await runner.cleanup()
        if self._slack_runner is not None:
            runner, self._slack_runner = self._slack_runner, None
            await runner.cleanup()
        if self._smtp is not None:
            controller, self._smtp = self._smtp, None
            await asyncio.to_thread(controller.stop)
        self._owned.clear()

    async def restart_worker(self) -> None:
        """Stop the worker app and start a new one on the same database, config and port."""
        await self.stop_worker()
        await self.start_worker()

    async def stop_worker(self) -> None:
        """Stop the worker app as SIGTERM stops serve (the sandbox and the sinks stay up)."""
        await self._stop_worker()

    async def start_worker(self) -> None:
        """Start a worker app on the same database, config and port."""
        await self._start_worker(listener(self._worker_port))

    async def _start_worker(self, sock: socket.socket) -> None:
        try:
            await self._serve_worker(sock)
        finally:
            if sock not in self._owned:
                sock.close()

    async def _serve_worker(self, sock: socket.socket) -> None:
        runtime = Runtime(
            self.settings,
            outbox_backoff_s=self.outbox_backoff_s,
            notify_retry=NOTIFY_RETRY,
            client_retries=1,
            poll_backoff_s=0.05,
        )
        app, _ = build_service(self.settings, runtime, sweep_interval_s=0.5)
        # One worker per database here (unless `sole` says otherwise), as a `serve` that came
        # alone: what a stopped worker claimed is taken over at once by the next.
        app[SOLE_KEY] = self.sole
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=5.0)
        self._runtime, self._app, self._worker_runner = runtime, app, runner
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._owned.append(sock)
        if self.console and self.settings.console is not None:
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(
                run_console(app[CONSOLE_APP_KEY], "127.0.0.1", self._console_port)
            )
            self._console_stack = stack

    async def _stop_worker(self) -> None:
        if self._console_stack is not None:
            stack, self._console_stack = self._console_stack, None
            await stack.aclose()
        if self._worker_runner is not None:
            runner, self._worker_runner = self._worker_runner, None
            await runner.cleanup()
        self._app = None
        self._runtime = None

    async def _start_sinks(self) -> None:
        async def receive(request: web.Request) -> web.Response:
            if self.slack_status != 200:
                return web.Response(status=self.slack_status, text="down")
            self.slack.append(await request.json())
            return web.Response(text="ok")

        self._slack_runner, self.slack_url = await start_slack(receive)
        self._smtp, self.smtp_port = await start_smtp(self.emails)

    def _config_yaml(self) -> str:
        rules = self.rules_source or shipped_rules()
        config: dict[str, Any] = {
            "provider": {
                "base_url": self.sandbox_url,
                "api_key": self.api_key,
                "api_secret": self.api_secret,
                "timeout_s": 5,
                # Polls hundreds of times as often as the defaults: the budget scales with them.
                "max_requests_per_s": 1000,
                **self.signature,
            },
            "webhook": {
                "listen": f"127.0.0.1:{self._worker_port}",
                "path": WEBHOOK_PATH,
                "api_key": self.webhook_api_key,
                "secret": self.webhook_secret,
                # The sandbox signs its deliveries by its own clock: a clock set far off
                # must still be let in.
                "tolerance_s": 300 + abs(self.provider_clock_offset_ms) // 1000,
                **self.signature,
            },
            "storage": self.storage or {"path": str(self.db_path)},
            "scheduler": {
                "enabled": self.scheduler_enabled,
                "history_interval_s": self.history_interval_s,
                "detail_interval_s": self.detail_interval_s,
                "blocked_interval_s": self.blocked_interval_s,
                "journal_at": self.journal_at,
                "reconcile_at": self.reconcile_at,
            },
            "rules": str(Path(rules).resolve()),
            "profiles": str(self.profiles_path),
            "log": {"level": "warning"},
        }
        if self.console:
            config["console"] = {
                "listen": f"127.0.0.1:{self._console_port}",
                "token_file": str(self.console_token_path),
                "hosted_url": f"{self.sandbox_url}/hosted",
            }
        if self.notify:
            config["notify"] = notify_config(self.slack_url, self.smtp_port)
        header = "# Written by worker.dev.harness.Stack for one test or demo run.\n"
        return header + yaml.safe_dump(config, sort_keys=False)

    def _sandbox_config(self) -> SandboxConfig:
        return SandboxConfig(
            api_key=self.api_key,
            api_secret=self.api_secret,
            webhook_url=self.webhook_url,
            webhook_api_key=self.webhook_api_key,
            webhook_secret=self.webhook_secret,
            signature=self.settings.provider.scheme,
            webhook_signature=self.settings.webhook.scheme,
            wallets=wallets_with(self.auto_collection),
            delivery_retry_base_s=0.05,
            delivery_retry_max_s=0.5,
            delivery_timeout_s=5,
        )

    # --- waiting -----------------------------------------------------------------------------

    # The harness API gives every wait a `timeout` argument: tests read as one call each.
    async def wait_for(
        self,
        predicate: Predicate,
        timeout: float = 10,  # noqa: ASYNC109
        what: str = "",
    ) -> None:
        """Wait until `predicate()` (sync or async) is true; TimeoutError naming `what`."""
        deadline = time.monotonic() + timeout
        while True:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate!r}")
            await asyncio.sleep(0.02)

    async def settle(self, timeout: float = 10) -> None:  # noqa: ASYNC109
        """Wait until no webhook is queued, no event pending and no outbox row due.

        One pass waits for all three; passes repeat until one changes nothing (a webhook can
        cause an action, an action a webhook).
        """
        deadline = time.monotonic() + timeout
        before: tuple[Any, ...] | None = None
        while True:
            left = deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(left, 0.001)):
                    await self.sandbox.delivered_idle()
                    await self._quiet()
            except TimeoutError:
                busy = await self._busy()
                raise TimeoutError(f"settle: still busy after {timeout}s: {busy}") from None
            await asyncio.sleep(0.02)
            now = await self._snapshot()
            if now == before:
                return
            before = now

    async def _busy(self) -> dict[str, Any]:
        pending = self.sandbox.deliverer.pending()
        counts = await self.store.read(queue_counts)
        return {"webhooksQueued": len(pending), **counts}

    async def _quiet(self) -> None:
        while True:
            counts = await self.store.read(queue_counts)
            if not any(counts.values()):
                return
            self.processor.wake()
            self.outbox.wake()
            await asyncio.sleep(0.01)

    async def _snapshot(self) -> tuple[Any, ...]:
        db_state = await self.store.read(db_snapshot)
        history = self.sandbox.deliverer.history
        last = history[-1].envelope["eventId"] if history else None
        return (db_state, len(history), last, len(self.emails), len(self.slack))

    # --- reading the worker's database -------------------------------------------------------

    async def deposit(self, tx: str) -> Deposit | None:
        """The tracked deposit, or None when the worker has not seen it."""
        row = await self.store.read(lambda db: get_deposit_row(db, tx))
        return Deposit.from_row(row) if row is not None else None

    async def ledger(self) -> list[dict[str, Any]]:
        """Ledger rows, oldest booking first."""
        return await self.store.read(all_booked)

    async def actions(self, tx: str | None = None) -> list[dict[str, Any]]:
        """Action (outbox) rows in id order, of one deposit when `tx` is given; params decoded."""

        def query(db: Any) -> list[dict[str, Any]]:
            rows = all_actions(db) if tx is None else actions_of(db, tx)
            return [dict(r, params=json.loads(r["params"] or "{}")) for r in rows]

        return await self.store.read(query)

    async def events(self, tx: str | None = None) -> list[dict[str, Any]]:
        """Stored webhook events in receive order (without the raw body)."""
        return await self.store.read(lambda db: events_of(db, tx))

    # --- profiles ----------------------------------------------------------------------------

    async def rewrite_profiles(self, text: str) -> bool:
        """Write a new profiles file and reload it as SIGHUP does; False if it was refused."""
        tmp = self.profiles_path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.profiles_path)
        return await self.runtime.reload()

    # --- alerts received ---------------------------------------------------------------------

    def slack_for(self, tx: str, condition: str | None = None) -> list[dict[str, Any]]:
        """Slack payloads about one deposit (and one alert condition when given)."""
        return [
            p
            for p in self.slack
            if tx in str(p.get("text", ""))
            and (condition is None or f"condition `{condition}`" in json.dumps(p))
        ]

    def emails_for(self, tx: str, condition: str | None = None) -> list[EmailMessage]:
        """E-mails about one deposit (and one alert condition when given)."""
        return [
            m
            for m in self.emails
            if tx in str(m.get("Subject", ""))
            and (condition is None or m.get("X-Depositd-Condition") == condition)
        ]
