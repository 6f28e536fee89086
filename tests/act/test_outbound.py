"""What depositd sends out and writes: no forward follows a redirect, plain http:// is refused off
loopback, connection errors name host and port only, and backups are private files."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from tests.support.stacks import MakeStack
from worker.commands.cli import main
from worker.commands.ops import backup
from worker.errors import NotifyError, ProviderUnavailable
from worker.notify.email import EmailNotifier
from worker.notify.message import build_alert
from worker.notify.slack import SlackNotifier
from worker.provider.client import ProviderClient

ROOT = Path(__file__).resolve().parents[2]
# Nothing listens on port 9 (discard) on loopback here: connecting is refused at once.
CLOSED = "127.0.0.1:9"


async def test_forward_does_not_follow_a_redirect_and_names_where_it_pointed(
    start_stack: MakeStack,
    tmp_path: Path,
    aiohttp_server: AiohttpServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A forward target answering 307 to an internal address: nothing is posted there, the
    action says where the redirect pointed (without its query) and an alert goes out."""
    internal: list[bytes] = []

    async def inside(request: web.Request) -> web.Response:
        internal.append(await request.read())
        return web.Response(status=200)

    inner_app = web.Application()
    inner_app.router.add_post("/internal", inside)
    inner = await aiohttp_server(inner_app)
    moved_to = str(inner.make_url("/internal"))

    async def merchant(request: web.Request) -> web.Response:
        await request.read()
        raise web.HTTPTemporaryRedirect(f"{moved_to}?token=s3cr3t-token")

    outer_app = web.Application()
    outer_app.router.add_post("/merchant/deposits", merchant)
    outer = await aiohttp_server(outer_app)
    url = str(outer.make_url("/merchant/deposits"))
    monkeypatch.setenv("OUTBOUND_FORWARD_SECRET", "forward-secret-1")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "forward.yaml").write_text(
        "wallet: '*'\n"
        "rules:\n"
        "  - name: tell the books at once\n"
        "    on: [needs_details]\n"
        f"    then: [{{forward: {{url: '{url}', secret_env: OUTBOUND_FORWARD_SECRET}}}}]\n"
    )
    stack = await start_stack(
        rules=rules, profiles=ROOT / "rules" / "profiles.yaml", scheduler=False
    )
    tx = stack.sandbox.inject_deposit(1002, "USDT", "TRON", "42", "TOutboundRedirect0001")[
        "transactionId"
    ]

    async def alerted() -> bool:
        return any("forward" in str(payload) for payload in stack.slack)

    await stack.wait_for(alerted, what="forward_failed alert")
    forward = [a for a in await stack.actions(tx) if a["action"] == "forward"]
    assert len(forward) == 1
    outcome = str(forward[0]["outcome"])
    assert f"HTTP 307 redirect to {moved_to} (not followed)" in outcome
    assert "s3cr3t-token" not in outcome
    assert internal == []
    alert = next(str(p) for p in stack.slack if "forward" in str(p))
    assert "307" in alert and "s3cr3t-token" not in alert


BASE = """\
provider:
  base_url: {base_url}
  api_key: provider-key
  api_secret: provider-secret
{provider_extra}webhook:
  api_key: hook-key
  secret: hook-secret
storage:
  path: depositd.db
"""


def config(tmp_path: Path, base_url: str, provider_extra: str = "") -> Path:
    """A valid config with this provider base URL (and extra provider keys)."""
    path = tmp_path / "depositd.yaml"
    path.write_text(BASE.format(base_url=base_url, provider_extra=provider_extra))
    return path


def check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`depositd check`: exit status and stderr."""
    code = main(["check", "--config", str(path)])
    return code, capsys.readouterr().err


def test_plain_http_provider_off_loopback_is_refused_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check refuses http:// to a remote provider, accepts it with a warning when
    `provider.allow_insecure_http: true` says so; loopback and https are silent."""
    code, err = check(config(tmp_path, "http://provider.example.com"), capsys)
    assert code == 2
    assert "provider.base_url: plain http:// to provider.example.com:80" in err
    assert "provider.allow_insecure_http: true" in err

    allowed = "  allow_insecure_http: true\n"
    code, err = check(config(tmp_path, "http://provider.example.com", allowed), capsys)
    assert code == 0
    assert "warning:" in err and "not encrypted" in err

    code, err = check(config(tmp_path, "http://127.0.0.1:8099"), capsys)
    assert code == 0 and "http://" not in err and "not encrypted" not in err

    # A real-looking host: `check` warns on placeholder hosts such as *.example.com.
    code, err = check(config(tmp_path, "https://api.acme-payments.com"), capsys)
    assert code == 0 and "http://" not in err and "not encrypted" not in err


def test_plain_http_forward_off_loopback_is_refused_unless_the_rule_allows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward to http:// off loopback fails check with the rule's file and line; the rule's
    `allow_insecure_http: true` turns that into a warning."""
    monkeypatch.setenv("FWD_SECRET", "s")
    rules = tmp_path / "rules.yaml"

    def write_rules(extra: str) -> None:
        rules.write_text(
            textwrap.dedent(
                f"""\
                wallet: '*'
                rules:
                  - name: tell the books
                    on: [credited]
                    then: [{{forward: {{url: 'http://books.example.com/in',
                                       secret_env: FWD_SECRET{extra}}}}}]
                """
            )
        )

    path = config(tmp_path, "https://provider.example.com")
    path.write_text(path.read_text() + f"rules: {rules}\n")
    write_rules("")
    code, err = check(path, capsys)
    assert code == 2
    assert (
        f"{rules}:3: rule 'tell the books': forward: plain http:// to books.example.com:80" in err
    )
    write_rules(", allow_insecure_http: true")
    code, err = check(path, capsys)
    assert code == 0 and "not encrypted" in err


def test_serve_refuses_at_start_what_check_refuses(tmp_path: Path) -> None:
    """`serve` with a plain-http provider off loopback exits 2 at start, naming the problem."""
    path = config(tmp_path, "http://provider.example.com")
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 2
    assert "plain http:// to provider.example.com:80" in proc.stderr


async def test_connection_errors_name_host_and_port_never_the_url() -> None:
    """Provider, Slack and SMTP connection failures name host:port and the error type, never a
    Slack URL's path (the secret) nor a query."""
    async with ProviderClient(f"http://{CLOSED}/gateway", "k", "s", retries=0) as client:
        with pytest.raises(ProviderUnavailable) as provider:
            await client.options()
    assert f"connection error: ClientConnectorError to {CLOSED}" in str(provider.value)

    alert = build_alert("poll_failing:history", "warning", None, detail="test")
    slack = SlackNotifier(f"http://{CLOSED}/services/T000/B000/XXXXSECRET")
    with pytest.raises(NotifyError) as slack_error:
        await slack.send(alert)
    assert f"to {CLOSED}" in str(slack_error.value)
    assert "XXXXSECRET" not in str(slack_error.value)
    assert "services" not in str(slack_error.value)

    email = EmailNotifier(
        "127.0.0.1", 9, starttls=False, username=None, password=None, sender="a@b.c", to=["d@e.f"]
    )
    with pytest.raises(NotifyError) as email_error:
        await email.send(alert)
    assert f"to {CLOSED}" in str(email_error.value)


def test_backup_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """`backup` writes its file with mode 0600, also under a permissive umask."""
    source = tmp_path / "live.db"
    with sqlite3.connect(source) as db:
        db.execute("CREATE TABLE payer (name TEXT)")
        db.execute("INSERT INTO payer VALUES ('Zebulon Quartz')")
    db.close()
    target = tmp_path / "backups" / "copy.db"
    old = os.umask(0o022)
    try:
        backup(source, target)
        first = stat.S_IMODE(target.stat().st_mode)
        target.chmod(0o644)  # an earlier backup, readable by all: replaced by a private one
        backup(source, target)
    finally:
        os.umask(old)
    assert first == 0o600
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not (tmp_path / "backups" / "copy.db.partial").exists()
