"""E-mail channel over SMTP (aiosmtplib): STARTTLS and login when configured."""

from __future__ import annotations

import ssl
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

import aiosmtplib

from worker.errors import NotifyError
from worker.notify.message import Alert, render_text, subject

# Port 465 speaks TLS from the first byte (SMTPS); STARTTLS does not apply there.
_SMTPS_PORT = 465


class EmailNotifier:
    """Sends alerts as plain-text e-mail."""

    name = "email"

    def __init__(
        self,
        host: str,
        port: int,
        *,
        starttls: bool,
        username: str | None,
        password: str | None,
        sender: str,
        to: list[str],
        timeout_s: float = 10,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        if not to:
            raise ValueError("at least one recipient is required")
        self.host = host
        self.port = port
        self.starttls = starttls
        self.username = username
        self._password = password
        self.sender = sender
        self.to = list(to)
        self.timeout_s = timeout_s
        # A private CA (or a test's self-signed certificate); None trusts the system store.
        self._tls_context = tls_context

    def __repr__(self) -> str:
        return f"EmailNotifier(host={self.host!r}, port={self.port}, to={self.to!r})"

    def message(self, alert: Alert) -> EmailMessage:
        """The e-mail for one alert."""
        msg = EmailMessage()
        msg["Subject"] = subject(alert)
        msg["From"] = self.sender
        msg["To"] = ", ".join(self.to)
        msg["Date"] = formatdate(localtime=False, usegmt=True)
        domain = self.sender.rpartition("@")[2] or None
        msg["Message-ID"] = make_msgid(domain=domain)
        msg["X-Depositd-Condition"] = alert.condition
        msg.set_content(render_text(alert))
        return msg

    async def send(self, alert: Alert) -> None:
        """Deliver one alert; raises `NotifyError` (retryable or not) on failure."""
        implicit_tls = self.port == _SMTPS_PORT
        login = self.username is not None and self._password is not None
        try:
            await aiosmtplib.send(
                self.message(alert),
                sender=self.sender,
                recipients=self.to,
                hostname=self.host,
                port=self.port,
                use_tls=implicit_tls,
                # False, not None: None would upgrade opportunistically and hide a server that
                # lost STARTTLS behind a silent plaintext fallback.
                start_tls=self.starttls and not implicit_tls,
                username=self.username if login else None,
                password=self._password if login else None,
                timeout=self.timeout_s,
                tls_context=self._tls_context,
            )
        except Exception as exc:
            raise _classify(exc, f"{self.host}:{self.port}") from None


def _classify(exc: Exception, where: str) -> NotifyError:
    """Map an SMTP failure to retryable (try later) or not (fix the configuration)."""
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
        return NotifyError("email", f"login refused: {exc}", retryable=False)
    if isinstance(exc, aiosmtplib.SMTPNotSupported):
        # e.g. STARTTLS or AUTH configured but not offered by the server
        return NotifyError("email", f"not supported by the server: {exc}", retryable=False)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return NotifyError("email", f"TLS certificate refused: {exc}", retryable=False)
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        temporary = all(400 <= r.code < 500 for r in exc.recipients)
        return NotifyError("email", f"recipients refused: {exc}", retryable=temporary)
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        # SMTP reply classes: 4xx is transient, 5xx permanent
        return NotifyError("email", f"server said {exc}", retryable=400 <= exc.code < 500)
    if isinstance(exc, aiosmtplib.SMTPException | OSError):
        # timeouts, refused or dropped connections; named by type and server, as every
        # connection error is (aiosmtplib's text differs between versions)
        return NotifyError(
            "email", f"connection error: {type(exc).__name__} to {where}", retryable=True
        )
    return NotifyError("email", f"unexpected {type(exc).__name__}: {exc}", retryable=False)
