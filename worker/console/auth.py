"""Who may use the console: the login token, sessions, CSRF tokens, the login throttle and the
headers every answer carries.

Sessions live in memory (a restart means logging in again). The token is read from
`console.token_file` at every login, so a rotated token needs no restart, and a session opened
with a token no longer in the file ends at its next request.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from worker.errors import StorageError
from worker.logs import get_logger

log = get_logger(__name__)

SESSION_COOKIE = "depositd_console"
LOGIN_COOKIE = "depositd_login"  # the login form's CSRF value (double submit, before a session)
FREE_FAILURES = 5  # wrong tokens from one address before each further try waits
MAX_WAIT_S = 300.0
MAX_ADDRESSES = 4096  # addresses the throttle remembers (the least recent are forgotten)
OPEN_PATHS = ("/login", "/static/")


@dataclass
class Session:
    """One logged-in browser."""

    csrf: str
    expires: float
    operator: str
    token_digest: bytes = b""  # of the token it logged in with: a rotated token ends it


@dataclass
class _Failures:
    count: int = 0
    not_before: float = 0.0


@dataclass
class Sessions:
    """The sessions of this process, by id, each expiring `ttl_s` after login."""

    ttl_s: float
    clock: Callable[[], float] = time.monotonic
    _by_id: dict[str, Session] = field(default_factory=dict)

    def create(self, operator: str, token_digest: bytes = b"") -> tuple[str, Session]:
        """A new session: its id (the cookie value) and the session."""
        self._drop_expired()
        sid = secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(32)
        session = Session(csrf, self.clock() + self.ttl_s, operator, token_digest)
        self._by_id[sid] = session
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The live session of a cookie value, or None."""
        session = self._by_id.get(sid or "")
        if session is None:
            return None
        if session.expires <= self.clock():
            del self._by_id[sid or ""]
            return None
        return session

    def end(self, sid: str | None) -> None:
        """Forget one session (logout)."""
        self._by_id.pop(sid or "", None)

    def _drop_expired(self) -> None:
        now = self.clock()
        for sid in [s for s, v in self._by_id.items() if v.expires <= now]:
            del self._by_id[sid]


@dataclass
class Throttle:
    """Wrong tokens per remote address: after `FREE_FAILURES`, each try waits longer.

    IPv6 addresses count by their /64 (one host usually holds the whole prefix), and at most
    `MAX_ADDRESSES` are remembered, the least recently failing forgotten first, so a flood of
    addresses cannot grow the process without bound."""

    clock: Callable[[], float] = time.monotonic
    _by_address: OrderedDict[str, _Failures] = field(default_factory=OrderedDict)

    def wait_s(self, address: str) -> float:
        """Seconds this address must still wait before its next try (0: may try now)."""
        failures = self._by_address.get(throttle_key(address))
        return 0.0 if failures is None else max(0.0, failures.not_before - self.clock())

    def failed(self, address: str) -> None:
        """One wrong token from `address`."""
        key = throttle_key(address)
        failures = self._by_address.pop(key, None) or _Failures()
        self._by_address[key] = failures  # now the most recent
        while len(self._by_address) > MAX_ADDRESSES:
            self._by_address.popitem(last=False)
        failures.count += 1
        over = failures.count - FREE_FAILURES
        if over >= 0:
            failures.not_before = self.clock() + min(MAX_WAIT_S, 2.0 ** min(over, 16))

    def succeeded(self, address: str) -> None:
        """A right token: the address starts afresh."""
        self._by_address.pop(throttle_key(address), None)

    def __len__(self) -> int:
        return len(self._by_address)


def throttle_key(address: str) -> str:
    """What the throttle counts by: an IPv4 address, or an IPv6 address's /64."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else str(ip)


@dataclass
class TokenFile:
    """The login token in `console.token_file`, read again whenever the file changes (size,
    time or inode); only its SHA-256 is kept."""

    path: Path
    _seen: tuple[int, int, int] | None = None
    _digest: bytes | None = None

    def digest(self, *, fresh: bool = False) -> bytes:
        """SHA-256 of the token now in the file (read again when it changed, or always when
        `fresh`: at login); OSError when it cannot be read or is empty."""
        st = self.path.stat()
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        if fresh or sig != self._seen or self._digest is None:
            expected = self.path.read_bytes().decode("utf-8").strip()
            if not expected:
                raise OSError(f"{self.path} is empty")
            self._seen, self._digest = sig, _sha256(expected)
        return self._digest

    def current(self, digest: bytes) -> bool:
        """Whether `digest` is the digest of the token now in the file (False when it cannot
        be read): a session of a token since rotated is no longer valid."""
        try:
            return hmac.compare_digest(digest, self.digest())
        except (OSError, UnicodeDecodeError):
            return False


def _sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def token_matches(given: str, tokens: TokenFile) -> bytes | None:
    """The token's digest when `given` is the token in the file, else None; compared in
    constant time, digests of equal length (the token's length does not show either); OSError
    when the file cannot be read."""
    expected = tokens.digest(fresh=True)
    digest = _sha256(given.strip())
    return digest if hmac.compare_digest(digest, expected) else None


def csrf_ok(given: str | None, expected: str) -> bool:
    """Whether a submitted CSRF token is the session's, compared in constant time."""
    return bool(given) and hmac.compare_digest(str(given).encode(), expected.encode())


def origin_of(url: str) -> str:
    """scheme://host[:port] of a URL."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def security_headers(hosted_origin: str | None) -> dict[str, str]:
    """The headers of every console answer: a strict CSP framing only the hosted page's origin,
    no framing of the console itself, no referrer, no sniffing, no caching."""
    frames = hosted_origin or "'none'"
    csp = (
        "default-src 'self'; "
        f"frame-src {frames}; "
        "script-src 'self'; style-src 'self'; img-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
    )
    return {
        "Content-Security-Policy": csp,
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
    }


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SESSION_KEY = web.RequestKey("console_session", Session)  # the session of a logged-in request


def guard(
    sessions: Sessions, headers: dict[str, str], tokens: TokenFile | None = None
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware: headers on every answer; a session for every path but the login and the
    static files (GET: redirected to /login; else 403), of the token now in the token file
    (a rotated token ends the sessions it opened); a valid CSRF token on every POST."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await _guarded(request, handler, sessions, tokens)
        except web.HTTPException as exc:
            exc.headers.update(headers)
            raise
        except StorageError as exc:
            # The store is closed or failing (serve stopping): say so, headers and all.
            log.error("console store unavailable", path=request.path, error=str(exc))
            response = web.Response(status=503, text="the store is not available; try again")
        except Exception:  # any other fault: logged, never shown
            log.exception("console request failed", path=request.path)
            response = web.Response(status=500, text="internal error (see the log)")
        response.headers.update(headers)
        return response

    return middleware


async def _guarded(
    request: web.Request, handler: Handler, sessions: Sessions, tokens: TokenFile | None
) -> web.StreamResponse:
    if request.path == "/login" or request.path.startswith("/static/"):
        return await handler(request)
    sid = request.cookies.get(SESSION_COOKIE)
    session = sessions.get(sid)
    if session is not None and tokens is not None and not tokens.current(session.token_digest):
        sessions.end(sid)
        session = None
    if session is None:
        if request.method in ("GET", "HEAD"):
            raise web.HTTPSeeOther("/login")
        raise web.HTTPForbidden(text="not logged in")
    if request.method not in ("GET", "HEAD"):
        form = await request.post()
        given = request.headers.get("X-CSRF-Token") or form.get("csrf")
        if not isinstance(given, str) or not csrf_ok(given, session.csrf):
            raise web.HTTPForbidden(text="missing or wrong CSRF token")
    request[SESSION_KEY] = session
    return await handler(request)


def set_session_cookie(
    response: web.StreamResponse, request: web.Request, sid: str, ttl_s: float
) -> None:
    """The session cookie: HttpOnly, SameSite=Strict, Path=/, Secure when the console is
    reached over https (through an SSH tunnel it is plain http on loopback)."""
    response.set_cookie(
        SESSION_COOKIE,
        sid,
        max_age=int(ttl_s),
        path="/",
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )


def clear_cookie(response: web.StreamResponse, request: web.Request, name: str, path: str) -> None:
    """Remove a cookie, with the same flags as when it was set (HttpOnly, SameSite=Strict,
    Secure over https): every Set-Cookie of the console carries them."""
    response.del_cookie(name, path=path, httponly=True, samesite="Strict", secure=request.secure)
