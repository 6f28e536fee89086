"""structlog setup: JSON lines under systemd (no TTY), console otherwise.

Secrets and payer data never reach a log call: log names (profile name, transactionId), never
contents. `redact` is a last guard that drops keys which must never be logged.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_NEVER_LOG = frozenset(
    {
        "secret",
        "api_secret",
        "password",
        "api_key",
        "signature",
        "payer",
        "profile_data",
        "body",
        "fullName",
        "firstName",
        "lastName",
        "birthday",
        "residentialAddress",
        "companyAddress",
    }
)


def redact(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Drop keys that could carry secrets or personal data."""
    for key in _NEVER_LOG.intersection(event_dict):
        event_dict[key] = "[redacted]"
    return event_dict


def configure(fmt: str | None = None, level: str = "info", stream: Any = None) -> None:
    """Configure structlog once per process; `fmt` None picks json without a TTY."""
    out = stream or sys.stderr
    if fmt is None:
        fmt = "console" if out.isatty() else "json"
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


# A log line (message, fields) written later, e.g. once its transaction is committed.
LogLine = tuple[str, dict[str, Any]]


def get_logger(name: str) -> Any:
    """A bound structlog logger named after its module."""
    return structlog.get_logger(name)
