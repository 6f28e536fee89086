"""Shared fixtures."""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from tests.support.pgcluster import Cluster, MissingPostgres, running_cluster
from tests.support.processes import Processes
from tests.support.sandboxes import SandboxStarter, ServerFactory, StartSandbox, sandbox_settings
from tests.support.stacks import MakeStack
from tests.support.stores import StoreMaker
from worker.dev.harness import Stack
from worker.dev.sandbox import app as sandbox_app
from worker.dev.sandbox import create_app
from worker.dev.sandbox.testing import ENTITY_PAYER, INDIVIDUAL_PAYER
from worker.logs import configure as configure_logging
from worker.logs import reset as reset_logging
from worker.store.sqlitestore import Store, connect, migrate

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
def stack_stores(request: pytest.FixtureRequest) -> StoreMaker | None:
    """Where stacks store: on the test's engine when the test runs on both (it uses `engine`,
    through `make_store` or `store`, or by `pytest.mark.usefixtures("engine")`), else None: a
    SQLite file in each stack's folder. tests/act and tests/e2e, whose stacks all run on both
    engines, override it."""
    if "engine" in request.fixturenames:
        maker: StoreMaker = request.getfixturevalue("make_store")
        return maker
    return None


@pytest.fixture
async def start_stack(tmp_path: Path, stack_stores: StoreMaker | None) -> AsyncIterator[MakeStack]:
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
async def provider_url(aiohttp_server: ServerFactory) -> str:
    """The provider sandbox on a loopback port (`sandbox_settings`: PROVIDER_KEY); its base
    URL."""
    server = await aiohttp_server(create_app(sandbox_settings()))
    return str(server.make_url("")).rstrip("/")


@pytest.fixture
async def start_sandbox(aiohttp_server: ServerFactory) -> AsyncIterator[StartSandbox]:
    """Start sandboxes on loopback on demand, each with a client and, when asked, a receiver of
    its webhooks (`await start_sandbox(hooks=True, clock=T0, **settings)`, see
    tests/support/sandboxes.py); their clients are closed at teardown."""
    starter = SandboxStarter(aiohttp_server)
    yield starter
    await starter.close()


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


@pytest.fixture
async def store(make_store: StoreMaker) -> AsyncIterator[Store]:
    """An open store on a fresh database (`make_store()`), on SQLite and on PostgreSQL."""
    s = make_store()
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Store]:
    """An open store on a fresh SQLite file (`.path`), for what only SQLite has."""
    s = Store(tmp_path / "depositd.db")
    await s.open()
    yield s
    await s.close()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite_utils.Database]:
    """A migrated SQLite database, without a store around it."""
    conn = connect(tmp_path / "d.db")
    database = sqlite_utils.Database(conn)
    migrate(database)
    yield database
    conn.close()
