"""systemd notify protocol (sd_notify): readiness, reloading, stopping, status and the watchdog.

Everything is a no-op when NOTIFY_SOCKET is unset (not started by systemd, or in tests), and a
failed send never raises: losing a notification must not take the service down.

The protocol is one datagram per message on an AF_UNIX socket, so this speaks it directly
rather than through the `sdnotify` package, which leaks its socket when the connect fails.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Sequence

from worker.logs import get_logger

log = get_logger(__name__)


class SystemdNotifier:
    """Sends sd_notify datagrams to `$NOTIFY_SOCKET`, read once at construction."""

    def __init__(self) -> None:
        self._address = os.environ.get("NOTIFY_SOCKET") or None

    @property
    def enabled(self) -> bool:
        """True when started by systemd with a notify socket."""
        return self._address is not None

    def notify(self, state: str) -> None:
        """Send one raw state string (e.g. `READY=1`); no-op when disabled."""
        if self._address is None:
            return
        # An abstract-namespace address is given with a leading "@".
        address = "\0" + self._address[1:] if self._address.startswith("@") else self._address
        # A socket per message, like libsystemd's sd_notify(): nothing to close at shutdown.
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                # systemd reads promptly; if its queue is full, drop the message rather than
                # block the event loop.
                sock.setblocking(False)
                sock.sendto(state.encode("utf-8"), address)
        except OSError:
            pass

    def ready(self, status: str | None = None) -> None:
        """READY=1: startup finished (store open, migrations applied, rules loaded, port bound),
        with a STATUS= line for `systemctl status` when given."""
        self.notify("READY=1" if status is None else "READY=1\nSTATUS=" + " ".join(status.split()))

    def reloading(self) -> None:
        """RELOADING=1 with MONOTONIC_USEC (CLOCK_MONOTONIC now, in µs), in one datagram as
        systemd asks: a reload has begun; READY=1 says when it is done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notify(f"RELOADING=1\nMONOTONIC_USEC={usec}")

    def reloaded(self, error: str | None = None, restart: Sequence[str] = ()) -> None:
        """READY=1 after a reload, with a STATUS= line saying whether the new rules were taken
        or refused (the old ones stay in force), and the changed keys that need a restart."""
        text = "rules and profiles reloaded" if error is None else f"reload refused: {error}"
        if restart:
            text += f"; needs a restart: {', '.join(restart)}"
        self.notify("READY=1\nSTATUS=" + " ".join(text.split()))

    def stopping(self) -> None:
        """STOPPING=1: shutdown has begun."""
        self.notify("STOPPING=1")

    def status(self, text: str) -> None:
        """STATUS=<text>: one line shown by `systemctl status`."""
        self.notify("STATUS=" + " ".join(text.split()))

    def watchdog(self) -> None:
        """WATCHDOG=1: the service is alive."""
        self.notify("WATCHDOG=1")

    def watchdog_trigger(self) -> None:
        """WATCHDOG=trigger: a part of the service hangs; systemd acts as on a missed ping (kill,
        then Restart=) at once, instead of a whole WatchdogSec after the last ping."""
        self.notify("WATCHDOG=trigger")

    def watchdog_interval_s(self) -> float | None:
        """The watchdog timeout in seconds from `$WATCHDOG_USEC`, or None when not asked for."""
        if self._address is None:
            return None
        pid = os.environ.get("WATCHDOG_PID")
        if pid is not None and pid.strip() != str(os.getpid()):
            # Meant for another process (e.g. our parent); a child must not feed it.
            return None
        try:
            usec = int(os.environ.get("WATCHDOG_USEC", ""))
        except ValueError:
            return None
        return usec / 1_000_000 if usec > 0 else None


async def watchdog_loop(
    notifier: SystemdNotifier,
    interval_s: float | None,
    alive: Callable[[], bool] = lambda: True,
) -> None:
    """Send WATCHDOG=1 every `interval_s / 4` from the event loop until cancelled, while
    `alive()` (e.g. the ingress process answers); once it does not, WATCHDOG=trigger, and stop.

    Pinging from the loop itself (not a thread) is the point: if the loop hangs, the pings
    stop and systemd restarts the service within `interval_s` of the hang. A part found hung
    by `alive()` is reported at once, so that it too is killed within `interval_s` (docs: the
    deploy guide's "Configure"). `interval_s` None or not positive returns at once.
    """
    if interval_s is None or interval_s <= 0 or not notifier.enabled:
        return
    while True:
        if not alive():
            log.error("a part of the service stopped answering: asking systemd's watchdog to act")
            notifier.watchdog_trigger()
            return
        notifier.watchdog()
        await asyncio.sleep(interval_s / 4)
