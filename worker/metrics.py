"""Prometheus metrics, one registry per application (so tests can build many apps).

Other modules increment the counters they own: the provider client `provider_calls`, the outbox
`alerts_sent`. Gauges read from the store are refreshed on each scrape.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.openmetrics import exposition as openmetrics

from worker import __version__
from worker.provider.models import KNOWN_EVENT_TYPES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# No `*_created` series: in the text format each would be one more gauge per counter and
# histogram, which no rule or panel reads (a process-wide setting of prometheus_client).
disable_created_metrics()  # type: ignore[no-untyped-call]
OPENMETRICS_CONTENT_TYPE = openmetrics.CONTENT_TYPE_LATEST


def wants_openmetrics(accept: str | None) -> bool:
    """True when a scrape's Accept header asks for the OpenMetrics text format."""
    return any(
        part.split(";")[0].strip() == "application/openmetrics-text"
        for part in (accept or "").split(",")
    )


def event_type_label(event_type: str | None) -> str:
    """A bounded label for an event type: unknown types share one label."""
    if not event_type:
        return "none"
    return event_type if event_type in KNOWN_EVENT_TYPES else "other"


class _ProcessCollector(ProcessCollector):
    """The process_* metrics without /proc/stat, which the unit's ProcSubset=pid hides: the
    boot time comes from CLOCK_BOOTTIME instead (the only thing the collector reads there)."""

    def _boot_time(self) -> float:
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


class Metrics:
    """Every metric of one depositd process."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, states: Sequence[str] = ()
    ) -> None:
        self.registry = registry or CollectorRegistry()
        # The deposit states every deposits-by-state sample is given for, 0 included.
        self.states = tuple(states)
        r = self.registry
        self.events_received = Counter(
            "depositd_events_received",
            "Webhook deliveries by event type and outcome "
            "(new, duplicate, ignored, unauthorized, bad_request, too_large, unavailable).",
            ["event_type", "outcome"],
            registry=r,
        )
        self.events_processed = Counter(
            "depositd_events_processed",
            "Stored events handled by the processor, by event type and outcome.",
            ["event_type", "outcome"],
            registry=r,
        )
        self.batches_replayed = Counter(
            "depositd_batches_replayed",
            "Processor batches undone and applied again one event at a time, by reason.",
            ["reason"],
            registry=r,
        )
        self.transitions = Counter(
            "depositd_transitions",
            "Deposit state transitions emitted by the tracker, by trigger.",
            ["trigger"],
            registry=r,
        )
        self.processing_lag = Gauge(
            "depositd_processing_lag_seconds",
            "Age of the oldest pending event (0 when none is pending).",
            registry=r,
        )
        self.events_pending = Gauge(
            "depositd_events_pending", "Stored events not processed yet.", registry=r
        )
        self.events_failed = Gauge(
            "depositd_events_failed", "Stored events whose processing failed.", registry=r
        )
        self.provider_calls = Counter(
            "depositd_provider_calls",
            "Calls to the provider by endpoint and outcome.",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.provider_budget_wait = Counter(
            "depositd_provider_budget_wait_seconds",
            "Time polls' provider calls waited on the request budget (provider.max_requests_per_s)"
            " and on a rate-limit back-off, by endpoint.",
            ["endpoint"],
            registry=r,
        )
        self.provider_backoff = Gauge(
            "depositd_provider_backoff_seconds",
            "Seconds left of the provider-wide back-off after a rate-limit answer (0: none).",
            registry=r,
        )
        self.alerts_sent = Counter(
            "depositd_alerts_sent",
            'Alerts by channel ("log" when no channel is configured) and outcome.',
            ["channel", "outcome"],
            registry=r,
        )
        self.claims_lost = Counter(
            "depositd_claims_lost",
            "Claims on action rows or alert channels this instance found taken over by another,"
            " by stage (renewal: the action was stopped; outcome, alert_send: not recorded).",
            ["stage"],
            registry=r,
        )
        self.deposits = Gauge(
            "depositd_deposits", "Tracked deposits by state.", ["state"], registry=r
        )
        self.ingest_seconds = Histogram(
            "depositd_webhook_seconds",
            "Time to verify, store and answer one webhook delivery.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.webhook_refusals = Counter(
            "depositd_webhook_refusals",
            "Requests refused on the webhook port by reason (missing_header, unknown_api_key,"
            " timestamp_window, bad_timestamp, bad_signature, content_encoding, too_large,"
            " slow_body, busy, bad_envelope, not_found).",
            ["reason"],
            registry=r,
        )
        self.commits = Counter(
            "depositd_store_commits", "Write transactions committed since start.", registry=r
        )
        self._commits_seen = 0
        Info("depositd_build", "The running version of depositd.", registry=r).info(
            {"version": __version__}
        )
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ... of
        # the main process (read from /proc/self, which ProcSubset=pid keeps).
        _ProcessCollector(registry=r)
        self.catchup_last = Gauge(
            "depositd_catchup_last_timestamp_seconds",
            "Unix time the last catch-up read of the full history ended (0: none yet).",
            registry=r,
        )
        self.catchup_found = Gauge(
            "depositd_catchup_deposits_found",
            "Deposits the last catch-up found that depositd did not know.",
            registry=r,
        )
        self.catchup_runs = Counter(
            "depositd_catchup_runs",
            "Full-history reads by job (catchup, sweep) and outcome (complete, incomplete).",
            ["job", "outcome"],
            registry=r,
        )

    def count_commits(self, total: int) -> None:
        """Advance the commits counter to the store's running total."""
        if total > self._commits_seen:
            self.commits.inc(total - self._commits_seen)
            self._commits_seen = total

    def set_deposit_states(self, counts: dict[str, int]) -> None:
        """Replace the deposits-by-state gauge with fresh counts; every state has a sample
        (0 included), so a state that empties does not vanish from the series."""
        self.deposits.clear()
        for state in (*self.states, *counts):
            self.deposits.labels(state=state).set(counts.get(state, 0))

    def render(self, openmetrics_format: bool = False) -> bytes:
        """The Prometheus text exposition of this registry, or OpenMetrics when asked for."""
        if openmetrics_format:
            body: bytes = openmetrics.generate_latest(self.registry)  # type: ignore[no-untyped-call]
            return body
        return generate_latest(self.registry)
