"""depositd's error classes: small, one module, carrying what the caller needs to decide.

The errors a statement or a database connection raises, on either engine, are the store's own
(`worker.store.errors`), beside the table that says which driver error is which.
"""

from __future__ import annotations


class DepositdError(Exception):
    """Base of every depositd error."""


class ConfigError(DepositdError):
    """Configuration, rules or profiles are invalid; `problems` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class StorageError(DepositdError):
    """The store is unavailable or refused the operation: what `Store.read`, `Store.write` and
    the webhook inserts raise, the failed statement's `StoreError` as the cause."""


class AlreadyServing(DepositdError, OSError):
    """The serve lock of the database (`<database>.lock`, or PostgreSQL's advisory lock) could
    not be taken, even shared."""


class InstanceRunning(AlreadyServing):
    """Another `serve` holds this SQLite database and this one was not told to share it
    (`storage.several_instances`); the message names the other one (pid, listening ports)."""


class ListenError(DepositdError, OSError):
    """A listening address of `serve` cannot be bound (taken by another process, or not an
    address of this host): `setting` names the key, `address` its HOST:PORT."""

    def __init__(self, setting: str, address: str, reason: str) -> None:
        self.setting = setting
        self.address = address
        self.reason = reason
        super().__init__(f"{setting}: cannot listen on {address}: {reason}")


class StorageUnavailable(StorageError):
    """A group transaction did not commit: the database is unavailable (the store logs the
    outage in a few lines, `worker.store.outage`)."""


class SchemaUpgradeRefused(StorageError):
    """The database's schema needs migrating while an instance of an older version serves
    on it: refused, that instance would run on a schema it does not know."""


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


class ProviderRequestRefused(ProviderBusinessError):
    """depositd refused to send a request (an id of `.`, `..` or empty in its path): nothing
    was sent, and sending it again cannot help."""


class ProviderAuthError(ProviderError):
    """Signature, API key or timestamp refused; re-sign and retry after back-off."""

    retryable = True
    same_key = True


class ProviderUnavailable(ProviderError):
    """Timeout, connection error or 5xx; retry with back-off and the same key."""

    retryable = True
    same_key = True


class ProviderRateLimited(ProviderUnavailable):
    """429, or a 5xx naming a rate limit: every poll backs off provider-wide for `retry_after`
    seconds (None: the answer named no time)."""

    def __init__(self, msg: str, *, retry_after: float | None = None, **kw: object) -> None:
        self.retry_after = retry_after
        super().__init__(msg, **kw)  # type: ignore[arg-type]


class ProviderProtocolError(ProviderError):
    """The provider's answer could not be read as any known envelope."""


class ProviderAnswerMismatch(ProviderProtocolError):
    """A transaction detail answered about another transactionId than the one asked for."""

    def __init__(self, endpoint: str, asked: str, answered: str) -> None:
        self.asked = asked
        self.answered = answered
        super().__init__(
            f"{endpoint} for {asked!r} answered about transactionId {answered[:80]!r};"
            " not recorded",
            endpoint=endpoint,
        )


class NotifyError(DepositdError):
    """An alert channel (Slack, e-mail) failed to deliver.

    `channel` names it; `retryable`: trying again later may succeed (429, 5xx, timeouts,
    connection errors), false for a bad URL or refused credentials. `retry_after` is the
    server's hint in seconds when it gave one; `attempts` is set once retries gave up.
    """

    def __init__(
        self, channel: str, msg: str, *, retryable: bool, retry_after: float | None = None
    ) -> None:
        self.channel = channel
        self.msg = msg
        self.retryable = retryable
        self.retry_after = retry_after
        self.attempts = 1
        super().__init__(f"{channel}: {msg}")


class SandboxError(DepositdError):
    """A sandbox control call is not possible in the current state (control API: HTTP 409)."""


class SandboxNotFound(SandboxError):
    """A sandbox control call named an unknown deposit, address or wallet (control API: 404)."""


class WalletCodeError(DepositdError):
    """The sandbox answers a provider call with a wallet business failure (`code`, `msg`)."""

    def __init__(self, code: str, msg: str) -> None:
        self.code = code
        self.msg = msg
        super().__init__(f"code {code}: {msg}")
