"""structlog setup: JSON lines under systemd (no TTY), console otherwise.

Secrets and payer data never reach a log call: log names (profile name, transactionId), never
contents. `redact` is a last guard that drops keys which must never be logged.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_NEVER_LOG = frozenset(
    {
        "secret",
        "api_secret",
        "webhook_url",
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


def _exception_type_only(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A library's exception as its type only: its text may hold request bytes (a header with
    a key in it), and its traceback would not be one JSON line."""
    exc_info = event_dict.pop("exc_info", None)
    if exc_info:
        exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
        if isinstance(exc, BaseException):
            event_dict["error"] = type(exc).__name__
    return event_dict


_handler: logging.Handler | None = None  # ours on the root logger, replaced by a reconfigure


class _Stderr:
    """Whatever `sys.stderr` is at the time of writing (a test may swap it, then close it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


# syslog priorities (sd-daemon(3)): journald reads a leading "<N>" as the line's PRIORITY= and
# strips it, so `journalctl -p err` selects error lines while MESSAGE stays the rendered line.
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


def stderr_is_journal() -> bool:
    """True when stderr is the journal stream systemd connected (`$JOURNAL_STREAM` names its
    device and inode), not a pipe or file the service's own stderr was redirected to."""
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        st = os.fstat(2)
        return (st.st_dev, st.st_ino) == (int(device), int(inode))
    except (OSError, ValueError):
        return False


def _with_priority(renderer: Any) -> Any:
    """`renderer` with each line prefixed by the syslog priority of its level."""

    def render(logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> str:
        level = str(event_dict.get("level", "info")).lower()
        return f"<{_PRIORITY.get(level, 6)}>{renderer(logger, name, event_dict)}"

    return render


def configure(fmt: str | None = None, level: str = "info", stream: Any = None) -> None:
    """Configure structlog once per process; `fmt` None picks json without a TTY. The standard
    library's loggers (aiohttp, asyncio, APScheduler) go through the same renderer. Lines to a
    journal stream carry their level's syslog priority."""
    global _handler
    out: Any = stream or _Stderr()
    if fmt is None:
        fmt = "console" if out.isatty() else "json"
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    if stream is None and stderr_is_journal():
        renderer = _with_priority(renderer)
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
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                redact,
                _exception_type_only,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    # Libraries speak at warning and above (APScheduler's info is a line per job run), all of
    # it at debug.
    root.setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
    logging.captureWarnings(True)
    _handler = handler


def reset() -> None:
    """Back to structlog's defaults, without our handler on the root logger (between tests)."""
    global _handler
    structlog.reset_defaults()
    if _handler is not None:
        logging.getLogger().removeHandler(_handler)
        _handler = None


# A log line (message, fields) written later, e.g. once its transaction is committed.
LogLine = tuple[str, dict[str, Any]]


def get_logger(name: str) -> Any:
    """A bound structlog logger named after its module."""
    return structlog.get_logger(name)


def _apply_requested() -> None:
    from worker import logdefault

    if logdefault.requested is not None:
        configure(*logdefault.requested)


_apply_requested()
