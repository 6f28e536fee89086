"""depositd's error classes: small, one module, carrying what the caller needs to decide."""

from __future__ import annotations


class DepositdError(Exception):
    """Base of every depositd error."""


class ConfigError(DepositdError):
    """Configuration, rules or profiles are invalid; `problems` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class StorageError(DepositdError):
    """The SQLite store is unavailable or refused the operation."""


class SchemaTooNew(StorageError):
    """The database was written by a newer depositd; refusing to touch it."""


class ProviderError(DepositdError):
    """A provider call failed.

    `retryable`: the call may be tried again later; `same_key`: with the same Idempotency-Key.
    """

    retryable: bool = False
    same_key: bool = False

    def __init__(
        self,
        msg: str,
        *,
        code: str | None = None,
        trace_id: str | None = None,
        http_status: int | None = None,
        endpoint: str | None = None,
    ) -> None:
        self.msg = msg
        self.code = code
        self.trace_id = trace_id
        self.http_status = http_status
        self.endpoint = endpoint
        detail = f"code {code}: " if code else ""
        trace = f" (traceId {trace_id})" if trace_id else ""
        super().__init__(f"{detail}{msg}{trace}")


class ProviderBusinessError(ProviderError):
    """The provider answered with a business failure (status 500 / success false / a code)."""


class ProviderRetryLater(ProviderBusinessError):
    """10000104: cannot submit right now; retry later with the same payload and key."""

    retryable = True
    same_key = True


class ProviderAuthError(ProviderError):
    """Signature, API key or timestamp refused; re-sign and retry after back-off."""

    retryable = True
    same_key = True


class ProviderUnavailable(ProviderError):
    """Timeout, connection error or 5xx; retry with back-off and the same key."""

    retryable = True
    same_key = True


class ProviderProtocolError(ProviderError):
    """The provider's answer could not be read as any known envelope."""
