"""The rule engine's edges: each condition reads its own field (a deposit's or a record's),
the reasons `rules test` prints, which rule set a record sees, `ignore` on records, the
eventType gate, and rule sets the book refuses."""

from __future__ import annotations

import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from worker.act.kinds import SPECS
from worker.rules import RecordView, RuleBook
from worker.rules.engine import failing_record_condition
from worker.rules.model import Action, Conditions, Rule, RuleSet
from worker.track.tracker import Deposit, Fact, observe


def load(folder: Path, *files: tuple[str, str]) -> RuleBook:
    for name, text in files:
        (folder / name).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return RuleBook.load(folder, profile_names={"acme"}, specs=SPECS)


def deposit(**changes: Any) -> Deposit:
    """A deposit as the tracker builds it from one webhook-like fact."""
    fields: dict[str, Any] = {
        "transaction_id": "tx-1",
        "source": "webhook",
        "observed_at": 1_700_000_000_000,
        "wallet_id": 1001,
        "wallet_name": "Main",
        "currency": "USDT",
        "network": "TRON",
        "amount": Decimal("100.5"),
        "from_address": "TAbcDef",
    }
    fields.update(changes)
    return observe(None, Fact(**fields))[0]


def one_rule(tmp_path: Path, cond: str, on: str = "needs_details") -> RuleBook:
    text = f'wallet: "*"\nrules:\n  - name: r\n    "on": [{on}]\n    if: {cond}\n'
    return load(tmp_path, ("r.yaml", text + "    then: [{alert: {severity: info}}]\n"))


def reason(rules: RuleBook, dep: Deposit, *, profile_found: bool = False) -> str | None:
    [verdict] = rules.explain(dep, "needs_details", profile_found=profile_found)
    return verdict.reason


# --- deposit conditions: what `rules test` says when a rule does not fire ------------------


@pytest.mark.parametrize(
    ("cond", "dep", "expected"),
    [
        ("{currency: USDT}", {"currency": "usdt"}, None),
        ("{currency: USDT}", {"currency": None}, "currency unknown is not one of USDT"),
        ("{currency: [usdc, eurc]}", {}, "currency USDT is not one of EURC, USDC"),
        ("{network: TRON}", {"network": "tron"}, None),
        ("{network: TRON}", {"network": None}, "network unknown is not one of TRON"),
        ("{network: [eth, bsc]}", {}, "network TRON is not one of BSC, ETH"),
        ('{amount: {gte: "1"}}', {"amount": None}, "amount is unknown, so not gte 1"),
        ('{amount: {gt: "1", lt: "100"}}', {}, "amount 100.5 is not lt 100"),
        (
            "{fromAddress: [TOne, TTwo]}",
            {"from_address": None},
            "fromAddress unknown is not one of the rule's 2 address(es)",
        ),
        (
            "{walletName: [Savings, Other]}",
            {},
            "walletName 'Main' is not one of 'Other', 'Savings'",
        ),
        (
            "{walletName: Savings}",
            {"wallet_name": None},
            "walletName unknown is not one of 'Savings'",
        ),
    ],
)
def test_a_deposit_condition_reads_its_own_field_and_says_why_not(
    tmp_path: Path, cond: str, dep: dict[str, Any], expected: str | None
) -> None:
    """Currency and network compare whatever their case; every failing condition names the
    deposit's value (or `unknown`) and what the rule wanted, and then no intent is made."""
    rules = one_rule(tmp_path, cond)
    dep_ = deposit(**dep)
    assert reason(rules, dep_) == expected
    intents = rules.evaluate(dep_, "needs_details", profile_found=False)
    assert [i.rule for i in intents] == ([] if expected else ["r"])


def test_profile_missing_fails_when_a_profile_applies(tmp_path: Path) -> None:
    """`profile: missing` does not fire once a stored profile applies, and says so."""
    rules = one_rule(tmp_path, "{profile: missing}")
    assert reason(rules, deposit(), profile_found=True) == (
        "profile: a stored profile applies (rule needs missing)"
    )
    assert rules.evaluate(deposit(), "needs_details", profile_found=True) == []
    assert reason(rules, deposit(), profile_found=False) is None


def test_a_rule_on_other_triggers_lists_them_in_order(tmp_path: Path) -> None:
    """The reason for a rule on other triggers lists them alphabetically."""
    rules = one_rule(tmp_path, "{}", on="credited, completed")
    assert reason(rules, deposit()) == "not on needs_details (on: completed, credited)"


def test_an_unmatched_ignore_rule_does_not_stop_later_rules(tmp_path: Path) -> None:
    """Only an `ignore` rule that matched ends the evaluation: one whose conditions fail lets
    the next rule run, and `rules test` evaluates it."""
    rules = load(
        tmp_path,
        (
            "r.yaml",
            """
            wallet: "*"
            rules:
              - {name: usdc dust, "on": [credited], if: {currency: USDC}, then: [ignore]}
              - {name: note, "on": [credited], then: [{alert: {severity: info}}]}
              - {name: book, "on": [credited], then: [book]}
            """,
        ),
    )
    dep = deposit()
    assert [i.rule for i in rules.evaluate(dep, "credited", profile_found=False)] == [
        "note",
        "book",
    ]
    verdicts = rules.explain(dep, "credited", profile_found=False)
    assert [(v.rule, v.matched, v.reason) for v in verdicts] == [
        ("usdc dust", False, "currency USDT is not one of USDC"),
        ("note", True, None),
        ("book", True, None),
    ]


def test_explain_without_a_rule_set_is_empty(tmp_path: Path) -> None:
    """A wallet no set applies to: `rules test` has no verdict to show."""
    rules = load(
        tmp_path, ("w.yaml", "wallet: 7\nrules:\n  - {name: b, on: [credited], then: [book]}\n")
    )
    assert rules.explain(deposit(wallet_id=8), "credited", profile_found=False) == []
    assert [
        v.rule for v in rules.explain(deposit(wallet_id=7), "credited", profile_found=False)
    ] == ["b"]


# --- record conditions -----------------------------------------------------------------------

# (condition, trigger, record field): each record condition a rule may name.
RECORD_FIELDS = [
    ("currency", "abnormal_fund", "currency"),
    ("network", "abnormal_fund", "network"),
    ("status", "abnormal_fund", "status"),
    ("addressRiskStatus", "abnormal_fund", "addressRiskStatus"),
    ("orderStatus", "order_updated", "orderStatus"),
    ("businessType", "order_updated", "businessType"),
    ("kind", "reconcile_finding", "kind"),
]


@pytest.mark.parametrize(("cond", "trigger", "field"), RECORD_FIELDS)
def test_a_record_condition_reads_its_own_field(
    tmp_path: Path, cond: str, trigger: str, field: str
) -> None:
    """A rule on `cond: [WANTED]` fires for a record whose own field is that value (any case)
    and for no other value; the reason names the field, the record's value and the wanted."""
    rules = one_rule(tmp_path, f"{{{cond}: [wanted, other]}}", on=trigger)
    [rule] = rules.rulesets[0].rules
    hit = RecordView({field: "Wanted"})
    miss = RecordView({field: "else"})
    assert [i.rule for i in rules.evaluate_record(hit, trigger)] == ["r"]
    assert rules.evaluate_record(miss, trigger) == []
    assert rules.evaluate_record(RecordView({}), trigger) == []
    assert failing_record_condition(rule, hit, trigger) is None
    assert failing_record_condition(rule, miss, trigger) == (
        f"{cond} else is not one of OTHER, WANTED"
    )
    assert failing_record_condition(rule, RecordView({}), trigger) == (
        f"{cond} unknown is not one of OTHER, WANTED"
    )


def test_a_record_amount_that_is_unknown_or_out_of_bounds_says_so(tmp_path: Path) -> None:
    """The amount condition on a record: unknown, or which bound it misses."""
    rules = one_rule(tmp_path, '{amount: {gte: "10", lt: "100"}}', on="reconcile_finding")
    [rule] = rules.rulesets[0].rules
    trigger = "reconcile_finding"
    assert failing_record_condition(rule, RecordView({}), trigger) == (
        "amount is unknown, so not gte 10"
    )
    assert failing_record_condition(rule, RecordView({"amount": "100"}), trigger) == (
        "amount 100 is not lt 100"
    )
    assert failing_record_condition(rule, RecordView({"amount": "99.99"}), trigger) is None
    assert failing_record_condition(rule, RecordView({"amount": "1"}), "abnormal_fund") == (
        "not on abnormal_fund (on: reconcile_finding)"
    )


def test_record_rules_come_from_the_every_wallet_set_and_stop_at_ignore(tmp_path: Path) -> None:
    """A record trigger runs the "*" set's rules in file order, each intent naming its set,
    version, rule and trigger; a matched `ignore` ends it; without a "*" set nothing runs."""
    rules = load(
        tmp_path,
        (
            "a.yaml",
            """
            wallet: "*"
            rules:
              - {name: first, "on": [abnormal_fund], then: [{alert: {severity: warning}}]}
              - {name: quiet, "on": [abnormal_fund], if: {status: IGNORED}, then: [ignore]}
              - {name: last, "on": [abnormal_fund], then: [{alert: {severity: critical}}]}
            """,
        ),
        ("b.yaml", "wallet: 1001\nrules:\n  - {name: w, on: [credited], then: [book]}\n"),
    )
    version = next(rs.version for rs in rules.rulesets if rs.name == "a.yaml")
    found = rules.evaluate_record(RecordView({"status": "UNMATCHED"}), "abnormal_fund")
    assert [(i.rule_set, i.version, i.rule, i.trigger, i.action) for i in found] == [
        ("a.yaml", version, "first", "abnormal_fund", "alert"),
        ("a.yaml", version, "last", "abnormal_fund", "alert"),
    ]
    assert [i.params["severity"] for i in found] == ["warning", "critical"]
    quiet = rules.evaluate_record(RecordView({"status": "ignored"}), "abnormal_fund")
    assert [(i.rule, i.action) for i in quiet] == [("first", "alert"), ("quiet", "ignore")]
    (tmp_path / "a.yaml").unlink()
    only_wallet = RuleBook.load(tmp_path, specs=SPECS)
    assert only_wallet.evaluate_record(RecordView({"status": "UNMATCHED"}), "abnormal_fund") == []


# --- the book itself -------------------------------------------------------------------------


def test_names_says_which_event_types_a_rule_reacts_to(tmp_path: Path) -> None:
    """The gate of raw eventType rules: only an eventType some rule of some set names is acted
    on (so a stored event of another type records no action)."""
    rules = load(
        tmp_path,
        ("a.yaml", "wallet: '*'\nrules:\n  - {name: a, on: [credited], then: [book]}\n"),
        (
            "b.yaml",
            "wallet: 1001\nrules:\n"
            "  - {name: b, on: [DEPOSIT_ORDER_NOTIFICATION, completed], then: [alert]}\n",
        ),
    )
    assert rules.names("DEPOSIT_ORDER_NOTIFICATION")
    assert rules.names("credited")
    assert rules.names("completed")
    assert not rules.names("DEPOSIT_RISK_NOTIFICATION")
    assert not RuleBook.empty().names("credited")


def _set(name: str, wallet: int | str) -> RuleSet:
    rule = Rule("r", frozenset({"credited"}), Conditions(), (Action("book"),))
    return RuleSet(name, Path(name), f"v-{name}", wallet, (rule,))


def test_the_book_refuses_two_sets_for_one_wallet() -> None:
    """Two sets for one walletId, walletName or "*" are refused by name; distinct keys load."""
    with pytest.raises(ValueError, match=r"^two rule sets for every wallet \('\*'\)$"):
        RuleBook([_set("a", "*"), _set("b", "*")])
    with pytest.raises(ValueError, match=r"^two rule sets for wallet 1001$"):
        RuleBook([_set("a", 1001), _set("b", 1001)])
    with pytest.raises(ValueError, match=r"^two rule sets for wallet 'Main'$"):
        RuleBook([_set("a", "Main"), _set("b", "Main")])
    book = RuleBook([_set("a", 1001), _set("b", 1002), _set("c", "Main"), _set("d", "Spare")])
    book = RuleBook([*book.rulesets, _set("e", "*")])
    assert book.ruleset_for(1002, "Main").name == "b"  # type: ignore[union-attr]
    assert book.ruleset_for(None, "Spare").name == "d"  # type: ignore[union-attr]
    assert book.ruleset_for(3, None).name == "e"  # type: ignore[union-attr]
    assert repr(book) == "RuleBook(a@v-a, b@v-b, c@v-c, d@v-d, e@v-e)"


def test_the_book_version_changes_with_any_set() -> None:
    """The book's version is a short hex hash: the same sets give the same one, a changed
    version or name of any set another."""
    one = RuleBook([_set("a", 1), _set("b", 2)])
    assert len(one.version) == 12
    int(one.version, 16)
    assert RuleBook([_set("a", 1), _set("b", 2)]).version == one.version
    assert RuleBook([_set("a", 1), _set("c", 2)]).version != one.version
    assert RuleBook([_set("a", 1)]).version != one.version


def test_explain_after_ignore_names_every_later_rule_and_its_actions(tmp_path: Path) -> None:
    """`rules test` on a deposit of a walletName set: after a matched `ignore`, each later rule
    is listed by name with its actions, as not evaluated."""
    rules = load(
        tmp_path,
        (
            "main.yaml",
            """
            wallet: Main
            rules:
              - {name: stop, "on": [credited], then: [ignore]}
              - {name: book, "on": [credited], then: [book]}
              - {name: tell, "on": [credited], then: [{alert: {severity: info}}]}
            """,
        ),
        ("any.yaml", "wallet: '*'\nrules:\n  - {name: other, on: [credited], then: [book]}\n"),
    )
    verdicts = rules.explain(deposit(wallet_id=5), "credited", profile_found=False)
    assert [(v.rule, v.matched, v.reason) for v in verdicts] == [
        ("stop", True, None),
        ("book", False, "not evaluated: rule 'stop' ran ignore"),
        ("tell", False, "not evaluated: rule 'stop' ran ignore"),
    ]
    assert [[a.name for a in v.actions] for v in verdicts] == [["ignore"], ["book"], ["alert"]]
