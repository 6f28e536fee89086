"""Record triggers (abnormal_fund, abnormal_expiring, reconcile_finding, order_updated): only the
"*" rule set sees them, their conditions are the record's own fields, a mistake fails with file
and line."""

from __future__ import annotations

import textwrap
from decimal import Decimal
from pathlib import Path

import pytest

from worker.act.kinds import SPECS
from worker.errors import ConfigError
from worker.rules import RecordView, RuleBook


def load(tmp_path: Path, text: str, name: str = "r.yaml") -> RuleBook:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return RuleBook.load(path, specs=SPECS)


def problems(tmp_path: Path, text: str, name: str = "r.yaml") -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, name)
    return info.value.problems


def test_a_typo_in_a_record_condition_fails_with_file_and_line(tmp_path: Path) -> None:
    """`stauts` on abnormal_fund is an unknown condition named with file, line and a hint."""
    found = problems(
        tmp_path,
        """
        wallet: "*"
        rules:
          - name: abnormal
            "on": [abnormal_fund]
            if: {stauts: UNMATCHED}
            then: [alert]
        """,
    )
    assert found[0].startswith(f"{tmp_path}/r.yaml:5: rules[0].if.stauts: unknown condition")
    assert "did you mean 'status'?" in found[0]


def test_a_deposit_condition_on_a_record_trigger_and_a_record_field_on_a_deposit_fail(
    tmp_path: Path,
) -> None:
    """fromAddress is no field of a finding, kind is no field of a deposit: both refused."""
    found = problems(
        tmp_path,
        """
        wallet: "*"
        rules:
          - name: finding
            "on": [reconcile_finding]
            if: {fromAddress: TAbc}
            then: [alert]
          - name: deposit
            "on": [credited]
            if: {kind: missing_in_ledger}
            then: [book]
        """,
    )
    assert any(":5: rules[0].if.fromAddress: unknown condition" in p for p in found), found
    assert any(":9: rules[1].if.kind: unknown condition" in p for p in found), found


def test_a_record_trigger_in_a_wallet_rule_set_fails(tmp_path: Path) -> None:
    """A wallet's own rule set never sees a record trigger: naming one is a mistake."""
    found = problems(
        tmp_path,
        """
        wallet: 1001
        rules:
          - {name: abnormal, "on": [abnormal_fund], then: [alert]}
        """,
    )
    assert found[0].startswith(f"{tmp_path}/r.yaml:3:")
    assert "belongs to no wallet" in found[0]


def test_a_record_trigger_can_only_alert_or_ignore(tmp_path: Path) -> None:
    """submit_profile or forward on a record trigger is refused (it is no deposit)."""
    found = problems(
        tmp_path,
        """
        wallet: "*"
        rules:
          - {name: abnormal, "on": [abnormal_fund], then: [submit_profile]}
        """,
    )
    assert "cannot act on a record" in found[0]


def test_record_conditions_select_the_rule() -> None:
    """The shipped default rules: a risky address is critical, another a warning, once each."""
    rules = RuleBook.load(
        Path(__file__).resolve().parents[2] / "rules" / "default.yaml", specs=SPECS
    )
    risky = RecordView({"status": "UNMATCHED", "addressRiskStatus": "high", "amount": "5"})
    plain = RecordView({"status": "UNMATCHED", "addressRiskStatus": "LOW", "amount": "5"})
    finding = RecordView({"kind": "missing_in_ledger", "amount": Decimal("1")})
    assert [
        (i.action, i.params.get("severity")) for i in rules.evaluate_record(risky, "abnormal_fund")
    ] == [
        ("alert", "critical"),
        ("ignore", None),
    ]
    assert [i.params["severity"] for i in rules.evaluate_record(plain, "abnormal_fund")] == [
        "warning"
    ]
    assert len(rules.evaluate_record(finding, "reconcile_finding")) == 1


def test_amount_and_kind_conditions_on_a_finding(tmp_path: Path) -> None:
    """kind and amount conditions compare the finding's own fields (exact decimals)."""
    rules = load(
        tmp_path,
        """
        wallet: "*"
        rules:
          - name: big missing money
            "on": [reconcile_finding]
            if: {kind: [missing_in_ledger], amount: {gte: "1000"}}
            then: [{alert: {severity: critical}}]
        """,
    )
    hit = RecordView({"kind": "missing_in_ledger", "amount": "1000.00"})
    small = RecordView({"kind": "missing_in_ledger", "amount": "999.999999"})
    other = RecordView({"kind": "amount_differs", "amount": "5000"})
    assert len(rules.evaluate_record(hit, "reconcile_finding")) == 1
    assert rules.evaluate_record(small, "reconcile_finding") == []
    assert rules.evaluate_record(other, "reconcile_finding") == []


def test_only_an_order_rule_may_forward_its_record(tmp_path: Path) -> None:
    """forward is accepted on order_updated (the body is the order) and refused on another
    record trigger; order_updated beside a deposit trigger is refused with file and line."""
    forward = "{forward: {url: 'https://books.example/o', secret_env: BOOKS_SECRET}}"
    book = load(
        tmp_path,
        f"""
        wallet: "*"
        rules:
          - {{name: orders, "on": [order_updated], if: {{orderStatus: success}}, then: [{forward}]}}
        """,
    )
    [rule] = book.rulesets[0].rules
    assert [a.name for a in rule.actions] == ["forward"]
    assert book.evaluate_record(RecordView({"orderStatus": "success"}), "order_updated")
    assert not book.evaluate_record(RecordView({"orderStatus": "processing"}), "order_updated")
    found = problems(
        tmp_path,
        f"""
        wallet: "*"
        rules:
          - {{name: abnormal, "on": [abnormal_fund], then: [{forward}]}}
          - {{name: mixed, "on": [order_updated, credited], then: [alert]}}
        """,
    )
    assert any(":3:" in p and "forward cannot act on a record" in p for p in found), found
    assert any(":4:" in p and "give it a rule of its own" in p for p in found), found
