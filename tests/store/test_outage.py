"""A database outage as the store tells it: a line when it starts, one when it has lasted the
alert threshold (and the alert callbacks, once), one when it ends, with what failed counted."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from worker.store.outage import Outage


async def test_an_outage_is_three_lines_and_one_alert_however_many_failures() -> None:
    outage = Outage("db.example:5432", alert_after_s=0.2)
    alerts: list[tuple[str, float, str]] = []
    outage.on_long.append(lambda since, seconds, error: alerts.append((since, seconds, error)))
    assert not outage.note("processingFailed")  # no outage: the caller logs as usual
    with capture_logs() as logs:
        for n in range(50):
            outage.failed("connection refused" if n == 0 else "still refused", refused=2)
            assert outage.note("processingFailed")
        for _ in range(200):  # past the threshold (0.2 s): once, however long
            if alerts:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # a second threshold's time: nothing more
        outage.failed("still refused", refused=1)
        outage.recovered()
        outage.recovered()  # a later commit: nothing more
    assert [e["event"] for e in logs] == [
        "database unavailable: deliveries answered 503 until it is back; processing, actions"
        " and the scheduler wait",
        "database still unavailable",
        "database available again: deliveries stored, processing, actions and the scheduler"
        " resumed",
    ]
    assert logs[0]["error"] == "connection refused"
    assert len(alerts) == 1 and alerts[0][2] == "connection refused"
    back = logs[-1]
    assert (back["deliveriesRefused"], back["transactionsFailed"], back["processingFailed"]) == (
        101,
        51,
        50,
    )
    assert back["since"] == logs[1]["since"] and back["seconds"] >= 0.4
    assert not outage.active and not outage.note("processingFailed")


async def test_an_outage_shorter_than_the_threshold_sends_no_alert() -> None:
    outage = Outage("db", alert_after_s=0.2)
    alerts: list[object] = []
    outage.on_long.append(lambda *args: alerts.append(args))
    with capture_logs() as logs:
        outage.failed("refused")
        outage.recovered()
        await asyncio.sleep(0.3)
    assert [e["event"].split(":")[0] for e in logs] == [
        "database unavailable",
        "database available again",
    ]
    assert alerts == []
