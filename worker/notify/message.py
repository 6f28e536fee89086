"""Alert text: what happened, to which deposit, and what to do next.

An alert names the payer profile, never its contents: `build_alert` reads only the deposit's
identifying fields (transactionId, wallet, amount, currency, network, failMessage), so personal
data cannot leak into Slack or e-mail even when the caller holds it.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from worker.provider.codes import WALLET_CODES
from worker.provider.jsonio import decimal_str

SEVERITIES = ("info", "warning", "critical")
# `overdue:REASON`: the alert of a deposit waiting on a person past its deadline.
OVERDUE = "overdue"

_SEVERITY_ICON = {
    "info": ":information_source:",
    "warning": ":warning:",
    "critical": ":rotating_light:",
}
# Slack's limits for a header's plain text and a section's text.
_SLACK_HEADER_MAX = 150
_SLACK_TEXT_MAX = 3000


@dataclass(frozen=True)
class Alert:
    """One alert, ready to render for any channel; never carries payer data."""

    condition: str
    severity: str
    title: str
    transaction_id: str | None = None
    wallet_id: int | None = None
    wallet_name: str | None = None
    amount: Decimal | None = None
    currency: str | None = None
    network: str | None = None
    detail: str | None = None
    next_step: str | None = None
    profile: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}: {self.severity!r}")
        if self.amount is not None and not isinstance(self.amount, Decimal):
            raise TypeError("amount must be a Decimal")


@dataclass(frozen=True)
class _Text:
    title: str
    next_step: str | None
    detail_from_deposit: bool = False  # use the deposit's failMessage when no detail is given


# Titles and next steps follow the provider interface (States, Transitions, Wallet error codes)
# and what depositd itself does about each condition (docs/concepts.md).
_TEXTS: dict[str, _Text] = {
    "needs_details": _Text(
        "Payer details needed",
        "Submit payer details: store a profile for this wallet or source address "
        "(depositd then submits it), or submit them by hand. Funds stay unavailable until then.",
    ),
    "rejected": _Text(
        "Payer details rejected",
        "Correct the payer profile that applies to this deposit; depositd resubmits once the "
        "profile has changed (never the same payload twice).",
        detail_from_deposit=True,
    ),
    "blocked": _Text(
        "Deposit BLOCKED: funds could not be credited",
        "Contact provider support with the transactionId.",
    ),
    "held": _Text(
        "Booking held for a decision",
        "A fixed field in conflict or a likely duplicate holds the booking: decide it with"
        " `depositd resolve TX --set FIELD=VALUE --by NAME` (`depositd resolve TX` lists what is"
        " open); the booking held is then made once.",
    ),
    "released": _Text(
        "Deposit released: a BLOCKED deposit is now credited",
        "Support released the funds; they are in the available balance. depositd books the "
        "deposit once through the booking rule (on: [credited]); no other step is needed.",
    ),
    "failed": _Text(
        "Deposit FAILED: the deposit order ended with status FAIL",
        "Nothing will be credited. Check the transaction detail and contact provider support "
        "with the transactionId if the reason is unclear.",
        detail_from_deposit=True,
    ),
    "address_failed": _Text(
        "Source address registration FAILED",
        "A record cannot be edited: disable it, correct the profile if needed, and register "
        "a new one.",
        detail_from_deposit=True,
    ),
    "poll_failing": _Text(
        "Provider polling failing",
        "Check that the provider is reachable and that the API key, secret and clock are right; "
        "until polling recovers, deposits whose webhook was lost are not found.",
    ),
    "provider_unknown": _Text(
        "Profile names a provider no longer offered",
        "Update the profile's provider to a name from the options endpoint "
        "(`depositd check --online` lists them); submissions with it fail with 10000103.",
    ),
    "deposit_gone": _Text(
        "Deposit no longer known to the provider (10000100)",
        "Check the wallet and the transactionId with provider support; depositd stops acting "
        "on it.",
    ),
    "reload_failed": _Text(
        "Rules or profiles reload refused",
        "Fix the file named in the detail (`depositd check` lists every problem); the rules "
        "and profiles in force before the reload stay in force.",
    ),
    "abnormal_fund": _Text(
        "Abnormal fund: money received that matched no order",
        "It never becomes a deposit by itself: match it to an order or have it returned before "
        "it expires (`depositd abnormal` lists them).",
    ),
    "abnormal_expiring": _Text(
        "Abnormal fund expires within 24 hours",
        "Match it to an order or have it returned now; after expiry the provider decides.",
    ),
    "reconcile_finding": _Text(
        "Ledger and provider report disagree",
        "Check the deposit at the provider (`depositd reconcile --date DAY` lists the findings); "
        "acknowledge it with `depositd reconcile --ack ID --by NAME --note TEXT`.",
    ),
    "reconcile_failed": _Text(
        "Reconciliation run failed",
        "Nothing of the run was recorded; the next run reads the day again. Check the provider "
        "and the log line named in the detail.",
    ),
    "database_unavailable": _Text(
        "Database unavailable: deliveries answered 503",
        "Check the database server and the network to it (the detail names the error). "
        "Deliveries are refused with 503 and retried by the provider; nothing acknowledged is "
        "lost. depositd resumes by itself once the database answers.",
    ),
    "webhook_auth_refused": _Text(
        "Webhook deliveries refused: secret or API key differs from the provider's",
        "Compare webhook.secret and webhook.api_key with the provider's dashboard and correct "
        "the one that differs, then restart serve; until then webhooks are lost and deposits "
        "are only found by the polls, and the provider may disable the endpoint.",
    ),
    "journal_head": _Text(
        "Journal head of the day",
        "Nothing to do but keep this message where the database cannot reach it (this channel's"
        " history, a mailbox): `depositd verify --anchor SEQ:HASH` with the head it names"
        " proves later that the journal up to it is unchanged.",
    ),
    "journal_broken": _Text(
        "Journal does not verify: a record was changed outside depositd",
        "Run `depositd verify` to name the first entry or row that differs, and compare it with"
        " the last backup and the heads published before (the operator's guide says how). Do"
        " not repair the row by hand: the journal shows what it held.",
    ),
    "auth_failure": _Text(
        "Provider authentication failing",
        "Check the API key and secret and the host clock (API-TIMESTAMP); depositd retries "
        "after back-off with the same idempotency key.",
    ),
}

# What depositd does after each wallet code (docs/concepts.md), added to the interface's guidance.
_CODE_FOLLOW_UP = {
    "10000100": "depositd re-read the history queues (init, rejected) and the detail and does "
    "not submit again: if it is gone, check the wallet and transactionId; if it still waits for "
    "details, submit them by hand or ask provider support.",
    "10000101": "Nothing left to do; depositd refreshes the detail.",
    "10000102": "Fix the profile (the field is named above); no retry until the profile changes.",
    "10000103": "Fix the profile (the field is named above); no retry until the profile changes.",
    "10000104": "depositd retries later with back-off and the same payload.",
    "10000105": "depositd reads the original result; no new submission.",
    "10000106": "This is a bug in depositd: report it with the traceId.",
    "10000107": "Check the walletId; create the sub-wallet first.",
}


def _submit_text(code: str) -> _Text:
    rule = WALLET_CODES.get(code)
    if rule is None:
        label = f" ({code})" if code else ""
        return _Text(
            f"Payer details submission failed{label}",
            "Contact provider support with the transactionId and traceId.",
        )
    guidance = f"Provider guidance: {rule.guidance}."
    return _Text(
        f"Submission refused ({code}): {rule.meaning}", f"{guidance} {_CODE_FOLLOW_UP[code]}"
    )


def _text_for(condition: str) -> _Text:
    kind, _, code = condition.partition(":")
    if kind == "submit_failed":
        return _submit_text(code)
    if kind == OVERDUE:
        # A deposit still waiting on a person past its rule set's deadline (docs/rules.md,
        # "Deadlines"): the title of what it waits on, said to be overdue.
        waited_on = _text_for(code)
        return _Text(f"Overdue: {waited_on.title}", waited_on.next_step)
    # "rejected#2" is the second rejection round; "poll_failing:history" names which poll.
    text = _TEXTS.get(condition) or _TEXTS.get(kind.split("#")[0])
    if text is None:
        return _Text(condition.replace("_", " ").capitalize(), None)
    return text


def _amount(value: Any) -> Decimal | None:
    if value is None or isinstance(value, Decimal):
        return value
    if isinstance(value, int | str) and not isinstance(value, bool):
        return Decimal(value)
    raise TypeError(f"amount must be Decimal, int or str, not {type(value).__name__}")


def build_alert(
    condition: str,
    severity: str,
    deposit: Any | None = None,
    *,
    detail: str | None = None,
    profile: str | None = None,
) -> Alert:
    """An `Alert` for a condition, filled from the deposit's identifying fields only."""
    if profile is not None and not isinstance(profile, str):
        raise TypeError("profile must be the profile's NAME, never its contents")
    text = _text_for(condition)
    if detail is None and text.detail_from_deposit:
        detail = getattr(deposit, "fail_message", None)
    wallet_id = getattr(deposit, "wallet_id", None)
    transaction_id = getattr(deposit, "transaction_id", None)
    kind, _, code = condition.partition(":")
    kind = (code if kind == OVERDUE else kind).split("#")[0]
    next_step = _approve_step(kind, transaction_id, profile) or text.next_step
    return Alert(
        condition=condition,
        severity=severity,
        title=text.title,
        transaction_id=transaction_id,
        wallet_id=int(wallet_id) if wallet_id is not None else None,
        wallet_name=getattr(deposit, "wallet_name", None),
        amount=_amount(getattr(deposit, "amount", None)),
        currency=getattr(deposit, "currency", None),
        network=getattr(deposit, "network", None),
        detail=detail,
        next_step=next_step,
        profile=profile,
    )


def _approve_step(kind: str, transaction_id: str | None, profile: str | None) -> str | None:
    """The next step of a deposit waiting for payer details, naming the command for the case
    at hand (docs/operator.md): a stored profile applies (a rule held the deposit for a
    person), none does, or the provider rejected the one sent. None for other conditions."""
    if kind not in ("needs_details", "rejected") or not transaction_id:
        return None
    command = f"`depositd submit {transaction_id} --profile {profile or 'NAME'} --by YOUR_NAME`"
    if kind == "rejected":
        which = f"profile {profile}" if profile else "the payer profile"
        return (
            f"Correct {which} (the detail says what the provider refused) and reload the"
            " service; a rule that submits profiles resubmits a changed one by itself, else"
            f" submit it: {command}. The same payload is never sent twice."
        )
    if profile:
        return (
            f"Stored profile {profile} applies. If a rule held this deposit for a person,"
            f" approve it: {command} (or Submit profile on the console's deposit page). Funds"
            " stay unavailable until then."
        )
    return (
        "No stored profile applies: store a profile for this source address or wallet in the"
        " profiles file, reload the service (`systemctl reload depositd`), then submit it:"
        f" {command}; or fill in the provider's hosted page from the console's deposit page."
        " Funds stay unavailable until then."
    )


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _wallet(alert: Alert) -> str | None:
    if alert.wallet_id is None:
        return alert.wallet_name
    return f"{alert.wallet_id} ({alert.wallet_name})" if alert.wallet_name else str(alert.wallet_id)


def _money(alert: Alert) -> str | None:
    parts = [decimal_str(alert.amount) if alert.amount is not None else None, alert.currency]
    if alert.network:
        parts.append(f"on {alert.network}")
    text = " ".join(p for p in parts if p)
    return text or None


def _facts(alert: Alert) -> list[tuple[str, str]]:
    """The identifying lines of an alert, in reading order, skipping unknowns."""
    rows = [
        ("Wallet", _wallet(alert)),
        ("Amount", _money(alert)),
        ("transactionId", alert.transaction_id),
        ("Profile", alert.profile),
    ]
    return [(label, value) for label, value in rows if value]


def headline(alert: Alert) -> str:
    """Severity and title on one line, e.g. `CRITICAL: Deposit BLOCKED: funds ...`."""
    return _one_line(f"{alert.severity.upper()}: {alert.title}")


def subject(alert: Alert) -> str:
    """E-mail subject: `[depositd] CRITICAL: Deposit BLOCKED 1001 123.45 USDT (tx ...)`."""
    # The title's lead clause keeps the subject short enough for an inbox list.
    parts = [f"[depositd] {alert.severity.upper()}: {alert.title.split(': ')[0]}"]
    if alert.wallet_id is not None:
        parts.append(str(alert.wallet_id))
    elif alert.wallet_name:
        parts.append(alert.wallet_name)
    if alert.amount is not None:
        parts.append(decimal_str(alert.amount))
    if alert.currency:
        parts.append(alert.currency)
    if alert.transaction_id:
        parts.append(f"(tx {alert.transaction_id})")
    elif alert.profile:
        parts.append(f"(profile {alert.profile})")
    return _one_line(" ".join(parts))


def render_text(alert: Alert) -> str:
    """Plain-text rendering (the e-mail body)."""
    lines = [headline(alert), ""]
    facts = _facts(alert)
    width = max((len(label) for label, _ in facts), default=0) + 2
    lines += [f"{label + ':':<{width}}{value}" for label, value in facts]
    if facts:
        lines.append("")
    for label, value in (("Detail", alert.detail), ("Next step", alert.next_step)):
        if value:
            lines += [f"{label}:", _wrap(value), ""]
    lines.append(f"-- depositd (condition {alert.condition}, severity {alert.severity})")
    return "\n".join(lines) + "\n"


def _wrap(text: str) -> str:
    """Indented, wrapped at 76 columns; ids and codes are never split."""
    return textwrap.fill(
        _one_line(text),
        width=76,
        initial_indent="  ",
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def _escape(text: str) -> str:
    """Slack mrkdwn control characters, so provider text cannot inject links or mentions."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_value(label: str, value: str) -> str:
    # Code formatting makes the transactionId one click to copy for a support ticket.
    return f"`{_escape(value)}`" if label == "transactionId" else _escape(value)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def render_slack(alert: Alert) -> dict[str, Any]:
    """Slack incoming-webhook payload: `text` fallback plus header, fields, detail, next step."""
    facts = _facts(alert)
    icon = _SEVERITY_ICON[alert.severity]
    fallback = " | ".join([headline(alert), *(f"{label} {value}" for label, value in facts)])
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {
                "type": "plain_text",
                "text": _clip(f"{icon} {headline(alert)}", _SLACK_HEADER_MAX),
                "emoji": True,
            },
        }
    ]
    if facts:
        blocks.append(
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": f"*{label}*\n{_slack_value(label, value)}"}
                    for label, value in facts
                ],
            }
        )
    for label, value in (("Detail", alert.detail), ("Next step", alert.next_step)):
        if value:
            body = _clip(f"*{label}*\n{_escape(value.strip())}", _SLACK_TEXT_MAX)
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": body}})
    context = f"{icon} depositd | {alert.severity} | condition `{_escape(alert.condition)}`"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    return {"text": _escape(fallback), "blocks": blocks}
