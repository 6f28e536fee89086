"""The request budget every poll shares, and the provider-wide back-off after a rate-limit
answer (docs/polling.md), against the sandbox answering 429 / 503 with Retry-After. The budget
waits on a virtual clock (worker.dev.polldriver.VirtualClock): nothing here is timed but one stop,
whose bound is the stop's grace."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from aiohttp.test_utils import TestServer

from tests.support.configs import PROVIDER_KEY, PROVIDER_SECRET
from tests.support.sandboxes import sandbox_settings
from tests.support.stacks import NEVER, Samples, catchups_done, scrape
from worker.dev.harness import Stack
from worker.dev.polldriver import Calls, VirtualClock
from worker.dev.sandbox.app import SANDBOX_KEY, create_app
from worker.dev.sandbox.handle import Sandbox
from worker.dev.sandbox.testing import ENTITY_PAYER
from worker.errors import ProviderRateLimited
from worker.provider.budget import (
    DEFAULT_BACKOFF_S,
    MAX_BACKOFF_S,
    MAX_DEBT_S,
    RequestBudget,
    parse_retry_after,
)
from worker.provider.client import ProviderClient
from worker.schedule.leaderjobs import STOP_GRACE_S


@dataclass
class Env:
    """A sandbox and a client of it whose budget waits on a virtual clock."""

    sandbox: Sandbox
    client: ProviderClient
    clock: VirtualClock
    calls: Calls
    waits: list[tuple[str, float]]


@pytest.fixture
async def env(aiohttp_server: object) -> AsyncIterator[Env]:
    """The sandbox on loopback; the client's budget: 2 requests per second."""
    app = create_app(sandbox_settings())
    server: TestServer = await aiohttp_server(app)  # type: ignore[operator]
    clock = VirtualClock()
    waits: list[tuple[str, float]] = []
    budget = RequestBudget(
        2, clock=clock.monotonic, sleep=clock.sleep, on_wait=lambda e, s: waits.append((e, s))
    )
    calls = Calls()
    client = ProviderClient(
        str(server.make_url("/")),
        PROVIDER_KEY,
        PROVIDER_SECRET,
        retries=1,
        on_call=calls,
        budget=budget,
    )
    try:
        yield Env(app[SANDBOX_KEY], client, clock, calls, waits)
    finally:
        await client.close()


async def test_polls_wait_for_the_budget_and_submissions_go_first(env: Env) -> None:
    """At 2 per second, the polls' third read waits half a second; a submission is never held
    and the polls after it wait for the token it used."""
    (tx,) = [env.sandbox.inject_deposit(1001, "USDT", "TRON", "5", "TBudget1")["transactionId"]]
    polls = env.client.for_polls()
    start = env.clock.ms
    for _ in range(3):
        await polls.transaction_detail(tx)
    assert env.clock.ms - start == 500, "two at once (one second's burst), the third 0.5 s later"
    await env.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k1")
    assert env.clock.ms - start == 500, "the submission was held"
    await env.client.transaction_detail(tx)
    assert env.clock.ms - start == 500, "an operator's read through the client was held"
    await polls.transaction_detail(tx)
    assert env.clock.ms - start == 2000, "the poll waited for the tokens the others used"
    assert [round(s, 3) for _, s in env.waits] == [0.5, 1.5]
    assert {e for e, _ in env.waits} == {"transaction_detail"}


async def test_a_polls_view_shares_the_session_and_leaves_it_open_when_closed(env: Env) -> None:
    """Closing the polls' view keeps the client working; closing the client closes the one
    session both used."""
    (tx,) = [env.sandbox.inject_deposit(1001, "USDT", "TRON", "5", "TBudget6")["transactionId"]]
    polls = env.client.for_polls()
    await polls.transaction_detail(tx)
    await env.client.transaction_detail(tx)
    assert env.client.polls is False and polls.polls is True
    assert polls._session_for_use() is env.client._session_for_use(), "two sessions opened"
    session = env.client._session_for_use()
    await polls.close()
    assert not session.closed, "the view closed the client's session"
    await env.client.transaction_detail(tx)
    await env.client.close()
    assert session.closed, "the client left its session open"


@pytest.mark.parametrize("status", [429, 503])
async def test_rate_limit_with_retry_after_backs_off_every_poll_for_that_long(
    env: Env, status: int
) -> None:
    """A 429 (or a 503 naming a rate limit) with Retry-After: 30 on the history holds every
    poll, the detail reads included, 30 s; a submission still goes at once."""
    (tx,) = [env.sandbox.inject_deposit(1001, "USDT", "TRON", "5", "TBudget2")["transactionId"]]
    env.sandbox.set_fault("history", "rate_limit", count=1, http_status=status, retry_after_s=30)
    start = env.clock.ms
    polls = env.client.for_polls()
    page = await polls.history(white_list_status="init")  # retried after the back-off
    assert [o.transactionId for o in page.records] == [tx]
    assert env.calls.seen[("history", "rate_limited")] == 1
    assert env.calls.seen[("history", "ok")] == 1
    assert env.clock.ms - start >= 30_000, "the retry went before Retry-After"
    assert env.client.budget is not None and env.client.budget.backoff_remaining() == 0

    env.sandbox.set_fault("history", "rate_limit", count=1, http_status=status, retry_after_s=30)
    once = ProviderClient(
        env.client._origin, PROVIDER_KEY, PROVIDER_SECRET, retries=0, budget=env.client.budget
    )
    async with once:
        with pytest.raises(ProviderRateLimited):
            # No retry left (the poll fails and backs off); the back-off stays for the others.
            await once.for_polls().history(white_list_status="init")
    held_from = env.clock.ms
    await env.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k2")
    assert env.clock.ms == held_from, "a submission waited on the polls' back-off"
    await polls.transaction_detail(tx)
    assert env.clock.ms - held_from >= 30_000, "a detail read went during the back-off"


async def test_a_burst_of_submissions_holds_the_polls_for_the_capped_debt_only(
    env: Env,
) -> None:
    """A thousand submissions at 2 requests a second would hold every poll for 500 s if their
    tokens were all owed; the debt is capped, so the next poll waits `MAX_DEBT_S` and one
    token's refill at most."""
    (tx,) = [env.sandbox.inject_deposit(1001, "USDT", "TRON", "5", "TBudget5")["transactionId"]]
    budget = env.client.budget
    assert budget is not None
    for _ in range(1000):
        budget.spend()  # what each submission's call takes
    await env.client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k5")
    start = env.clock.ms
    await env.client.for_polls().transaction_detail(tx)
    assert env.clock.ms - start == (MAX_DEBT_S + 0.5) * 1000


async def rate_limited_history(stack: Stack, retry_after_s: float) -> None:
    """The sandbox answers the worker's next history read with a rate limit and Retry-After:
    back once the worker has had that answer."""
    stack.sandbox.set_fault("history", "rate_limit", count=1, retry_after_s=retry_after_s)
    limited = (
        "depositd_provider_calls_total",
        (("endpoint", "history"), ("outcome", "rate_limited")),
    )

    async def rate_limited() -> bool:
        return (await scrape(stack)).get(limited, 0) == 1

    await stack.wait_for(rate_limited, 30, "the rate-limited history call")


async def test_a_stop_cancels_the_polls_waiting_for_a_token_and_lets_submissions_go(
    env: Env,
) -> None:
    """When the service stops, a poll waiting for the budget (behind the submissions' debt)
    is cancelled at once instead of holding the stop, a poll asking afterwards is cancelled
    before it sends anything, and a submission still goes."""
    (tx,) = [env.sandbox.inject_deposit(1001, "USDT", "TRON", "5", "TBudget8")["transactionId"]]
    never = asyncio.Event()

    async def forever(seconds: float) -> None:  # a budget wait that only a stop ends
        await never.wait()

    budget = RequestBudget(2, clock=env.clock.monotonic, sleep=forever)
    calls = Calls()
    client = ProviderClient(
        env.client._origin, PROVIDER_KEY, PROVIDER_SECRET, retries=1, on_call=calls, budget=budget
    )
    async with client:
        for _ in range(20):
            budget.spend()  # what twenty submissions' calls took
        waiting = asyncio.create_task(client.for_polls().transaction_detail(tx))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done(), "the poll did not wait for a token"
        budget.stop_polls()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 5)
        later = asyncio.create_task(client.for_polls().history(white_list_status="init"))
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(later, 5)
        assert calls.seen == Counter(), "a poll was sent"
        await client.submit_payer(tx, ENTITY_PAYER, idempotency_key="k8")
        assert calls.by_endpoint() == {"submit_payer": 1}


async def test_a_stop_does_not_wait_for_a_poll_held_by_a_back_off(
    start_stack: Callable[..., Awaitable[Stack]],
) -> None:
    """A running worker whose history poll waits out a rate limit's Retry-After: 60 stops at
    once (SIGTERM's path): the poll, which has sent nothing since, is cancelled instead of
    holding the stop for its grace; the worker started again polls at once."""
    stack = await start_stack(history_interval_s=0.3, detail_interval_s=NEVER)
    await catchups_done(stack)
    await rate_limited_history(stack, retry_after_s=60)
    assert stack.runtime.client is not None and stack.runtime.client.budget is not None
    assert stack.runtime.client.budget.backoff_remaining() > 30
    started = time.monotonic()
    await stack.stop_worker()
    assert time.monotonic() - started < STOP_GRACE_S, "the stop waited for the poll's grace"
    await stack.start_worker()
    ok = ("depositd_provider_calls_total", (("endpoint", "history"), ("outcome", "ok")))

    async def polled() -> bool:
        return (await scrape(stack)).get(ok, 0) >= 1

    await stack.wait_for(polled, 30, "a history poll after the restart")


def test_backoff_without_retry_after_doubles_and_is_capped() -> None:
    """No Retry-After: 5 s, then 10 s, 20 s ... while rate-limit answers follow one another;
    an ordinary answer starts again at 5 s; a Retry-After above an hour counts as an hour."""
    clock = VirtualClock()
    budget = RequestBudget(5, clock=clock.monotonic, sleep=clock.sleep)
    assert [budget.back_off(None) for _ in range(3)] == [
        DEFAULT_BACKOFF_S,
        2 * DEFAULT_BACKOFF_S,
        4 * DEFAULT_BACKOFF_S,
    ]
    budget.answered()
    assert budget.back_off(None) == DEFAULT_BACKOFF_S
    assert budget.back_off(10 * 86_400) == MAX_BACKOFF_S
    assert budget.backoff_remaining() == MAX_BACKOFF_S


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    """Retry-After: delta-seconds or an HTTP date; anything else is no Retry-After."""
    now = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("120", now) == 120.0
    assert parse_retry_after("Thu, 26 Nov 2026 12:01:30 GMT", now) == 90.0
    assert parse_retry_after("Thu, 26 Nov 2026 11:00:00 GMT", now) == 0.0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None


async def test_serve_metrics_show_the_rate_limit_the_backoff_and_the_wait(
    start_stack: Callable[..., Awaitable[Stack]],
) -> None:
    """A running serve answered 429 with Retry-After: 2 on its history poll: /metrics counts the
    call as rate_limited, shows the back-off while it lasts, and the time the poll waited."""
    stack = await start_stack(history_interval_s=0.3, detail_interval_s=0.3)
    stack.sandbox.set_fault("history", "rate_limit", count=1, retry_after_s=2)

    async def samples() -> Samples:
        return await scrape(stack)

    limited = (
        "depositd_provider_calls_total",
        (("endpoint", "history"), ("outcome", "rate_limited")),
    )
    backoffs: list[float] = []

    async def rate_limited() -> bool:
        seen = await samples()
        backoffs.append(seen[("depositd_provider_backoff_seconds", ())])
        return seen.get(limited, 0) == 1

    await stack.wait_for(rate_limited, 30, "the rate-limited history call")
    assert 0 < backoffs[-1] <= 2

    waited = ("depositd_provider_budget_wait_seconds_total", (("endpoint", "history"),))

    async def waited_it_out() -> bool:
        # The retry waits until the Retry-After has passed, not a moment less.
        return (await samples()).get(waited, 0) >= 1.9

    await stack.wait_for(waited_it_out, 30, "the history poll to wait out the back-off")
    seen = await samples()
    assert seen[("depositd_provider_backoff_seconds", ())] == 0


@pytest.mark.parametrize("header", ["\u00b2", "1\u00b9"])
async def test_a_retry_after_of_digits_that_are_no_number_is_no_retry_after(
    aiohttp_server: object, header: str
) -> None:
    """A 429 whose Retry-After is digits Python cannot read as a number (a superscript two):
    the call fails as rate limited (backed off the default), not with a ValueError out of the
    client (which no caller of the provider handles)."""
    from aiohttp import web

    async def limited(_: web.Request) -> web.Response:
        return web.json_response(
            {"status": 429, "msg": "too many requests"}, status=429, headers={"Retry-After": header}
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", limited)
    server: TestServer = await aiohttp_server(app)  # type: ignore[operator]
    clock = VirtualClock()
    budget = RequestBudget(2, clock=clock.monotonic, sleep=clock.sleep)
    client = ProviderClient(
        str(server.make_url("/")), PROVIDER_KEY, PROVIDER_SECRET, retries=0, budget=budget
    )
    async with client:
        with pytest.raises(ProviderRateLimited):
            await client.for_polls().history(white_list_status="init")
    assert budget.backoff_remaining() == DEFAULT_BACKOFF_S
    assert parse_retry_after(header) is None


async def test_serve_abnormal_poll_waits_out_the_back_off_and_an_operator_read_does_not(
    start_stack: Callable[..., Awaitable[Stack]],
) -> None:
    """The abnormal-fund poll of a running serve is a poll too: after a rate-limit answer with
    Retry-After: 6 on the history, its run waits the back-off out (queued behind the history's
    retry, which counts as waiting too); the console's "read detail now" (an operator's read)
    waits for nothing."""
    stack = await start_stack(history_interval_s=0.3, detail_interval_s=NEVER)
    await catchups_done(stack)
    (tx,) = [stack.sandbox.inject_deposit(1001, "USDT", "TRON", "5", "TBudget7")["transactionId"]]
    await rate_limited_history(stack, retry_after_s=6)

    def waited(endpoint: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return ("depositd_provider_budget_wait_seconds_total", (("endpoint", endpoint),))

    before = (await scrape(stack)).get(waited("transaction_detail"), 0)
    assert await stack.runtime.read_detail(tx)
    after = (await scrape(stack)).get(waited("transaction_detail"), 0)
    assert after == before, "the operator's read waited for the budget"

    async def abnormal_waited() -> bool:
        money = stack.runtime.money
        assert money is not None
        money.fire("abnormal")  # a no-op while its run is in flight
        return (await scrape(stack)).get(waited("abnormal_funds"), 0) >= 0.5

    await stack.wait_for(abnormal_waited, 30, "the abnormal-fund poll to wait out the back-off")
