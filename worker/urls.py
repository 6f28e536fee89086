"""What may be said of a URL in logs and outcomes, and whether plain http:// is acceptable."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

__all__ = ["db_hosts", "host_port", "is_loopback", "mask_url", "plain_http_problem"]


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


# Parameters whose value is a secret, in a URL's query or a key=value string: the password,
# and the passphrase of a client certificate's key (libpq's `sslpassword`).
_SECRET_KEYS = ("password", "sslpassword")
_QUERY_SECRET = re.compile(r"(?i)((?:^|&)(?:ssl)?password=)[^&]*")
# A key=value string that libpq would not parse still has its secrets masked: a value quoted
# ('...', with \\ and \' escapes) or up to the next blank.
_PAIR_SECRET = re.compile(r"(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")


def mask_url(url: str) -> str:
    """A database URL or connection string with its secrets replaced by `***` (for logs,
    status and errors): every form libpq accepts.

    - a URL, one host or several (`postgresql://user:pw@h1:5432,h2:5433/db?...`): the password
      before the hosts, and a `password=` or `sslpassword=` query parameter;
    - a key=value string (`host=h1,h2 port=5432 user=u password='p w'`): the same keys;
    - a service name (`service=prod`, `postgresql:///?service=prod`) carries no secret here
      (it is in the service file): shown as it is.

    Anything else (an http:// URL) has a password before its host masked as well.
    """
    if "://" not in url:
        return _PAIR_SECRET.sub(r"\1***", url)
    scheme, _, rest = url.partition("://")
    rest, mark, query = rest.partition("?")
    query = _QUERY_SECRET.sub(r"\1***", query)
    # The user part ends at the last `@` before the query: a password holding `/` or `@`
    # unescaped is masked whole all the same.
    userinfo, at, hosts = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:***@{hosts}"
    return f"{scheme}://{rest}{mark}{query}"


def db_hosts(url: str) -> str:
    """The servers a database URL or connection string names, `host:port` each, comma-separated
    (`db1:5432, db2:5433`); `service NAME` for a service name; `(unparsed)` when libpq
    would refuse it. Never the user, database or password."""
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    if "/" in url.partition("://")[2].partition("?")[0].rpartition("@")[0]:
        # A password holding an unescaped `/`: libpq would read part of it as a host.
        return "(unparsed)"
    try:
        params = conninfo_to_dict(url)
    except Error:
        return "(unparsed)"
    hosts = str(params.get("host") or params.get("hostaddr") or "").split(",")
    ports = str(params.get("port") or "").split(",")
    named: list[str] = []
    for i, host in enumerate(hosts):
        # libpq: one port for every host, or one per host; an empty one is the default.
        port = ports[i] if len(ports) == len(hosts) else ports[0]
        host = host or ("" if params.get("service") else "localhost")
        if not host:
            continue
        if ":" in host and not host.startswith("/"):
            host = f"[{host}]"
        named.append(f"{host}:{port or 5432}")
    if params.get("service"):
        named.insert(0, f"service {params['service']}")
    return ", ".join(named)
