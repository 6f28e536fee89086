"""Injected faults on the provider API: 5xx, timeout, latency, a business failure code, or a
rate limit (HTTP 429, or a 503 naming a rate limit, with an optional Retry-After).

A fault matches an endpoint by name ("history" also matches "history_alt"; "*" matches every
endpoint) or by path prefix ("/v1/wallet/history"). Each matching request uses up one of its
`count` (None: until cleared).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from worker.errors import SandboxError
from worker.provider.codes import WALLET_CODES

KINDS = ("5xx", "timeout", "latency", "code", "rate_limit")
RATE_LIMIT_STATUSES = (429, 503)


@dataclass
class Fault:
    """One injected fault."""

    endpoint: str
    kind: str
    count: int | None = 1
    latency_s: float = 0.0
    code: str = "10000104"
    http_status: int = 429  # rate_limit: 429, or 503 naming the rate limit in its message
    retry_after_s: int | None = None  # rate_limit: the Retry-After header (None: none sent)

    def matches(self, name: str, path: str) -> bool:
        """Does this fault apply to a request of endpoint `name` at `path`?"""
        if self.endpoint == "*":
            return True
        if self.endpoint.startswith("/"):
            return path.startswith(self.endpoint)
        return name == self.endpoint or name.startswith(self.endpoint + "_")

    def doc(self) -> dict[str, Any]:
        """JSON-ready view for the control API's state."""
        return {
            "endpoint": self.endpoint,
            "kind": self.kind,
            "count": self.count,
            "latencySeconds": self.latency_s,
            "code": self.code,
            "httpStatus": self.http_status,
            "retryAfterSeconds": self.retry_after_s,
        }


class Faults:
    """The active faults; `release` lets held "timeout" requests go when faults are cleared."""

    def __init__(self) -> None:
        self.active: list[Fault] = []
        self.release = asyncio.Event()

    def add(self, fault: Fault) -> None:
        """Activate a fault after checking it makes sense."""
        if fault.kind not in KINDS:
            raise SandboxError(f"fault kind must be one of {', '.join(KINDS)}: {fault.kind!r}")
        if not fault.endpoint:
            raise SandboxError("fault endpoint must not be empty")
        if fault.count is not None and fault.count < 1:
            raise SandboxError("fault count must be at least 1 (or null: until cleared)")
        if fault.kind == "code" and fault.code not in WALLET_CODES:
            raise SandboxError(f"unknown wallet code {fault.code!r}")
        if fault.latency_s < 0:
            raise SandboxError("latencySeconds must not be negative")
        if fault.http_status not in RATE_LIMIT_STATUSES:
            raise SandboxError("httpStatus must be 429 or 503")
        if fault.retry_after_s is not None and fault.retry_after_s < 0:
            raise SandboxError("retryAfterSeconds must not be negative")
        if self.release.is_set():
            self.release = asyncio.Event()
        self.active.append(fault)

    def clear(self) -> None:
        """Remove every fault and let held requests go."""
        self.active.clear()
        self.release.set()

    def take(self, name: str, path: str) -> Fault | None:
        """The first fault matching this request, using up one of its count."""
        for fault in self.active:
            if fault.matches(name, path):
                if fault.count is not None:
                    fault.count -= 1
                    if fault.count <= 0:
                        self.active.remove(fault)
                return fault
        return None
