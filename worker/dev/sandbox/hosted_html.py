"""HTML of the hosted deposit Travel Rule page: small functions that return escaped markup.

Every value that comes from the state, the query or the form passes through `h` (html.escape
with quotes) before it meets markup; the functions here take plain values and return markup.
Python's own escaping keeps the sandbox free of a template engine (no new dependency, no
change to the hash locks); the page is a handful of fragments. The element ids and field names
are stable: the console's browser tests and docs/sandbox.md name them.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

import pycountry

from worker.dev.sandbox.records import Order
from worker.provider.jsonio import decimal_str
from worker.provider.payer import (
    OTHERS_MAX,
    WALLET_LABEL_MAX,
    AddressType,
    CorrespondentType,
    WalletType,
)

STATIC = "../static/"  # relative to {hosted}/{lng}/deposit-travel-rule
FORM_ID = "payer-form"
SUBMIT_ID = "submit-button"
CONFIRMATION_ID = "submission-confirmation"
CLOSE_ID = "close-button"


def h(value: object) -> str:
    """`value` as text safe inside an element or a quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def document(lng: str, dark: bool, screen: str, body: str) -> str:
    """The whole page around `body` (markup); `screen` names it for tests and stylesheets."""
    media = "all" if dark else "not all"
    return f"""<!doctype html>
<html lang="{h(lng)}" class="{"dark" if dark else "light"}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Deposit Travel Rule details</title>
<link rel="stylesheet" href="{STATIC}deposit-travel-rule.css">
<link rel="stylesheet" id="dark-stylesheet" href="{STATIC}deposit-travel-rule-dark.css" \
media="{media}">
<script src="{STATIC}deposit-travel-rule.js" defer></script>
</head>
<body data-dark-mode="{"true" if dark else "false"}">
<main id="deposit-travel-rule" data-screen="{h(screen)}">
<h1>Deposit Travel Rule details</h1>
{body}
<p class="actions"><button type="button" id="{CLOSE_ID}" class="secondary">Close</button></p>
</main>
</body>
</html>
"""


def message(element_id: str, title: str, text: str) -> str:
    """A page's only content: a titled message (token refused, deposit not awaiting details)."""
    return (
        f'<section id="{h(element_id)}" role="alert"><h2>{h(title)}</h2><p>{h(text)}</p></section>'
    )


def _deposit_row(o: Order, link_query: str) -> str:
    wls = o.white_list_status.value if o.white_list_status is not None else ""
    label = "details rejected: resubmit" if wls == "rejected" else "details needed"
    tx = h(o.transaction_id)
    query_tx = h(quote(o.transaction_id, safe=""))  # one query value, whatever the id holds
    return (
        f'<tr id="deposit-{tx}" data-transaction-id="{tx}">'
        f"<td>{h(decimal_str(o.amount))} {h(o.currency)}</td><td>{h(o.network)}</td>"
        f'<td class="mono">{h(o.from_address)}</td>'
        f'<td data-white-list-status="{h(wls)}">{h(label)}</td>'
        f'<td><a class="deposit-link" href="?{h(link_query)}&amp;transactionId={query_tx}">'
        "Provide details</a></td></tr>"
    )


def deposit_list(orders: Sequence[Order], link_query: str) -> str:
    """Screen 1: the deposits awaiting details, each a link to its form."""
    if not orders:
        return (
            '<section id="deposit-list" data-count="0">'
            "<p>No deposit is waiting for Travel Rule details.</p></section>"
        )
    rows = "\n".join(_deposit_row(o, link_query) for o in orders)
    return f"""<section id="deposit-list" data-count="{len(orders)}">
<p>These deposits are held until the payer's details are provided.</p>
<table><thead><tr><th>Amount</th><th>Network</th><th>From address</th><th>Status</th><th></th>
</tr></thead>
<tbody>
{rows}
</tbody></table>
</section>"""


def deposit_summary(order: Order) -> str:
    """The deposit the form is about (no payer data: the on-chain facts)."""
    rows = [
        ("Amount", f"{decimal_str(order.amount)} {order.currency}", "amount"),
        ("Network", order.network, "network"),
        ("From address", order.from_address, "from-address"),
        ("Transaction hash", order.transaction_hash, "tx-hash"),
        ("Transaction id", order.transaction_id, "transaction-id"),
    ]
    cells = "\n".join(
        f'<dt>{h(label)}</dt><dd id="deposit-{key}" class="mono">{h(value)}</dd>'
        for label, value, key in rows
    )
    rejected = ""
    if order.white_list_status is not None and order.white_list_status.value == "rejected":
        rejected = (
            f'<p id="rejection" class="warning">The details sent before were rejected: '
            f"{h(order.fail_message or 'no reason given')}. Please correct and send them again.</p>"
        )
    return f'<section id="deposit-summary"><h2>Deposit</h2><dl>{cells}</dl>{rejected}</section>'


@dataclass(frozen=True)
class FormState:
    """What the form shows: entered values, the key of this render, and a refusal if any."""

    token: str
    transaction_id: str
    idempotency_key: str
    dark: bool
    values: Mapping[str, str]
    providers: Sequence[str]
    error_code: str | None = None
    error_message: str | None = None
    error_fields: Sequence[str] = ()


def _options(choices: Iterable[tuple[str, str]], selected: str, blank: str | None) -> str:
    out = [f'<option value="">{h(blank)}</option>'] if blank is not None else []
    for value, label in choices:
        mark = " selected" if value == selected else ""
        out.append(f'<option value="{h(value)}"{mark}>{h(label)}</option>')
    return "".join(out)


def _countries() -> list[tuple[str, str]]:
    return sorted(
        ((c.alpha_2, f"{c.name} ({c.alpha_2})") for c in pycountry.countries),
        key=lambda pair: pair[1],
    )


class _Fields:
    """Renders labelled inputs of one form state (values kept, refused fields marked)."""

    def __init__(self, st: FormState) -> None:
        self.st = st

    def _attrs(self, name: str, required: bool) -> str:
        bad = name in self.st.error_fields
        extra = ' aria-invalid="true" class="invalid"' if bad else ""
        return f'id="field-{name}" name="{name}"{" required" if required else ""}{extra}'

    def text(self, name: str, label: str, *, kind: str = "text", max_len: int = 0) -> str:
        limit = f' maxlength="{max_len}"' if max_len else ""
        value = h(self.st.values.get(name, ""))
        return (
            f'<label for="field-{name}">{h(label)}</label>'
            f'<input type="{kind}" {self._attrs(name, False)} value="{value}"{limit}>'
        )

    def area(self, name: str, label: str) -> str:
        value = h(self.st.values.get(name, ""))
        return (
            f'<label for="field-{name}">{h(label)}</label>'
            f'<textarea {self._attrs(name, False)} rows="2">{value}</textarea>'
        )

    def select(
        self, name: str, label: str, choices: Iterable[tuple[str, str]], blank: str | None
    ) -> str:
        opts = _options(choices, self.st.values.get(name, ""), blank)
        return (
            f'<label for="field-{name}">{h(label)}</label>'
            f"<select {self._attrs(name, False)}>{opts}</select>"
        )


def _enum(enum: Iterable[object]) -> list[tuple[str, str]]:
    return [(str(getattr(m, "value", m)), str(getattr(m, "value", m))) for m in enum]


def form_error(st: FormState) -> str:
    """The refusal of the last submission: code and message, announced to screen readers."""
    if st.error_code is None:
        return ""
    return (
        f'<div id="form-error" role="alert" data-code="{h(st.error_code)}">'
        f'<strong class="code">{h(st.error_code)}</strong> '
        f'<span class="msg">{h(st.error_message)}</span></div>'
    )


def payer_form(st: FormState) -> str:
    """Screen 2's form: every payer field the submit operation knows, grouped by type."""
    f = _Fields(st)
    hidden = "".join(
        f'<input type="hidden" name="{name}" value="{h(value)}">'
        for name, value in (
            ("token", st.token),
            ("transactionId", st.transaction_id),
            ("idempotencyKey", st.idempotency_key),
            ("darkMode", "true" if st.dark else "false"),
        )
    )
    providers = f.select("provider", "Provider", [(p, p) for p in st.providers], "Choose...")
    return f"""<form id="{FORM_ID}" method="post" action="deposit-travel-rule" novalidate>
{hidden}
{form_error(st)}
<fieldset id="group-payer"><legend>Payer</legend>
{f.select("correspondentType", "Payer type", _enum(CorrespondentType), "Choose...")}
{f.select("countryCode", "Country", _countries(), "Choose...")}
</fieldset>
<fieldset id="group-entity" data-correspondent="ENTITY"><legend>Entity</legend>
{f.text("fullName", "Full legal name")}
{f.area("companyAddress", "Company address")}
</fieldset>
<fieldset id="group-individual" data-correspondent="INDIVIDUAL"><legend>Individual</legend>
{f.text("firstName", "First name")}
{f.text("lastName", "Last name")}
{f.text("birthday", "Date of birth (yyyy-MM-dd)", kind="date")}
{f.area("residentialAddress", "Residential address")}
</fieldset>
<fieldset id="group-wallet"><legend>Source wallet</legend>
{f.select("walletType", "Wallet type", _enum(WalletType), "Choose...")}
<div id="group-vasp" data-wallet="VASP">{providers}</div>
<div id="group-others" data-wallet="OTHERS">\
{f.text("othersPleaseSpecify", "Please specify", max_len=OTHERS_MAX)}</div>
{f.text("walletLabel", f"Wallet label (up to {WALLET_LABEL_MAX} characters)", max_len=50)}
{f.select("addressType", "Address type", _enum(AddressType), "Not specified")}
</fieldset>
<p class="actions"><button type="submit" id="{SUBMIT_ID}">Submit details</button></p>
</form>"""


def confirmation(transaction_id: str, white_list_status: str | None) -> str:
    """After a successful submission: under review, not complete."""
    return (
        f'<section id="{CONFIRMATION_ID}" role="status" data-transaction-id="{h(transaction_id)}"'
        f' data-white-list-status="{h(white_list_status)}">'
        "<h2>Details submitted</h2>"
        f'<p>The payer details for deposit <span class="mono">{h(transaction_id)}</span> '
        "were submitted and are pending review. The deposit stays held until the review passes."
        f'</p><p>Status: <strong id="white-list-status">{h(white_list_status)}</strong></p>'
        "</section>"
    )
