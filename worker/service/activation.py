"""The webhook's listening socket handed over by systemd (socket activation).

With deploy/depositd.socket enabled, systemd holds the webhook port itself and passes the
listening socket to `serve` (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`; the first one is
file descriptor 3). The port then stays open across a restart or an upgrade: deliveries that
arrive while `serve` starts wait in the socket's queue instead of being refused (deploy/README.md,
"The webhook port across restarts"). Without those variables `serve` binds `webhook.listen`
itself.

The socket must listen where `webhook.listen` says: the STATUS line, `depositd selftest` and the
deploy guide name that address, so a socket elsewhere stops `serve` (exit 2) rather than serve
a port nobody expects.
"""

from __future__ import annotations

import ipaddress
import os
import socket

from worker.errors import ListenError

FIRST_FD = 3  # SD_LISTEN_FDS_START
NAME = "webhook"  # FileDescriptorName= of deploy/depositd.socket
_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def _passed_fd() -> int | None:
    """The descriptor systemd passed for the webhook, or None when it passed none to this
    process. The variables are removed either way, so that no child takes them as its own."""
    pid, count, names = (os.environ.pop(name, None) for name in _VARIABLES)
    if pid is None or count is None or pid.strip() != str(os.getpid()):
        return None
    try:
        fds = int(count)
    except ValueError:
        return None
    if fds < 1:
        return None
    named = (names or "").split(":")
    if NAME in named[:fds]:
        return FIRST_FD + named.index(NAME)
    if fds == 1:  # a socket unit without FileDescriptorName=webhook
        return FIRST_FD
    return None


def _shown(address: tuple[str, int]) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _wildcard(host: str) -> bool:
    return ipaddress.ip_address(host.split("%")[0]).is_unspecified


def inherited(host: str, port: int) -> socket.socket | None:
    """The listening socket systemd passed for `host:port`, or None when it passed none
    (`serve` then binds the port itself). `ListenError` when the socket is no listening TCP
    socket or listens on another address than `webhook.listen`."""
    fd = _passed_fd()
    if fd is None:
        return None
    configured = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ListenError("webhook.listen", configured, f"socket from systemd: {exc}") from exc
    sock.set_inheritable(False)  # the ingress process gets it explicitly (pass_fds)
    if (
        sock.family not in (socket.AF_INET, socket.AF_INET6)
        or sock.type != socket.SOCK_STREAM
        or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    ):
        sock.close()
        raise ListenError(
            "webhook.listen",
            configured,
            "the socket systemd passes is no listening TCP socket (depositd.socket ListenStream=)",
        )
    bound = sock.getsockname()
    wanted = {
        str(info[4][0])
        for info in socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    }
    same_host = bound[0] in wanted or (_wildcard(bound[0]) and all(_wildcard(w) for w in wanted))
    if bound[1] != port or not same_host:
        sock.close()
        raise ListenError(
            "webhook.listen",
            configured,
            f"systemd passes a socket listening on {_shown(bound)} (depositd.socket"
            " ListenStream=); make webhook.listen and ListenStream= the same address",
        )
    return sock
