"""The money figures of /metrics: findings open by kind, the last day reconciled completely,
the last run's outcome, abnormal funds by status and the abnormal-fund polls by outcome."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from worker.logs import get_logger
from worker.reconcile.reconciler import KINDS
from worker.store import abnormal as abnormal_store
from worker.store import findings as findings_store
from worker.store.sqlitestore import Store

log = get_logger(__name__)

OUTCOMES = ("clean", "findings", "failed")


class MoneyMetrics:
    """Findings open by kind, last reconciled day, last run's outcome; abnormal funds."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.findings_open = Gauge(
            "depositd_reconcile_findings_open",
            "Reconciliation findings neither resolved nor acknowledged, by kind.",
            ["kind"],
            registry=registry,
        )
        self.last_day = Gauge(
            "depositd_reconcile_last_day_timestamp_seconds",
            "Start (Unix time, UTC midnight) of the last day reconciled completely (0: none).",
            registry=registry,
        )
        self.last_outcome = Gauge(
            "depositd_reconcile_last_outcome",
            "1 for the last reconciliation run's outcome (clean, findings, failed), 0 otherwise.",
            ["outcome"],
            registry=registry,
        )
        self.runs = Counter(
            "depositd_reconcile_runs",
            "Reconciliation runs by outcome (clean, findings, failed).",
            ["outcome"],
            registry=registry,
        )
        self.abnormal = Gauge(
            "depositd_abnormal_funds",
            "Abnormal funds seen at the provider, by status.",
            ["status"],
            registry=registry,
        )
        self.abnormal_polls = Counter(
            "depositd_abnormal_polls",
            "Abnormal-fund polls by outcome (ok, error, auth).",
            ["outcome"],
            registry=registry,
        )

    async def refresh(self, store: Store) -> None:
        """Read the gauges' figures from the store (an acknowledgement comes from the CLI)."""

        def read(db: Any) -> tuple[dict[str, int], str | None, Any, dict[str, int]]:
            return (
                findings_store.open_counts_by_kind(db),
                findings_store.last_reconciled_day(db),
                findings_store.last_run(db),
                abnormal_store.counts_by_status(db),
            )

        counts, day, last, abnormal = await store.read(read)
        for kind in KINDS:
            self.findings_open.labels(kind=kind).set(counts.get(kind, 0))
        if day is not None:
            start = datetime.fromisoformat(day).replace(tzinfo=UTC)
            self.last_day.set(start.timestamp())
        for outcome in OUTCOMES:
            hit = last is not None and last["outcome"] == outcome
            self.last_outcome.labels(outcome=outcome).set(1 if hit else 0)
        self.abnormal.clear()
        for status, count in abnormal.items():
            self.abnormal.labels(status=status).set(count)

    async def try_refresh(self, store: Store) -> None:
        """`refresh`, a failure logged (the figures are read again after the next run)."""
        try:
            await self.refresh(store)
        except Exception as exc:
            log.warning("metrics refresh failed", error=str(exc))
