"""The shipped Prometheus alert rules and Grafana dashboard, checked by `promtool` against the
metrics a real `serve` exposes (in both exposition formats)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.support.processes import Processes
from tests.support.service import Service
from tests.support.webhooks import envelope
from worker import __version__

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "depositd.rules.yml"
NAME = re.compile(r"\b((?:depositd|process)_[a-z_]+)")
# Sample suffixes that belong to a family of another name.
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_info", "_created")


@pytest.fixture(scope="module")
def promtool() -> str:
    """The promtool command (Debian's `prometheus` package; `make test` installs it)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: apt-get install -y prometheus (or run `make test`)")
    return path


def run(promtool: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """promtool with `args` in deploy/prometheus, its output as text."""
    return subprocess.run(
        [promtool, *args],
        cwd=PROM,
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_rules_pass_promtool_check(promtool: str) -> None:
    """`promtool check rules` accepts the shipped alert rules."""
    result = run(promtool, "check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout


def test_rules_unit_tests_pass(promtool: str) -> None:
    """`promtool test rules` runs every alert's unit test (fires when due, not before)."""
    result = run(promtool, "test", "rules", "depositd.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def queried_names() -> set[str]:
    """Every metric name the alert rules and the dashboard query."""
    exprs = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    dashboard = json.loads((PROM / "depositd.dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return {m for e in exprs for m in NAME.findall(e)}


def family(name: str) -> str:
    """The metric family a sample name belongs to."""
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


async def test_serve_metrics_pass_promtool_and_cover_rules_and_dashboard(
    tmp_path: Path, provider_url: str, promtool: str, processes: Processes
) -> None:
    """A running serve's /metrics passes `promtool check metrics`, has running totals as
    counters, build info and process metrics, every metric the rules and dashboard query,
    and OpenMetrics when the scrape asks for it."""
    service = processes.own(Service(tmp_path, provider_url, scheduler={"enabled": True}))
    await service.start()
    try:
        assert await service.post(envelope("pm-1", "DEPOSIT_WHITELIST_REQUIRED", "pm-tx-1")) == 200
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{service.url}/metrics") as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                text = await r.read()
            accept = "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"
            async with session.get(f"{service.url}/metrics", headers={"Accept": accept}) as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("application/openmetrics-text")
                om = (await r.read()).decode()
        assert await service.stop() == 0
    finally:
        await service.kill()

    result = run(promtool, "check", "metrics", stdin=text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == ""  # no lint findings either
    body = text.decode()
    assert "# TYPE depositd_store_commits_total counter" in body
    assert "# TYPE depositd_deposits_found_by_poll_total counter" in body
    assert f'depositd_build_info{{version="{__version__}"}} 1.0' in body
    assert "process_resident_memory_bytes " in body
    assert "process_start_time_seconds " in body
    assert 'depositd_poll_interval_seconds{poll="history"} 60.0' in body
    assert om.endswith("# EOF\n")
    assert "# TYPE depositd_store_commits counter" in om

    exposed = {family(n) for n in re.findall(r"^# TYPE (\S+)", body, re.M)}
    page = (ROOT / "docs" / "operations.md").read_text()
    undocumented = {n for n in exposed if f"`{n}" not in page}
    assert not undocumented, f"missing from docs/operations.md's metrics: {sorted(undocumented)}"
    missing = {n for n in queried_names() if family(n) not in exposed}
    assert not missing, f"queried but not exposed: {sorted(missing)}"
