"""What may be said of a URL in logs and outcomes, and whether plain http:// is acceptable."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["host_port", "is_loopback", "mask_url", "plain_http_problem"]


def host_port(url: str) -> str:
    """`host:port` of a URL: what a connection error names (never its path, query or user)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    default = 443 if parts.scheme == "https" else 80
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port or default}"


def is_loopback(host: str | None) -> bool:
    """Whether `host` is this machine (localhost, 127.0.0.0/8, ::1)."""
    if not host:
        return False
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plain_http_problem(url: str, *, allowed: bool, key: str) -> tuple[str | None, str | None]:
    """(warning, error) for a URL sent over plain http://: nothing to loopback, a warning with
    `key` set to true, elsewhere an error (the deposit, its signature and credentials travel
    unencrypted)."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "http":
        return None, None
    where = host_port(url)
    if is_loopback(parts.hostname):
        # The traffic never leaves the machine (a local sandbox, a proxy on this host).
        return None, None
    if allowed:
        return f"plain http:// to {where} is not encrypted (accepted: {key}: true)", None
    return None, (
        f"plain http:// to {where} sends requests unencrypted; use https://, or set"
        f" {key}: true if this is meant"
    )


# A password given as a query parameter (`postgresql://user@host/db?password=...`, which libpq
# accepts as well as `user:password@`).
_QUERY_PASSWORD = re.compile(r"(?i)((?:^|&)password=)[^&]*")


def mask_url(url: str) -> str:
    """The URL with its password replaced by `***`, in the user part or as a `password=`
    query parameter (for logs, status and errors)."""
    try:
        parts = urlsplit(url)
        password, port = parts.password, parts.port
    except ValueError:
        return "(a malformed URL)"
    if parts.query:
        parts = parts._replace(query=_QUERY_PASSWORD.sub(r"\1***", parts.query))
    if password is None:
        return urlunsplit(parts)
    host = parts.hostname or ""
    if port is not None:
        host = f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
