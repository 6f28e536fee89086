"""The logging setup a process asks for before `worker.logs` (and structlog) is loaded.

`depositd` sets it at start (worker/commands/cli.py); `worker.logs` applies it when it is first
imported, that is when the first module that logs is loaded. A command that logs nothing
(`status`) so starts without structlog, and no log line is ever written unconfigured.
"""

from __future__ import annotations

# (format, level) for `worker.logs.configure`, or None when nothing was asked for.
requested: tuple[str | None, str] | None = None
