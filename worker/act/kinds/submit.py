"""`submit_profile`: submit a payer profile for a deposit waiting for details.

The reactor queues the row under the profile content's Idempotency-Key (or records why nothing
is submitted); `Submitter` runs it after the commit in three steps: pick the profile that applies
now, send it with that key, and record what the provider answered. An unknown outcome is retried
with the same key; a refusal is read by its wallet code in `CODE_OUTCOMES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from worker import clock
from worker.act import specs
from worker.act.kinds.base import Kind, Observe, Recording, RunnerDeps
from worker.act.notfound import Reread, find_in_queues
from worker.act.queue import (
    ActionRows,
    add_submission,
    alert_mismatch,
    alert_once,
    enqueue_alert,
    key_used,
    submit_key,
    submit_params,
)
from worker.config.profiles import Profiles
from worker.errors import (
    ProviderAnswerMismatch,
    ProviderAuthError,
    ProviderBusinessError,
    ProviderError,
    ProviderProtocolError,
    ProviderRequestRefused,
    ProviderRetryLater,
    ProviderUnavailable,
    StorageError,
)
from worker.logs import get_logger
from worker.provider.client import ProviderClient
from worker.provider.codes import RetryCategory, categorize, code_rule, may_retry_same_key
from worker.provider.models import DepositOrder, WhiteListStatus
from worker.provider.payer import fields_named
from worker.rules import RuleBook
from worker.rules.fingerprint import rules_hash
from worker.store import journal, submissions, waits
from worker.store.db import Database, Db
from worker.track.facts import fact_from_order
from worker.track.tracker import Deposit, Fact, State

log = get_logger(__name__)

# A submission whose outcome is unknown (an unreadable answer, a system error, "processing") is
# retried with the same key without end; a human is told once it has lasted this many attempts.
UNKNOWN_ALERT_AFTER = 3
# The trigger of a submission an operator approved (`worker.act.approve.TRIGGER`).
OPERATOR = "operator"


@dataclass(frozen=True)
class CodeOutcome:
    """What a submission refused with one wallet error code leads to.

    `read_result`: done; the deposit's detail is read (`what` the code says, what reading
    did). `check_gone`: failed; the history queues (init, rejected) and the detail tell whether
    the deposit is gone or still waiting.
    `refused`: failed until the profile changes (warning). `failed`: failed (critical).
    """

    step: Literal["read_result", "check_gone", "refused", "failed"]
    what: str = ""
    read: str = ""


CODE_OUTCOMES: dict[str, CodeOutcome] = {
    "10000100": CodeOutcome("check_gone"),
    "10000101": CodeOutcome("read_result", "review already completed", "detail refreshed"),
    "10000102": CodeOutcome("refused"),
    "10000103": CodeOutcome("refused"),
    "10000105": CodeOutcome("read_result", "duplicate request", "original result read"),
    "10000106": CodeOutcome("failed"),  # a bug on our side
    "10000107": CodeOutcome("failed"),  # the wallet
}
OTHER_CODE = CodeOutcome("failed")  # codes the interface omits


def record(rec: Recording) -> None:
    """Queue the submission, or a skipped row saying why nothing is submitted."""
    deposit, intent, match = rec.deposit, rec.intent, rec.match
    if match is None and not intent.params.get("profile"):
        rec.add(params={}, status="skipped", outcome="no profile applies")
        return
    profiles = rec.profiles()
    named = intent.params.get("profile")
    name = str(named) if named else match.name if match is not None else ""
    content = profiles.content_hash(name)
    key = submit_key(deposit.transaction_id, content)
    if key_used(rec.db, deposit.transaction_id, key):
        # The provider has this very payload already (a rejection is never answered
        # with the same details): wait for a changed profile instead.
        rec.add(
            params=submit_params(name, content, named=bool(named)),
            status="skipped",
            outcome="identical payload already submitted; waiting for a changed profile",
        )
        return
    add_submission(
        rec.db,
        deposit,
        name,
        content,
        named=bool(named),
        trigger=rec.trigger,
        event_id=rec.fact.event_id,
        intent=intent,
    )


@dataclass(frozen=True)
class _Submission:
    """One submission row being run: the profile picked now and its Idempotency-Key, and what
    its journal entry keeps of the decision (the row's rule set, the rules hash, when sent)."""

    action_id: int
    tx: str
    deposit: Deposit | None
    profile: str
    key: str
    body: dict[str, Any]
    attempts: int
    rule_set: str | None = None
    rule_set_version: str | None = None
    rules_hash: str | None = None
    sent_at: str = ""

    def sent(self, status: str) -> Callable[[Database], object]:
        """What keeps the submission once its outcome is final (`status`: done, or failed when
        the provider refused it), in the write that records that outcome: the payload as
        sent in `submissions`, and the SUBMITTED journal entry with its field names and hash,
        never its values (docs/audit.md)."""

        def keep(db: Db) -> None:
            digest = submissions.record_sent(
                db,
                action_id=self.action_id,
                transaction_id=self.tx,
                profile=self.profile,
                body=self.body,
                sent_at=self.sent_at,
                outcome=status,
            )
            entry = {
                "action_id": self.action_id,
                "profile": self.profile,
                "fields": submissions.field_names(self.body),
                "payload_sha256": digest,
                "rule_set": self.rule_set,
                "rule_set_version": self.rule_set_version,
                "rules_hash": self.rules_hash,
                "outcome": status,
            }
            journal.append_at_commit(db, journal.SUBMITTED, self.tx, entry)

        return keep


def _both(
    first: Callable[[Database], object],
    then: Callable[[Database], object] | None,
) -> Callable[[Database], object]:
    """Two jobs of one write, in order."""

    def both(db: Database) -> None:
        first(db)
        if then is not None:
            then(db)

    return both


def _short(key: str) -> str:
    """The short form of an Idempotency-Key that tells one submission's alerts from another's."""
    return key[:12]


class Submitter:
    """Runs submit_profile rows on the provider client, recording outcomes in `ActionRows`."""

    def __init__(
        self,
        rows: ActionRows,
        *,
        client: ProviderClient,
        profiles: Callable[[], Profiles],
        observe: Observe,
        rules: Callable[[], RuleBook] = RuleBook.empty,
    ) -> None:
        self._rows = rows
        self._client = client
        self._profiles = profiles
        self._observe = observe
        self._rules = rules

    @classmethod
    def build(cls, deps: RunnerDeps) -> Submitter:
        """The runner the outbox uses for submit_profile rows."""
        return cls(
            deps.rows,
            client=deps.client,
            profiles=deps.profiles,
            observe=deps.observe,
            rules=deps.rules,
        )

    async def close(self) -> None:
        """Nothing to release: the client belongs to the service."""

    async def run(
        self,
        action_id: int,
        row: dict[str, Any],
        deposit: Deposit | None,
        params: dict[str, Any],
        attempts: int,
    ) -> None:
        """Submit the profile that applies now; record the outcome, or retry or alert."""
        sub = self._pick(action_id, row, deposit, params, attempts)
        if sub is None:
            outcome = "no profile applies any more"
            if params.get("named"):
                # Named by an operator or a rule: the profiles in force do not hold it (edited
                # out, or added to the file without a reload).
                outcome = (
                    f"profile {params.get('profile')} is not among the profiles in force"
                    " (reload the service after editing the profiles file)"
                )
            await self._rows.finish(action_id, "skipped", outcome)
            return
        approved = params.get("content_hash")
        if row.get("trigger") == OPERATOR and approved and sub.key != submit_key(sub.tx, approved):
            # An operator approved the profile as the file held it (`depositd submit` reads
            # the file); the service holds another version of it: never send details other
            # than the ones approved.
            await self._rows.finish(
                action_id,
                "skipped",
                f"profile {sub.profile} in force is not the version approved (the profiles file"
                " was edited and not reloaded, or reloaded since): reload the service if the file"
                " holds the version to send, then submit again",
            )
            return
        try:
            await self._client.submit_payer(sub.tx, sub.body, idempotency_key=sub.key)
        except ProviderError as exc:
            await self._refused(sub, exc)
            return
        await self._accepted(sub, params)

    def _pick(
        self,
        action_id: int,
        row: dict[str, Any],
        deposit: Deposit | None,
        params: dict[str, Any],
        attempts: int,
    ) -> _Submission | None:
        """The profile that applies now (a named one while it exists); None when none does."""
        tx = str(row["transaction_id"])
        profiles = self._profiles()
        match = profiles.for_deposit(
            deposit.wallet_id if deposit else None, deposit.from_address if deposit else None
        )
        name = match.name if match is not None else None
        if params.get("named"):
            name = params["profile"] if params["profile"] in profiles.names() else None
        if name is None:
            return None
        key = submit_key(tx, profiles.content_hash(name))
        return _Submission(
            action_id,
            tx,
            deposit,
            name,
            key,
            profiles.body(name),
            attempts,
            rule_set=row.get("rule_set"),
            rule_set_version=row.get("rule_set_version"),
            rules_hash=rules_hash(self._rules(), profiles),
            sent_at=clock.utc_now(),
        )

    async def _accepted(self, sub: _Submission, params: dict[str, Any]) -> None:
        """Record the accepted submission, and "pending" as the tracker's fact."""
        await self._rows.finish(
            sub.action_id,
            "done",
            f"submitted profile {sub.profile}; whiteListStatus pending",
            key=sub.key,
            also=sub.sent("done"),
        )
        # Dated when the provider's acceptance arrived, in this machine's clock like every
        # fact (`worker.track.facts`): a read sent before then may still show the status this
        # submission answered, and must not override it.
        fact = Fact(
            transaction_id=sub.tx,
            source="submit",
            observed_at=clock.now_ms(),
            white_list_status=WhiteListStatus.PENDING,
        )
        try:
            await self._observe(fact)
        except StorageError as exc:  # the database unavailable: one line, no traceback
            log.error(
                "submission accepted; its fact not recorded now",
                transactionId=sub.tx,
                error=str(exc),
            )
        except Exception:
            # The provider has the submission and the row says so: it must stay done (a failed
            # row would let a profile edit queue a second submission while this one is under
            # review). The detail poll and the webhooks bring the deposit's state.
            log.exception("submission accepted; its fact not recorded now", transactionId=sub.tx)

    async def _refused(self, sub: _Submission, exc: ProviderError) -> None:
        """Record a call that did not succeed: retry later, alert, or read the refusal."""
        rows, action_id, attempts, key = self._rows, sub.action_id, sub.attempts, sub.key
        if isinstance(exc, ProviderRetryLater):
            outcome = f"{exc.code}: cannot submit now; retrying later with the same payload"
            await rows.later(action_id, attempts, outcome, key=key)
        elif isinstance(exc, ProviderAuthError):
            auth_detail, deposit = str(exc), sub.deposit
            await rows.later(
                action_id,
                attempts,
                f"auth failure: {exc.msg}; retrying after back-off",
                key=key,
                also=lambda db: enqueue_alert(
                    db, deposit, "auth_failure", "critical", trigger="submit", detail=auth_detail
                ),
            )
        elif isinstance(exc, ProviderUnavailable):
            outcome = f"provider unavailable: {exc}; retrying with the same key"
            await rows.later(action_id, attempts, outcome, key=key)
        elif isinstance(exc, ProviderProtocolError):
            # No answer that can be read (an HTML error page, a redirect, data of the wrong
            # shape): the submission may or may not have been taken. The interface's
            # "Timeout / unknown": retry with back-off and the same key.
            await self._unknown_outcome(sub, "unreadable", f"answer unreadable: {exc}")
        elif isinstance(exc, ProviderRequestRefused):
            # An id that would change the request path: nothing was sent, and nothing depositd
            # may do changes the id; a human looks at the deposit.
            also = alert_once(
                sub.deposit, "submit_refused", "critical", trigger="submit", detail=exc.msg
            )
            await rows.finish(action_id, "failed", exc.msg, also=also)
        elif isinstance(exc, ProviderBusinessError):
            await self._submit_failed(sub, exc)
        else:
            raise exc

    async def _unknown_outcome(self, sub: _Submission, label: str, what: str) -> None:
        """Retry later with the same key; alert (warning) once it has lasted a few attempts."""
        also = None
        if sub.attempts >= UNKNOWN_ALERT_AFTER:
            also = alert_once(
                sub.deposit,
                f"submit_failed:{label}",
                "warning",
                trigger="submit",
                detail=f"{what}; {sub.attempts} attempts so far; depositd keeps retrying with the "
                "same Idempotency-Key",
                profile=sub.profile,
                once_per=_short(sub.key),
            )
        await self._rows.later(
            sub.action_id,
            sub.attempts,
            f"{what}; outcome unknown, retrying with the same key",
            key=sub.key,
            also=also,
        )

    async def _refresh(self, tx: str) -> DepositOrder | None:
        """Read the deposit's detail and feed it to the tracker; None if it is gone."""
        sent_at = clock.now_ms()
        try:
            order = await self._client.transaction_detail(tx)
        except ProviderBusinessError as exc:
            if exc.code == "10000100":
                return None
            raise
        except ProviderAnswerMismatch as exc:
            # Another deposit's record: nothing recorded, a human told, then read as unread.
            await self._rows.write(partial(alert_mismatch, transaction_id=tx, detail=str(exc)))
            raise
        try:
            await self._observe(fact_from_order(order, source="poll", sent_at=sent_at))
        except StorageError as exc:  # the database unavailable: one line, no traceback
            log.error("detail read; its fact not recorded now", transactionId=tx, error=str(exc))
        except Exception:
            # What was read still decides this row; the detail poll records it later.
            log.exception("detail read; its fact not recorded now", transactionId=tx)
        return order

    async def _submit_failed(self, sub: _Submission, exc: ProviderBusinessError) -> None:
        """A business error: an unknown outcome by its retry category, else by `CODE_OUTCOMES`."""
        code = exc.code or ""
        rule = code_rule(code)
        # The provider's message may echo the values sent (payer data): only the fields it
        # names are kept, for the alert, the row and the log alike.
        fields = fields_named(exc.msg, sub.body)
        named = f"names {', '.join(fields)}" if fields else "names no field"
        head = f"{code} {rule.meaning}" if rule else (code or f"HTTP {exc.http_status}")
        detail = f"{head}: the provider's message {named} (traceId {exc.trace_id})"
        if may_retry_same_key(exc.code, exc.msg, exc.http_status):
            # Codes outside the interface's table, read by its retry categories: "System
            # error" (same key acceptable) and "In-flight" (do not change the key; query).
            if categorize(exc.msg, exc.http_status) is RetryCategory.IN_FLIGHT:
                try:
                    await self._refresh(sub.tx)
                except ProviderError as err:
                    log.warning("detail not read", transactionId=sub.tx, error=err.msg)
                label, what = "in_flight", f"submission in flight at the provider: {detail}"
            else:
                label, what = code or "system_error", f"provider system error: {detail}"
            await self._unknown_outcome(sub, label, what)
            return
        outcome = CODE_OUTCOMES.get(code, OTHER_CODE)
        step = {
            "read_result": self._read_result,
            "check_gone": self._check_gone,
            "refused": self._profile_refused,
            "failed": self._failed,
        }[outcome.step]
        await step(sub, outcome, code, detail)

    def _alert(
        self, sub: _Submission, code: str, severity: str, text: str
    ) -> Callable[[Database], object]:
        """Each submission's refusal alerts on its own (a refusal after a correction is news);
        the same submission refused again does not. The deposit then waits on a person for its
        payer details: a wait starts (its deadline, docs/rules.md, "Deadlines"), unless one is
        open; the deadline job ends it once the deposit no longer needs details."""

        def write(db: Db) -> None:
            enqueue_alert(
                db,
                sub.deposit,
                f"submit_failed:{code}",
                severity,
                trigger="submit",
                detail=text,
                profile=sub.profile,
                once_per=_short(sub.key),
            )
            waits.start_wait(
                db,
                sub.tx,
                State.NEEDS_DETAILS.value,
                now=clock.now_ms(),
                severity=severity,
                channels=None,
                again=False,
            )

        return write

    async def _read_result(self, sub: _Submission, out: CodeOutcome, code: str, _: str) -> None:
        read = out.read
        try:
            await self._refresh(sub.tx)
        except ProviderError as err:
            # Nothing to submit either way; the detail poll reads the result later.
            read = f"detail not read now ({err.msg}); the detail poll reads it"
        await self._rows.finish(
            sub.action_id, "done", f"{out.what}; {read}", key=sub.key, also=sub.sent("done")
        )

    async def _check_gone(self, sub: _Submission, _: CodeOutcome, code: str, detail: str) -> None:
        """10000100: re-read the history queues (init, rejected), then the detail; a deposit in
        neither and unknown to the detail is gone (critical alert). No retry with this key."""
        try:
            queue = await find_in_queues(
                self._client,
                sub.tx,
                wallet_id=sub.deposit.wallet_id if sub.deposit else None,
                observe=self._observe,
            )
            seen = Reread(queue, await self._refresh(sub.tx))
        except ProviderError as err:
            # Gone or not cannot be told yet: try again later with the same key.
            outcome = f"{detail}; queues or detail not read ({err.msg}); retrying later"
            await self._rows.later(sub.action_id, sub.attempts, outcome, key=sub.key)
            return
        found = f"{detail}; {seen.describe()}"
        log.warning("submission answered 10000100", transactionId=sub.tx, queue=seen.queue)
        if seen.gone:
            also = self._alert(sub, code, "critical", found)
            outcome = f"{found}; deposit gone"
        elif seen.waits_for_details:
            # Not found to a submission, yet still waiting for payer details: nothing
            # depositd may do (no retry with this key) moves it on, so a human must know.
            also = self._alert(
                sub,
                code,
                "warning",
                f"{found}; the deposit still exists and still waits for payer details;"
                " depositd does not submit again",
            )
            outcome = f"{found}; the deposit still exists and still waits for details"
        else:
            # It moved on (rejected, a review under way or done): the tracker follows it.
            also, outcome = None, f"{found}; the deposit still exists"
        await self._rows.finish(
            sub.action_id, "failed", outcome, key=sub.key, also=_both(sub.sent("failed"), also)
        )

    async def _profile_refused(
        self, sub: _Submission, _: CodeOutcome, code: str, detail: str
    ) -> None:
        await self._rows.finish(
            sub.action_id,
            "failed",
            f"profile {sub.profile} refused: {detail}; no retry until the profile changes",
            key=sub.key,
            also=_both(sub.sent("failed"), self._alert(sub, code, "warning", detail)),
        )

    async def _failed(self, sub: _Submission, _: CodeOutcome, code: str, detail: str) -> None:
        also = _both(sub.sent("failed"), self._alert(sub, code, "critical", detail))
        await self._rows.finish(sub.action_id, "failed", detail, key=sub.key, also=also)


KIND = Kind(specs.SUBMIT, record, runner=Submitter.build)
