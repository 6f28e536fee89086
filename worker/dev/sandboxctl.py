"""`depositd sandbox VERB`: the running sandbox's control calls as commands, each printing what
it did (docs/sandbox.md, "Triggers from the command line").

Each verb is one control call under /_sandbox/ at `provider.base_url` (plain HTTP on loopback,
urllib: the verbs load neither aiohttp nor the sandbox itself). A refused call (unknown deposit,
a step the state does not allow) prints the sandbox's reason and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

# `depositd --help` builds these verbs' parsers: this module imports nothing else at its top.

_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
DEFAULT_FAIL_MESSAGE = "payer details do not match (sandbox)"
DISCREPANCY_KINDS = ("drop", "amount", "extra", "status", "clear")
RECONCILIATION_STATUSES = ("MATCHED", "MISMATCHED", "MANUAL_REVIEW")


class Refused(Exception):
    """The sandbox answered with an error (its reason in the message)."""


class Unreachable(Exception):
    """No sandbox answers at provider.base_url."""


class Call(NamedTuple):
    """One control call: HTTP method (lower case), path under /_sandbox/, JSON body."""

    method: str
    path: str
    body: dict[str, Any] | None = None


# --- the verbs' arguments ------------------------------------------------------------------------


def add_verbs(actions: Any, common: argparse.ArgumentParser) -> None:
    """Every verb as a subcommand of `depositd sandbox` (parsing needs nothing else)."""
    q = actions.add_parser(
        "inject", help="inject an on-chain deposit into the running sandbox", parents=[common]
    )
    q.add_argument("--amount", required=True, metavar="AMOUNT", help="decimal amount, e.g. 125.50")
    q.add_argument("--wallet", type=int, default=1002, metavar="ID", help="walletId (1002)")
    q.add_argument("--currency", default="USDT", help="currency (USDT)")
    q.add_argument("--network", default="TRON", help="network (TRON)")
    q.add_argument(
        "--from",
        dest="from_address",
        metavar="ADDR",
        help="source address (default: a new one the provider does not know)",
    )
    steps = (
        ("approve", "the deposit's review passes (whiteListStatus approved, credited)"),
        ("reject", "the deposit's review rejects it (whiteListStatus rejected)"),
        ("block", "the deposit is BLOCKED (creditStatus; no webhook, detail shows it)"),
        ("release", "a BLOCKED deposit is released and credited"),
        ("fail", "the deposit's order fails (status FAIL)"),
        ("sweep", "the auto-collection sweep of a credited deposit ends (status SUCCESS)"),
    )
    for name, text in steps:
        q = actions.add_parser(name, help=text, parents=[common])
        q.add_argument("transaction_id", metavar="TX", help="the deposit's transactionId")
        if name == "reject":
            q.add_argument(
                "--message",
                default=DEFAULT_FAIL_MESSAGE,
                metavar="TEXT",
                help=f"the failMessage ({DEFAULT_FAIL_MESSAGE!r})",
            )
    for name, text in (
        ("approve-address", "a registered source address becomes ACTIVE"),
        ("reject-address", "a registered source address becomes FAILED"),
    ):
        q = actions.add_parser(name, help=text, parents=[common])
        q.add_argument("address_id", metavar="ID", help="the source address record's id")
        if name == "reject-address":
            q.add_argument(
                "--message", default="document unreadable (sandbox)", metavar="TEXT",
                help="the failMessage",
            )  # fmt: skip
    _abnormal(actions, common)
    _discrepancy(actions, common)
    q = actions.add_parser(
        "drop-webhooks", help="the next N webhooks are never delivered (lost)", parents=[common]
    )
    q.add_argument("count", type=int, metavar="N", help="how many webhooks to lose")


def _abnormal(actions: Any, common: argparse.ArgumentParser) -> None:
    q = actions.add_parser(
        "abnormal", help="money that matches no order arrives (an abnormal fund)", parents=[common]
    )
    q.add_argument("--amount", required=True, metavar="AMOUNT", help="decimal amount")
    q.add_argument("--currency", default="USDT", help="currency (USDT)")
    q.add_argument("--network", default="TRON", help="network (TRON)")
    q.add_argument("--from", dest="from_address", metavar="ADDR", help="source (default: new)")
    q.add_argument("--to", dest="to_address", metavar="ADDR", help="receiving address (new)")
    q.add_argument("--tx-hash", metavar="HASH", help="on-chain hash (default: generated)")
    q.add_argument(
        "--risk", default="LOW", metavar="LEVEL", help="addressRiskStatus, e.g. LOW or HIGH (LOW)"
    )
    q.add_argument("--remark", metavar="TEXT", help="addressRiskRemark")
    q.add_argument(
        "--no-notify",
        action="store_true",
        help="send no ABNORMAL_FUND_NOTIFICATION (found by the abnormal-fund poll only)",
    )


def _discrepancy(actions: Any, common: argparse.ArgumentParser) -> None:
    q = actions.add_parser(
        "discrepancy",
        help="make one day's settlement report disagree with the deposits",
        parents=[common],
    )
    q.add_argument(
        "kind",
        choices=DISCREPANCY_KINDS,
        help="drop: leave the deposit out; amount: report another amount; extra: a record no"
        " deposit backs; status: a reconciliationStatus; clear: remove every discrepancy",
    )
    q.add_argument("--tx", metavar="TX", help="the deposit (drop, amount, status)")
    q.add_argument("--date", metavar="YYYY-MM-DD", help="settlement date (default: today, UTC)")
    q.add_argument("--amount", metavar="AMOUNT", help="the reported amount (amount, extra)")
    q.add_argument("--asset", default="USDT", help="asset of an extra record (USDT)")
    q.add_argument("--network", default="TRON", help="network of an extra record (TRON)")
    q.add_argument("--tx-hash", metavar="HASH", help="txHash of an extra record (generated)")
    q.add_argument(
        "--status",
        choices=RECONCILIATION_STATUSES,
        default="MISMATCHED",
        help="the reconciliationStatus (status; MISMATCHED)",
    )


# --- what each verb calls and prints -------------------------------------------------------------


def _address() -> str:
    import secrets

    return "T" + "".join(secrets.choice(_BASE58) for _ in range(33))


def _order_line(verb: str, order: dict[str, Any]) -> str:
    return (
        f"{verb} deposit {order['transactionId']}: status {order.get('status')}, whiteListStatus"
        f" {order.get('whiteListStatus')}, creditStatus {order.get('creditStatus')}"
    )


def _inject(args: argparse.Namespace) -> tuple[Call, Callable[[Any], str]]:
    source = args.from_address or _address()
    body = {
        "walletId": args.wallet,
        "currency": args.currency,
        "network": args.network,
        "amount": args.amount,
        "fromAddress": source,
    }
    return (
        Call("post", "deposits", body),
        lambda order: (
            f"deposit {order['transactionId']}: {args.amount} {args.currency} ({args.network}) into"
            f" wallet {args.wallet} from {source}"
        ),
    )


def _step(verb: str, done: str) -> Callable[[argparse.Namespace], tuple[Call, Any]]:
    def build(args: argparse.Namespace) -> tuple[Call, Callable[[Any], str]]:
        body = {"failMessage": args.message} if verb == "reject" else None
        call = Call("post", f"deposits/{_segment(args.transaction_id)}/{verb}", body)
        return call, lambda order: _order_line(done, order)

    return build


def _address_step(verb: str) -> Callable[[argparse.Namespace], tuple[Call, Any]]:
    def build(args: argparse.Namespace) -> tuple[Call, Callable[[Any], str]]:
        body = {"failMessage": args.message} if verb == "reject" else None
        call = Call("post", f"addresses/{_segment(args.address_id)}/{verb}", body)
        return (
            call,
            lambda record: (
                f"source address {record['id']} ({record['walletAddress']}, {record['network']}):"
                f" {record['status']}"
            ),
        )

    return build


def _abnormal_call(args: argparse.Namespace) -> tuple[Call, Callable[[Any], str]]:
    body: dict[str, Any] = {
        "amount": args.amount,
        "currency": args.currency,
        "network": args.network,
        "fromAddress": args.from_address or _address(),
        "toAddress": args.to_address or _address(),
        "addressRiskStatus": args.risk,
        "notify": not args.no_notify,
    }
    if args.tx_hash:
        body["txHash"] = args.tx_hash
    if args.remark:
        body["addressRiskRemark"] = args.remark
    sent = "no webhook" if args.no_notify else "ABNORMAL_FUND_NOTIFICATION sent"
    return (
        Call("post", "abnormal-funds", body),
        lambda fund: (
            f"abnormal fund {fund['id']}: {fund['amount']} {fund['currency']} ({fund['network']})"
            f" from {fund['fromAddress']} to {fund['toAddress']}, {fund['status']}, risk"
            f" {fund['addressRiskStatus']}, txHash {fund['txHash']}; {sent}"
        ),
    )


def _discrepancy_call(args: argparse.Namespace) -> tuple[Call, Callable[[Any], str]]:
    if args.kind == "clear":
        call = Call("delete", "settlement/discrepancies")
        return call, lambda _: "settlement reports: every discrepancy removed"
    import datetime as dt

    day = args.date or dt.datetime.now(dt.UTC).date().isoformat()
    body: dict[str, Any] = {"kind": args.kind, "date": day}
    if args.kind != "extra":
        if not args.tx:
            raise Refused(f"discrepancy {args.kind} needs --tx TX (the deposit)")
        body["transactionId"] = args.tx
    if args.kind in ("amount", "extra"):
        if not args.amount:
            raise Refused(f"discrepancy {args.kind} needs --amount AMOUNT")
        body["amount"] = args.amount
    if args.kind == "status":
        body["reconciliationStatus"] = args.status
    if args.kind == "extra":
        body.update(asset=args.asset, network=args.network)
        if args.tx_hash:
            body["txHash"] = args.tx_hash
    says: dict[str, Callable[[dict[str, Any]], str]] = {
        "drop": lambda c: f"deposit {c['transactionId']} left out",
        "amount": lambda c: f"deposit {c['transactionId']} reported as {c['amount']}",
        "extra": lambda c: (
            f"extra record {c['amount']} {c['asset']} ({c['network']}), txHash {c['txHash']}"
        ),
        "status": lambda c: f"deposit {c['transactionId']} {c['reconciliationStatus']}",
    }
    what = says[args.kind]
    call = Call("post", "settlement/discrepancies", body)
    return call, lambda change: f"settlement report of {change['date']}: {what(change)}"


def _drop(args: argparse.Namespace) -> tuple[Call, Callable[[Any], str]]:
    if args.count < 0:
        raise Refused("N must not be negative")
    return (
        Call("post", "webhooks/drop", {"count": args.count}),
        lambda answer: (
            f"the next {args.count} webhook(s) will not be delivered"
            f" ({answer['dropsOwed']} still to drop)"
        ),
    )


# verb -> what it calls and how it says what it did. One line per verb.
VERBS: dict[str, Callable[[argparse.Namespace], tuple[Call, Callable[[Any], str]]]] = {
    "inject": _inject,
    "approve": _step("approve", "approved"),
    "reject": _step("reject", "rejected"),
    "block": _step("block", "blocked"),
    "release": _step("release", "released"),
    "fail": _step("fail", "failed"),
    "sweep": _step("sweep", "swept"),
    "approve-address": _address_step("approve"),
    "reject-address": _address_step("reject"),
    "abnormal": _abnormal_call,
    "discrepancy": _discrepancy_call,
    "drop-webhooks": _drop,
}


def _segment(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


def control(base_url: str, call: Call) -> Any:
    """Make one control call; its JSON answer, `Refused` with the sandbox's reason, or
    `Unreachable`."""
    import urllib.error
    import urllib.request

    data = None if call.body is None else json.dumps(call.body).encode()
    request = urllib.request.Request(
        f"{base_url.rstrip('/')}/_sandbox/{call.path}",
        data=data,
        headers={"Content-Type": "application/json"} if data is not None else {},
        method=call.method.upper(),
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            reason = json.loads(exc.read() or b"{}").get("error") or exc.reason
        except ValueError:
            reason = exc.reason
        raise Refused(str(reason)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(str(getattr(exc, "reason", exc))) from None


def run(args: argparse.Namespace) -> int:
    """Run one verb against the sandbox at provider.base_url; print what it did."""
    from worker.config.settings import load_settings

    settings = load_settings(args.config)
    verb = args.sandbox_command
    try:
        call, say = VERBS[verb](args)
        answer = control(settings.provider.base_url, call)
    except Refused as exc:
        print(f"depositd: the sandbox refused {verb}: {exc}", file=sys.stderr)
        return 1
    except Unreachable as exc:
        print(
            f"depositd: no sandbox at {settings.provider.base_url} ({exc}); start it with"
            f" `depositd sandbox --config {settings.config_path}`",
            file=sys.stderr,
        )
        return 1
    print(say(answer))
    return 0
