"""Alert text and channels, against a real SMTP server and a real HTTP endpoint on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import email
import email.policy
import ipaddress
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.support.ports import free_port
from worker.act.outbox import Outbox
from worker.act.queue import enqueue_alert
from worker.config.profiles import Profiles
from worker.config.settings import NotifySettings
from worker.errors import NotifyError
from worker.notify import (
    Alert,
    EmailNotifier,
    SlackNotifier,
    build_alert,
    notifiers_from_settings,
    render_slack,
    render_text,
    send_all,
    send_with_retry,
    subject,
)
from worker.notify import email as email_channel
from worker.provider.client import ProviderClient
from worker.store.sqlitestore import Store
from worker.track.tracker import Fact

pytestmark = [
    # aiosmtpd warns (UserWarning) when AUTH is required without TLS; the plain-login tests
    # configure exactly that on purpose, and the warning is raised in the server's thread.
    pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning"),
]

FAST = {"backoff_s": 0.01, "backoff_max_s": 0.05}
USER, PASSWORD = "alerts", "s3cret-pw"
ProfileFactory = Callable[..., dict[str, Any]]  # the payer factories of conftest.py
SENDER, RECIPIENTS = "depositd@merchant.example", ["treasury@merchant.example", "ops@m.example"]


@dataclass
class FakeDeposit:
    """A tracker deposit as build_alert sees it, plus payer data a careless caller might hold."""

    transaction_id: str = "tx-7f3a9c"
    wallet_id: int = 1001
    wallet_name: str = "Main USDT"
    amount: Decimal = Decimal("123.4500")
    currency: str = "USDT"
    network: str = "TRON"
    fail_message: str | None = None
    payer: dict[str, Any] = field(default_factory=dict)


def payer_strings(payer: dict[str, Any]) -> list[str]:
    """The personal values of a payer profile that must never reach an alert."""
    keys = ("fullName", "companyAddress", "firstName", "lastName", "birthday", "residentialAddress")
    return [payer[k] for k in keys if k in payer]


# --- message text -------------------------------------------------------------------------


def test_blocked_alert_reads_deposit_fields() -> None:
    """A BLOCKED alert carries what happened, the deposit's identity and contact-support advice."""
    alert = build_alert("blocked", "critical", FakeDeposit(), profile="acme-ops")
    assert alert.title == "Deposit BLOCKED: funds could not be credited"
    assert (alert.transaction_id, alert.wallet_id, alert.wallet_name) == (
        "tx-7f3a9c",
        1001,
        "Main USDT",
    )
    assert alert.amount == Decimal("123.4500")
    assert (alert.currency, alert.network, alert.profile) == ("USDT", "TRON", "acme-ops")
    assert alert.next_step is not None and "support" in alert.next_step
    assert "transactionId" in alert.next_step


def test_rejected_alert_detail_is_fail_message() -> None:
    """A rejection names the provider's failMessage and says a corrected profile is resubmitted."""
    alert = build_alert("rejected", "warning", FakeDeposit(fail_message="countryCode mismatch"))
    assert alert.title == "Payer details rejected"
    assert alert.detail == "countryCode mismatch"
    assert alert.next_step is not None and "resubmit" in alert.next_step


def test_explicit_detail_wins_over_fail_message() -> None:
    """A detail passed by the caller replaces the deposit's failMessage."""
    deposit = FakeDeposit(fail_message="old")
    assert build_alert("rejected", "warning", deposit, detail="new").detail == "new"


@pytest.mark.parametrize(
    ("condition", "title_part", "step_part"),
    [
        ("needs_details", "Payer details needed", "store a profile"),
        ("failed", "FAIL", "support"),
        ("address_failed", "registration FAILED", "disable it"),
        ("poll_failing", "polling failing", "reachable"),
        ("provider_unknown", "provider no longer offered", "options endpoint"),
        ("auth_failure", "authentication failing", "clock"),
    ],
)
def test_condition_titles_and_next_steps(condition: str, title_part: str, step_part: str) -> None:
    """Every known condition has its own title and next step."""
    alert = build_alert(condition, "warning", FakeDeposit())
    assert title_part in alert.title
    assert alert.next_step is not None and step_part in alert.next_step


def test_submit_failure_uses_wallet_code_meaning_and_guidance() -> None:
    """A refused submission shows the code, its meaning and the interface's guidance."""
    detail = "code 10000103: invalid countryCode (traceId 9f1c)"
    alert = build_alert("submit_failed:10000103", "warning", FakeDeposit(), detail=detail)
    assert "10000103" in alert.title
    assert "field value not accepted" in alert.title
    assert alert.next_step is not None
    assert "ISO 3166-1 alpha-2" in alert.next_step
    assert "until the profile changes" in alert.next_step
    assert alert.detail == detail
    for code in ("10000100", "10000104", "10000106", "10000107"):
        other = build_alert(f"submit_failed:{code}", "critical", FakeDeposit())
        assert code in other.title and other.next_step


def test_unknown_code_and_condition_still_render() -> None:
    """An unlisted code or condition gives a generic but readable alert, not an error."""
    alert = build_alert("submit_failed:99999999", "warning", FakeDeposit())
    assert "99999999" in alert.title and alert.next_step
    odd = build_alert("something_new", "info")
    assert odd.title == "Something new"
    assert "Something new" in render_text(odd)


def test_alert_refuses_bad_severity_float_amount_and_profile_contents(
    entity_payer: ProfileFactory,
) -> None:
    """Severity is checked, money is never a float, and a profile is passed by name only."""
    with pytest.raises(ValueError, match="severity"):
        build_alert("blocked", "urgent", FakeDeposit())
    with pytest.raises(TypeError):
        build_alert("blocked", "critical", FakeDeposit(amount=1.5))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="NAME"):
        build_alert("needs_details", "warning", FakeDeposit(), profile=entity_payer())  # type: ignore[arg-type]


def test_amount_is_an_exact_decimal_string() -> None:
    """Amounts print as plain decimal strings: no exponent, no float rounding."""
    alert = build_alert("blocked", "critical", FakeDeposit(amount=Decimal("0.00000001")))
    tiny = build_alert("blocked", "critical", FakeDeposit(amount=Decimal("1E-8")))
    big = build_alert(
        "blocked", "critical", FakeDeposit(amount=Decimal("12345678901234.123456789"))
    )
    assert "0.00000001 USDT on TRON" in render_text(alert)
    assert "0.00000001 USDT" in subject(tiny)
    assert "12345678901234.123456789" in render_text(big)
    assert "12345678901234.123456789" in json.dumps(render_slack(big))


def test_subject_is_short_and_names_the_deposit() -> None:
    """The subject reads like `[depositd] CRITICAL: Deposit BLOCKED 1001 123.4500 USDT (tx ...)`."""
    alert = build_alert("blocked", "critical", FakeDeposit())
    assert subject(alert) == (
        "[depositd] CRITICAL: Deposit BLOCKED 1001 123.4500 USDT (tx tx-7f3a9c)"
    )
    no_deposit = build_alert("provider_unknown", "warning", profile="acme-ops")
    assert subject(no_deposit) == (
        "[depositd] WARNING: Profile names a provider no longer offered (profile acme-ops)"
    )


def test_render_text_has_every_part() -> None:
    """The plain text names what happened, wallet, amount, currency, network, tx and next step."""
    alert = build_alert("rejected", "warning", FakeDeposit(fail_message="walletLabel too long"))
    text = render_text(alert)
    assert text.startswith("WARNING: Payer details rejected\n")
    for part in ("1001 (Main USDT)", "123.4500 USDT on TRON", "tx-7f3a9c", "walletLabel too long"):
        assert part in text
    assert "Next step:" in text and "resubmits" in text
    assert all(len(line) <= 78 for line in text.splitlines())


def test_render_slack_is_readable_blocks() -> None:
    """The Slack payload has a fallback text, a header, fields, detail and next step."""
    alert = build_alert("blocked", "critical", FakeDeposit(), detail="creditStatus BLOCKED")
    payload = render_slack(alert)
    assert "Deposit BLOCKED" in payload["text"] and "tx-7f3a9c" in payload["text"]
    kinds = [b["type"] for b in payload["blocks"]]
    assert kinds == ["header", "section", "section", "section", "context"]
    assert "CRITICAL: Deposit BLOCKED" in payload["blocks"][0]["text"]["text"]
    fields = [f["text"] for f in payload["blocks"][1]["fields"]]
    assert fields == [
        "*Wallet*\n1001 (Main USDT)",
        "*Amount*\n123.4500 USDT on TRON",
        "*transactionId*\n`tx-7f3a9c`",
    ]
    assert payload["blocks"][2]["text"]["text"] == "*Detail*\ncreditStatus BLOCKED"
    assert payload["blocks"][3]["text"]["text"].startswith("*Next step*\nContact provider support")


def test_slack_escapes_provider_text() -> None:
    """Provider text cannot ping a channel or forge a link in Slack."""
    alert = build_alert(
        "rejected", "warning", FakeDeposit(fail_message="<!channel> & <http://x|y>")
    )
    dumped = json.dumps(render_slack(alert))
    assert "<!channel>" not in dumped and "<http" not in dumped
    assert "&lt;!channel&gt; &amp; &lt;http://x|y&gt;" in dumped


@pytest.mark.parametrize("kind", ["entity", "individual"])
def test_alert_text_never_contains_payer_data(
    kind: str, entity_payer: ProfileFactory, individual_payer: ProfileFactory
) -> None:
    """Even with the profile at hand, text, subject and Slack payload carry only its name."""
    payer = entity_payer() if kind == "entity" else individual_payer()
    deposit = FakeDeposit(payer=payer, fail_message="review rejected")
    for condition in ("needs_details", "rejected", "blocked", "submit_failed:10000102"):
        alert = build_alert(condition, "critical", deposit, profile="acme-ops")
        rendered = [
            render_text(alert),
            subject(alert),
            json.dumps(render_slack(alert)),
            repr(alert),
        ]
        assert "acme-ops" in rendered[0] and "acme-ops" in rendered[2]
        for secret in payer_strings(payer):
            assert all(secret not in r for r in rendered), secret


# --- a Slack stand-in ------------------------------------------------------------------------


@dataclass
class SlackStub:
    """A loopback endpoint that records JSON payloads and answers from a script."""

    url: str = ""
    base: str = ""
    payloads: list[dict[str, Any]] = field(default_factory=list)
    script: list[int] = field(default_factory=list)  # statuses to answer first, then 200
    delay_s: float = 0.0
    release: asyncio.Event | None = None  # when set, answers wait for it
    headers: dict[str, str] = field(default_factory=dict)


@pytest.fixture
async def slack(aiohttp_server: Any) -> SlackStub:
    """A Slack incoming-webhook stand-in on 127.0.0.1."""
    stub = SlackStub()

    async def hook(request: web.Request) -> web.Response:
        stub.payloads.append(await request.json())
        if stub.release is not None:
            await stub.release.wait()
        if stub.delay_s:
            await asyncio.sleep(stub.delay_s)
        status = stub.script.pop(0) if stub.script else 200
        text = "ok" if status == 200 else ("no_service" if status == 404 else "server error")
        return web.Response(status=status, text=text, headers=stub.headers)

    app = web.Application()
    app.router.add_post("/services/T000/B000/XXXXsecret", hook)
    server = await aiohttp_server(app)
    stub.url = str(server.make_url("/services/T000/B000/XXXXsecret"))
    stub.base = str(server.make_url(""))
    return stub


async def test_slack_posts_the_rendered_payload(slack: SlackStub) -> None:
    """A send posts render_slack's JSON once to the webhook URL."""
    alert = build_alert("blocked", "critical", FakeDeposit())
    await SlackNotifier(slack.url).send(alert)
    assert slack.payloads == [render_slack(alert)]


async def test_slack_retries_500_then_succeeds(slack: SlackStub) -> None:
    """Two 500s are retried with back-off and the third attempt delivers."""
    slack.script = [500, 500]
    await send_with_retry(SlackNotifier(slack.url), build_alert("blocked", "critical"), **FAST)
    assert len(slack.payloads) == 3
    assert slack.script == []


async def test_slack_gives_up_after_the_last_attempt(slack: SlackStub) -> None:
    """A channel that keeps failing raises NotifyError after exactly `attempts` tries."""
    slack.script = [503] * 10
    with pytest.raises(NotifyError) as info:
        await send_with_retry(
            SlackNotifier(slack.url), build_alert("blocked", "critical"), attempts=3, **FAST
        )
    assert len(slack.payloads) == 3
    assert info.value.retryable and info.value.attempts == 3
    assert info.value.channel == "slack" and "HTTP 503" in str(info.value)


async def test_slack_404_is_not_retried(slack: SlackStub) -> None:
    """A 404 (wrong or revoked URL) gives up at once, and the error hides the secret URL."""
    slack.script = [404]
    with pytest.raises(NotifyError) as info:
        await send_with_retry(SlackNotifier(slack.url), build_alert("blocked", "critical"), **FAST)
    assert len(slack.payloads) == 1
    assert not info.value.retryable and info.value.attempts == 1
    assert "HTTP 404: no_service" in str(info.value)
    assert "XXXXsecret" not in str(info.value)


async def test_slack_429_is_retryable_and_honours_retry_after(slack: SlackStub) -> None:
    """429 is retried, waiting at least the server's Retry-After (capped by backoff_max_s)."""
    slack.script = [429]
    slack.headers = {"Retry-After": "1"}
    started = time.monotonic()
    await send_with_retry(
        SlackNotifier(slack.url),
        build_alert("blocked", "critical"),
        backoff_s=0.01,
        backoff_max_s=0.2,
    )
    assert len(slack.payloads) == 2
    assert time.monotonic() - started >= 0.2


async def test_slack_timeout_and_refused_connection_are_retryable(slack: SlackStub) -> None:
    """A slow endpoint times out and a closed port refuses: both are retryable errors."""
    slack.delay_s = 1.0
    with pytest.raises(NotifyError, match="timed out") as slow:
        await SlackNotifier(slack.url, timeout_s=0.1).send(build_alert("blocked", "critical"))
    assert slow.value.retryable
    with pytest.raises(NotifyError, match="connection error") as refused:
        await SlackNotifier(f"http://127.0.0.1:{free_port()}/hook").send(
            build_alert("blocked", "critical")
        )
    assert refused.value.retryable


async def test_slack_uses_a_given_session(slack: SlackStub) -> None:
    """A shared aiohttp session is used and left open for its owner."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        await SlackNotifier(slack.url, session=session).send(build_alert("failed", "critical"))
        assert not session.closed
    assert len(slack.payloads) == 1


# --- a real SMTP server ---------------------------------------------------------------------


@dataclass
class Received:
    """One message as the SMTP server saw it."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage
    authenticated: bool
    tls: bool


class Inbox:
    """aiosmtpd handler collecting every message delivered."""

    def __init__(self) -> None:
        self.messages: list[Received] = []
        self.auth_attempts = 0

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.messages.append(
            Received(
                envelope.mail_from,
                list(envelope.rcpt_tos),
                parsed,
                bool(session.authenticated),
                session.ssl is not None,
            )
        )
        return "250 OK"

    def authenticator(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        self.auth_attempts += 1
        ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
            USER.encode(),
            PASSWORD.encode(),
        )
        return AuthResult(success=ok, handled=False)


SmtpFactory = Callable[..., tuple[Inbox, int]]


@pytest.fixture
def smtp_server() -> Iterator[SmtpFactory]:
    """Start real aiosmtpd servers on 127.0.0.1; stopped after the test."""
    started: list[Controller] = []

    def start(**smtp_kwargs: Any) -> tuple[Inbox, int]:
        inbox = Inbox()
        port = free_port()
        if smtp_kwargs.get("auth_required"):
            smtp_kwargs.setdefault("authenticator", inbox.authenticator)
        controller = Controller(inbox, hostname="127.0.0.1", port=port, **smtp_kwargs)
        controller.start()
        started.append(controller)
        return inbox, port

    yield start
    for controller in started:
        controller.stop()


@dataclass
class Tls:
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost."""

    server: ssl.SSLContext
    client: ssl.SSLContext


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """Server and client TLS contexts built from a certificate generated now."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = tmp_path_factory.mktemp("tls")
    now = dt.datetime.now(dt.UTC)

    def issue(subject_cn: str, key: Any, issuer: Any, issuer_key: Any, ca: bool) -> Any:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(issuer_key or key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = issue("depositd test CA", ca_key, None, None, True)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = issue("127.0.0.1", leaf_key, ca_cert.subject, ca_key, False)

    def write(path: Path, data: bytes) -> str:
        path.write_bytes(data)
        return str(path)

    pem = serialization.Encoding.PEM
    ca_file = write(folder / "ca.pem", ca_cert.public_bytes(pem))
    cert_file = write(folder / "cert.pem", leaf_cert.public_bytes(pem))
    key_file = write(
        folder / "key.pem",
        leaf_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_file, key_file)
    return Tls(server=server, client=ssl.create_default_context(cafile=ca_file))


def mailer(port: int, **overrides: Any) -> EmailNotifier:
    """An EmailNotifier for the loopback server; plain SMTP without login unless overridden."""
    kwargs: dict[str, Any] = {
        "starttls": False,
        "username": None,
        "password": None,
        "sender": SENDER,
        "to": RECIPIENTS,
        "timeout_s": 5,
    }
    kwargs.update(overrides)
    return EmailNotifier("127.0.0.1", port, **kwargs)


async def test_email_delivers_subject_and_body(smtp_server: SmtpFactory) -> None:
    """The e-mail carries the subject line and every part of the alert text to every recipient."""
    inbox, port = smtp_server()
    alert = build_alert(
        "submit_failed:10000103", "warning", FakeDeposit(), detail="code 10000103: countryCode"
    )
    await mailer(port).send(alert)
    [got] = inbox.messages
    assert got.mail_from == SENDER and got.rcpt_tos == RECIPIENTS
    msg = got.message
    assert msg["Subject"] == (
        "[depositd] WARNING: Submission refused (10000103) 1001 123.4500 USDT (tx tx-7f3a9c)"
    )
    assert msg["From"] == SENDER and msg["To"] == ", ".join(RECIPIENTS)
    assert msg["Message-ID"].endswith("@merchant.example>")
    body = msg.get_content().replace("\r\n", "\n")  # SMTP carries CRLF line ends
    assert body == render_text(alert)
    for part in ("1001 (Main USDT)", "123.4500 USDT on TRON", "tx-7f3a9c", "Next step:"):
        assert part in body
    assert not got.authenticated


async def test_email_logs_in_without_tls(smtp_server: SmtpFactory) -> None:
    """With username and password set, the notifier logs in (server allows AUTH without TLS)."""
    inbox, port = smtp_server(auth_required=True, auth_require_tls=False)
    await mailer(port, username=USER, password=PASSWORD).send(build_alert("blocked", "critical"))
    [got] = inbox.messages
    assert got.authenticated


async def test_email_without_login_is_refused_by_an_auth_server(smtp_server: SmtpFactory) -> None:
    """Sanity of the fixture: a server requiring AUTH refuses a sender that skips login."""
    inbox, port = smtp_server(auth_required=True, auth_require_tls=False)
    with pytest.raises(NotifyError):
        await mailer(port).send(build_alert("blocked", "critical"))
    assert inbox.messages == []


async def test_email_wrong_password_is_not_retried(smtp_server: SmtpFactory) -> None:
    """A refused login gives up at once: retrying cannot fix credentials."""
    inbox, port = smtp_server(auth_required=True, auth_require_tls=False)
    notifier = mailer(port, username=USER, password="wrong")
    with pytest.raises(NotifyError, match="login refused") as info:
        await send_with_retry(notifier, build_alert("blocked", "critical"), **FAST)
    assert not info.value.retryable and info.value.attempts == 1
    assert inbox.auth_attempts >= 1 and inbox.messages == []
    assert "wrong" not in str(info.value)


# asyncio closes a connection upgraded by STARTTLS (or opened with TLS) a few loop turns after
# aiosmtplib returns; when the test's loop ends first, the raw socket is left to the garbage
# collector, whose ResourceWarning says nothing about depositd (a service's loop keeps running).
TLS_SOCKET_LEFT_TO_GC = pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning"
)


@TLS_SOCKET_LEFT_TO_GC
async def test_email_starttls_then_login(smtp_server: SmtpFactory, tls: Tls) -> None:
    """With starttls, the session is upgraded before login (the server refuses AUTH otherwise)."""
    inbox, port = smtp_server(
        tls_context=tls.server, require_starttls=True, auth_required=True, auth_require_tls=True
    )
    notifier = mailer(port, starttls=True, username=USER, password=PASSWORD, tls_context=tls.client)
    await notifier.send(build_alert("blocked", "critical", FakeDeposit()))
    [got] = inbox.messages
    assert got.tls and got.authenticated


@TLS_SOCKET_LEFT_TO_GC
async def test_email_untrusted_certificate_fails(smtp_server: SmtpFactory, tls: Tls) -> None:
    """A server certificate the client does not trust stops delivery instead of falling back."""
    inbox, port = smtp_server(tls_context=tls.server, require_starttls=True)
    with pytest.raises(NotifyError, match="certificate") as info:
        await mailer(port, starttls=True).send(build_alert("blocked", "critical"))
    assert not info.value.retryable
    assert inbox.messages == []


@TLS_SOCKET_LEFT_TO_GC
async def test_email_implicit_tls_on_the_smtps_port(
    smtp_server: SmtpFactory, tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the SMTPS port the connection is TLS from the first byte (no STARTTLS)."""
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, ssl_context=tls.server)
    controller.start()
    try:
        monkeypatch.setattr(email_channel, "_SMTPS_PORT", port)
        await mailer(port, starttls=True, tls_context=tls.client).send(
            build_alert("failed", "critical")
        )
    finally:
        controller.stop()
    assert len(inbox.messages) == 1


async def test_email_connection_refused_is_retryable() -> None:
    """Nobody listening is a retryable connection error."""
    with pytest.raises(NotifyError, match="connection error") as info:
        await mailer(free_port()).send(build_alert("blocked", "critical"))
    assert info.value.retryable and info.value.channel == "email"


# --- both channels -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["entity", "individual"])
async def test_delivered_alerts_never_contain_payer_data(
    kind: str,
    slack: SlackStub,
    smtp_server: SmtpFactory,
    entity_payer: ProfileFactory,
    individual_payer: ProfileFactory,
) -> None:
    """What Slack and the mailbox receive names the profile and none of its contents."""
    payer = entity_payer() if kind == "entity" else individual_payer()
    inbox, port = smtp_server()
    notifiers = {"slack": SlackNotifier(slack.url), "email": mailer(port)}
    alert = build_alert("needs_details", "warning", FakeDeposit(payer=payer), profile="acme-ops")
    assert await send_all(notifiers, alert, None, **FAST) == {"slack": None, "email": None}
    mail = inbox.messages[0].message
    headers = "\n".join(f"{name}: {value}" for name, value in mail.items())
    delivered = [json.dumps(slack.payloads), headers + "\n" + mail.get_content()]
    assert all("acme-ops" in d for d in delivered)
    for secret in payer_strings(payer):
        assert all(secret not in d for d in delivered), secret


async def test_slack_down_does_not_block_email(slack: SlackStub, smtp_server: SmtpFactory) -> None:
    """Slack failing returns its error while the e-mail is still delivered, in parallel."""
    inbox, port = smtp_server()
    slack.script = [500] * 10
    slack.release = asyncio.Event()
    notifiers = {"slack": SlackNotifier(slack.url), "email": mailer(port)}
    task = asyncio.create_task(
        send_all(
            notifiers,
            build_alert("blocked", "critical", FakeDeposit()),
            ["slack", "email"],
            attempts=2,
            **FAST,
        )
    )
    # Slack hangs until released: the e-mail must arrive meanwhile, so channels run in parallel.
    for _ in range(500):
        if inbox.messages:
            break
        await asyncio.sleep(0.01)
    assert len(inbox.messages) == 1 and not task.done()
    slack.release.set()
    result = await task
    assert result["email"] is None
    assert result["slack"] is not None
    assert "HTTP 500" in result["slack"] and "after 2 attempts" in result["slack"]


async def test_send_all_reports_unconfigured_and_unexpected_failures(slack: SlackStub) -> None:
    """An unconfigured channel and a crashing notifier are reported; the others still send."""

    class Broken:
        name = "broken"

        async def send(self, alert: Alert) -> None:
            raise RuntimeError("boom")

    notifiers = {"slack": SlackNotifier(slack.url), "broken": Broken()}
    result = await send_all(
        notifiers, build_alert("blocked", "critical"), ["slack", "email", "broken"], **FAST
    )
    assert result == {
        "slack": None,
        "email": "channel not configured",
        "broken": "unexpected RuntimeError: boom",
    }
    assert len(slack.payloads) == 1


def test_notifiers_from_settings_builds_only_configured_channels() -> None:
    """Settings with no channels give none; each configured channel gives its notifier."""
    assert notifiers_from_settings(NotifySettings()) == {}
    notify = NotifySettings.model_validate(
        {
            "slack": {"webhook_url": "https://hooks.slack.example/services/T/B/x"},
            "email": {
                "host": "smtp.example",
                "port": 587,
                "username": USER,
                "password": PASSWORD,
                "from": SENDER,
                "to": "treasury@merchant.example",
            },
        }
    )
    built = notifiers_from_settings(notify)
    assert set(built) == {"slack", "email"}
    mail = built["email"]
    assert isinstance(mail, EmailNotifier)
    assert (mail.host, mail.port, mail.starttls, mail.username) == ("smtp.example", 587, True, USER)
    assert mail.sender == SENDER and mail.to == ["treasury@merchant.example"]
    assert isinstance(built["slack"], SlackNotifier)
    assert "hooks.slack" not in repr(built["slack"]) and PASSWORD not in repr(mail)
    only_mail = NotifySettings.model_validate(
        {"email": {"host": "smtp.example", "from": SENDER, "to": ["a@b.example"]}}
    )
    assert set(notifiers_from_settings(only_mail)) == {"email"}


# --- alerts through the outbox ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def outbox_on_store(
    tmp_path: Path, notifiers: dict[str, Any], **kw: Any
) -> AsyncIterator[tuple[Outbox, Store]]:
    """An outbox on a real store with these channels (production retry settings:
    notify_retry not given) and no provider to speak of."""
    store = Store(tmp_path / "depositd.db")
    await store.open()

    async def observe(fact: Fact) -> None:
        return None

    client = ProviderClient("http://127.0.0.1:9", "key", "secret", retries=0)
    try:
        yield (
            Outbox(
                store,
                client=client,
                notifiers=notifiers,
                profiles=Profiles.empty,
                observe=observe,
                **kw,
            ),
            store,
        )
    finally:
        await client.close()
        await store.close()


@pytest.fixture
async def alert_outbox(tmp_path: Path, slack: SlackStub) -> AsyncIterator[tuple[Outbox, Store]]:
    """An outbox whose only channel is the Slack stub."""
    async with outbox_on_store(tmp_path, {"slack": SlackNotifier(slack.url)}) as made:
        yield made


async def alert_rows(store: Store) -> list[dict[str, Any]]:
    """The alert action rows, oldest first."""
    return await store.read(
        lambda db: [dict(r) for r in db.query("SELECT * FROM actions ORDER BY id")]
    )


async def test_outbox_requeues_a_rate_limited_alert_instead_of_sleeping(
    alert_outbox: tuple[Outbox, Store], slack: SlackStub
) -> None:
    """Slack answers 429 with Retry-After 60: the pass makes one attempt and returns at once;
    the row is due again after the Retry-After, and then sent."""
    outbox, store = alert_outbox
    slack.script = [429]
    slack.headers = {"Retry-After": "60"}
    await store.write(lambda db: enqueue_alert(db, None, "poll_failing", "warning", trigger="t"))
    started = time.monotonic()
    assert await asyncio.wait_for(outbox.run_once(), timeout=5) == 1
    assert time.monotonic() - started < 2
    [row] = await alert_rows(store)
    assert row["status"] == "pending" and "HTTP 429" in row["outcome"]
    due = dt.datetime.fromisoformat(row["next_attempt_at"].replace("Z", "+00:00"))
    assert due - dt.datetime.now(dt.UTC) > dt.timedelta(seconds=55)
    assert len(slack.payloads) == 1

    slack.headers = {}
    await outbox.run_once(include_delayed=True)
    [row] = await alert_rows(store)
    assert row["status"] == "done" and len(slack.payloads) == 2


async def test_outbox_stop_is_not_held_by_the_rows_left_in_a_pass(
    alert_outbox: tuple[Outbox, Store], slack: SlackStub
) -> None:
    """A stop while one alert is being sent ends the pass after that row; the others wait."""
    outbox, store = alert_outbox
    slack.release = asyncio.Event()
    for condition in ("poll_failing", "reload_failed", "auth_failure"):
        await store.write(
            lambda db, c=condition: enqueue_alert(db, None, c, "warning", trigger="t")
        )
    stop = asyncio.Event()
    task = asyncio.create_task(outbox.run(stop))
    for _ in range(500):  # until the first alert is at Slack, held there
        if slack.payloads:
            break
        await asyncio.sleep(0.01)
    stop.set()
    slack.release.set()
    await asyncio.wait_for(task, timeout=5)
    assert len(slack.payloads) == 1
    assert [r["status"] for r in await alert_rows(store)] == ["done", "pending", "pending"]


async def test_an_alert_with_no_channel_is_logged_and_counted(tmp_path: Path) -> None:
    """With no channel configured (docs/configuration.md) the alert still counts, under
    channel "log", so a dashboard of alerts does not miss it."""
    counted: list[tuple[str, str]] = []
    async with outbox_on_store(
        tmp_path, {}, on_alert=lambda channel, outcome: counted.append((channel, outcome))
    ) as (outbox, store):
        await store.write(
            lambda db: enqueue_alert(db, None, "poll_failing", "warning", trigger="t")
        )
        assert await outbox.run_once() == 1
        [row] = await alert_rows(store)
    assert (row["status"], row["outcome"]) == ("done", "logged (no alert channel configured)")
    assert counted == [("log", "logged")]
