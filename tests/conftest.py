"""Shared fixtures."""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.configs import PROVIDER_KEY, PROVIDER_SECRET
from tests.support.pgcluster import Cluster, MissingPostgres, running_cluster
from tests.support.processes import Processes
from tests.support.stores import StoreMaker
from worker.dev.harness import Stack
from worker.dev.sandbox import SandboxConfig, create_app
from worker.dev.sandbox import app as sandbox_app
from worker.dev.sandbox.testing import ENTITY_PAYER, INDIVIDUAL_PAYER
from worker.logs import configure as configure_logging
from worker.logs import reset as reset_logging

PROVIDER_NAMES = ("Binance", "OKX", "Coinbase")

ProfileFactory = Callable[..., dict[str, Any]]


@pytest.fixture(autouse=True)
def collect_garbage() -> Iterator[None]:
    """An unclosed socket or transport is reported by the test that left it (its
    ResourceWarning fails that test), not by whichever later test the collector runs in."""
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def fresh_logging() -> Iterator[None]:
    """Each test starts from structlog's defaults (a command run by an earlier test configured
    logging at its own level)."""
    yield
    reset_logging()


@pytest.fixture
def log_lines() -> io.StringIO:
    """Every log line from now on, as JSON text."""
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    return out


@pytest.fixture
def provider_names() -> tuple[str, ...]:
    """Provider names as the options endpoint would list them."""
    return PROVIDER_NAMES


@pytest.fixture
def entity_payer() -> ProfileFactory:
    """A factory of valid ENTITY payer details; keyword arguments override (None drops a key)."""

    def make(**changes: Any) -> dict[str, Any]:
        return _apply(dict(ENTITY_PAYER), changes)

    return make


@pytest.fixture
def individual_payer() -> ProfileFactory:
    """A factory of valid INDIVIDUAL payer details; keyword arguments override (None drops)."""

    def make(**changes: Any) -> dict[str, Any]:
        return _apply(dict(INDIVIDUAL_PAYER), changes)

    return make


def _apply(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return base


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every provider request the sandbox receives, before faults: method, path, headers, body
    and arrival time (`at`, monotonic seconds)."""
    seen: list[dict[str, Any]] = []
    original = sandbox_app.verify

    def recording(
        headers: Mapping[str, str], method: str, path: str, body: bytes, **kw: Any
    ) -> None:
        seen.append(
            {
                "method": method,
                "path": path,
                "headers": dict(headers),
                "body": body,
                "at": time.monotonic(),
            }
        )
        original(headers, method, path, body, **kw)

    monkeypatch.setattr(sandbox_app, "verify", recording)
    return seen


@pytest.fixture
def stack_stores() -> StoreMaker | None:
    """Where stacks store: None for a SQLite file in each stack's folder; the suites that run on
    both engines override it with `make_store`."""
    return None


@pytest.fixture
async def start_stack(
    tmp_path: Path, stack_stores: StoreMaker | None
) -> AsyncIterator[Callable[..., Awaitable[Stack]]]:
    """Start `Stack(tmp_path / "stackN", **kw)`s on demand; every one is stopped at teardown."""
    numbers = itertools.count()
    async with contextlib.AsyncExitStack() as started:

        async def start(**kw: Any) -> Stack:
            number = next(numbers)
            if stack_stores is not None and "storage" not in kw:
                kw["storage"] = stack_stores.storage(f"stack{number}.db")
            stack = Stack(tmp_path / f"stack{number}", **kw)
            started.push_async_callback(stack.stop)  # also after a start that failed half-way
            await stack.start()
            return stack

        yield start


@pytest.fixture
async def processes() -> AsyncIterator[Processes]:
    """What the test starts (`serve`, commands, the sandbox): killed at its teardown, also when
    it fails."""
    owned = Processes()
    try:
        yield owned
    finally:
        await owned.kill_all()


@pytest.fixture
async def provider_url(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
) -> str:
    """The provider sandbox on a loopback port (serveproc's PROVIDER_KEY); its base URL."""
    server = await aiohttp_server(
        create_app(SandboxConfig(api_key=PROVIDER_KEY, api_secret=PROVIDER_SECRET))
    )
    return str(server.make_url("")).rstrip("/")


# --- the two stores ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A PostgreSQL server for the session (`DEPOSITD_TEST_PG_URL`, else a throwaway cluster);
    missing server binaries fail the tests that need it, naming the install command."""
    try:
        with running_cluster() as cluster:
            yield cluster
    except MissingPostgres as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest) -> str:
    """The store's engine: each test using it runs on SQLite and on PostgreSQL."""
    return str(request.param)


@pytest.fixture
def make_store(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StoreMaker]:
    """Stores on the test's engine (`make_store("d.db")`; `.storage()` for a configuration)."""
    maker = StoreMaker(engine, tmp_path, request)
    yield maker
    maker.drop()
