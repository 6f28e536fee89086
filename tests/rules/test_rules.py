"""Rule sets: loading with file:line problems, pure evaluation, explain, and `rules test`."""

from __future__ import annotations

import json
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
import yaml

from worker.act.kinds import SPECS
from worker.commands.cli import build_parser, main
from worker.commands.rules import run as rules_test
from worker.config.profiles import Profiles
from worker.errors import ConfigError
from worker.provider.models import WebhookEnvelope
from worker.rules import TRIGGERS, RuleBook
from worker.store.sqlitestore import connect, migrate
from worker.track.facts import fact_from_event
from worker.track.processor import apply_fact
from worker.track.tracker import Deposit, Fact, Trigger, observe

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "rules"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def problems(path: Path, profile_names: set[str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        RuleBook.load(path, profile_names=profile_names, specs=SPECS)
    return info.value.problems


def book(folder: Path, *files: tuple[str, str]) -> RuleBook:
    for name, text in files:
        write(folder, name, text)
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


# --- loading: every kind of mistake, with file and line ------------------------------------

MISTAKES = [
    (
        "unknown trigger",
        """
        wallet: 1001
        rules:
          - name: book
            on: [credtied]
            then: [book]
        """,
        "w.yaml:4: rules[0].on: unknown trigger 'credtied' (known: needs_details,",
    ),
    (
        "unknown condition",
        """
        wallet: 1001
        rules:
          - name: r
            on: [credited]
            if:
              curency: USDT
            then: [book]
        """,
        "w.yaml:6: rules[0].if.curency: unknown condition 'curency'",
    ),
    (
        "unknown operator",
        """
        wallet: 1001
        rules:
          - name: r
            on: [credited]
            if:
              amount: {lteq: "5"}
            then: [book]
        """,
        "w.yaml:6: rules[0].if.amount.lteq: unknown operator 'lteq' (known: lt, lte, gt, gte, eq)",
    ),
    (
        "unknown action",
        """
        wallet: 1001
        rules:
          - name: r
            on: [credited]
            then:
              - book
              - bok
        """,
        "w.yaml:7: rules[0].then[1]: unknown action 'bok'",
    ),
    (
        "unknown alert key",
        """
        wallet: 1001
        rules:
          - name: r
            on: [blocked]
            then:
              - alert:
                  severity: critical
                  chanels: [slack]
        """,
        "w.yaml:8: rules[0].then[0].alert.chanels: unknown key 'chanels'",
    ),
    (
        "unknown forward key",
        """
        wallet: 1001
        rules:
          - name: r
            on: [credited]
            then:
              - forward: {url: "https://x.example/h", secret: abc}
        """,
        "w.yaml:6: rules[0].then[0].forward.secret: unknown key 'secret'",
    ),
    (
        "unsigned forward",
        """
        wallet: 1001
        rules:
          - name: r
            on: [credited]
            then:
              - forward: {url: "https://x.example/h"}
        """,
        "w.yaml:6: rules[0].then[0].forward: forward needs secret_env or secret_file (the POST"
        " is signed)",
    ),
    (
        "unknown severity",
        """
        wallet: 1001
        rules:
          - name: r
            on: [blocked]
            then:
              - alert: {severity: urgent}
        """,
        "w.yaml:6: rules[0].then[0].alert.severity: unknown severity 'urgent'",
    ),
    (
        "unknown channel",
        """
        wallet: 1001
        rules:
          - name: r
            on: [blocked]
            then:
              - alert:
                  channels: [slack, sms]
        """,
        "w.yaml:7: rules[0].then[0].alert.channels: unknown channel 'sms' (known: slack, email)",
    ),
    (
        "unknown profile",
        """
        wallet: 1001
        rules:
          - name: r
            on: [needs_details]
            then:
              - submit_profile: {profile: ghost}
        """,
        "w.yaml:6: rules[0].then[0].submit_profile.profile: unknown profile 'ghost' (known: acme)",
    ),
    (
        "not a mapping",
        """
        - wallet: 1001
        """,
        "w.yaml:1: a rule set must be a YAML mapping with wallet: and rules: (found a list)",
    ),
    (
        "float amount",
        """
        wallet: 1001
        rules:
          - name: r
            on: [credited]
            if:
              amount: {lte: 50000.5}
            then: [book]
        """,
        "w.yaml:6: rules[0].if.amount.lte: 50000.5 is a YAML float, which is inexact; write the "
        'amount as a quoted decimal string, e.g. "50000.5"',
    ),
    (
        "bad decimal",
        """
        wallet: 1001
        rules:
          - name: r
            on: [credited]
            if:
              amount: {gt: "5O"}
            then: [book]
        """,
        "w.yaml:6: rules[0].if.amount.gt: '5O' is not a decimal number",
    ),
    (
        "action after ignore",
        """
        wallet: 1001
        rules:
          - name: r
            on: [credited]
            then: [ignore, book]
        """,
        "w.yaml:5: rules[0].then[1]: an action after ignore never runs; put ignore last",
    ),
    (
        "key given twice",
        """
        wallet: 1001
        rules:
          - name: r
            on: [credited]
            on: [blocked]
            then: [book]
        """,
        "w.yaml:5: key 'on' is given twice (first at line 4)",
    ),
    (
        "missing wallet",
        """
        rules: []
        """,
        'w.yaml:1: (top level): wallet: is missing (a walletId, a walletName, or "*")',
    ),
    (
        "bad profile condition",
        """
        wallet: 1001
        rules:
          - name: r
            on: [needs_details]
            if: {profile: maybe}
            then: [submit_profile]
        """,
        "w.yaml:5: rules[0].if.profile: must be found or missing, not 'maybe'",
    ),
    (
        "invalid YAML",
        """
        wallet: 1001
        rules:
          - name: [unclosed
        """,
        "w.yaml:4: invalid YAML",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES]
)
def test_mistake_is_reported_with_file_and_line(tmp_path: Path, text: str, expected: str) -> None:
    """Each kind of mistake names the file, the line, the key and what is wrong."""
    path = write(tmp_path, "w.yaml", text)
    found = problems(path, {"acme"})
    assert any(p.startswith(f"{tmp_path}/{expected}") for p in found), found


def test_suggestion_for_a_typo(tmp_path: Path) -> None:
    """An unknown trigger close to a known one suggests it."""
    path = write(
        tmp_path, "w.yaml", "wallet: 1\nrules:\n  - {name: r, on: [credtied], then: [book]}\n"
    )
    assert problems(path)[0].endswith("did you mean 'credited'?")


def test_wallet_defined_twice_names_both_files(tmp_path: Path) -> None:
    """Two files for one wallet are refused, pointing at both."""
    write(tmp_path, "a.yaml", "wallet: 1001\nrules: []\n")
    write(tmp_path, "b.yaml", "# second\nwallet: 1001\nrules: []\n")
    assert problems(tmp_path) == [
        f"{tmp_path}/b.yaml:2: wallet: wallet 1001 already has a rule set in {tmp_path}/a.yaml:1"
    ]


def test_every_problem_of_every_file_at_once(tmp_path: Path) -> None:
    """Problems are collected across files and rules before anything is raised."""
    write(
        tmp_path,
        "a.yaml",
        """
        wallet: "*"
        rules:
          - {name: one, on: [nope], then: [book]}
          - {name: two, on: [credited], then: [boom]}
        """,
    )
    write(tmp_path, "b.yaml", "wallet: '*'\nrules:\n  - {name: x, on: [credited], then: [book]}\n")
    write(tmp_path, "c.yaml", "wallet: 7\nrules:\n  - {name: y, on: [credited], tehn: [book]}\n")
    found = problems(tmp_path)
    assert [p.split(": ")[0] for p in found] == [
        f"{tmp_path}/a.yaml:3",
        f"{tmp_path}/a.yaml:4",
        f"{tmp_path}/b.yaml:1",
        f"{tmp_path}/c.yaml:3",
        f"{tmp_path}/c.yaml:3",
    ]
    assert "unknown key 'tehn'" in found[3]
    assert "rules[0].then: is missing" in found[4]


def test_folder_skips_examples_subfolders_and_the_profiles_file(tmp_path: Path) -> None:
    """A folder loads its *.yaml only: not *.example.yaml, sub-folders, or a profiles file."""
    write(tmp_path, "default.yaml", "wallet: '*'\nrules: []\n")
    write(tmp_path, "w.example.yaml", "not: a rule set\n")
    write(tmp_path, "examples/x.yaml", "- broken\n")
    write(tmp_path, "profiles.yaml", "profiles: {}\naddresses: {}\n")
    loaded = RuleBook.load(tmp_path, specs=SPECS)
    assert [rs.name for rs in loaded.rulesets] == ["default.yaml"]


def test_missing_rules_path(tmp_path: Path) -> None:
    """A rules path that does not exist is a problem naming it."""
    assert problems(tmp_path / "nope") == [f"{tmp_path}/nope: rules path does not exist"]


def test_version_is_a_hash_of_the_file(tmp_path: Path) -> None:
    """The version is 12 hex chars of sha256 and changes when the file changes."""
    path = write(tmp_path, "w.yaml", "wallet: 1\nrules: []\n")
    first = RuleBook.load(path, specs=SPECS).rulesets[0].version
    assert first == RuleBook.load(path, specs=SPECS).rulesets[0].version
    assert len(first) == 12 and int(first, 16) >= 0
    path.write_text("wallet: 1\nrules: []\n# edited\n")
    assert RuleBook.load(path, specs=SPECS).rulesets[0].version != first


@pytest.mark.parametrize("other", ["On", "ON", "yes", "true"])
@pytest.mark.parametrize("other_first", [False, True], ids=["on-first", "on-second"])
def test_key_yaml_reads_as_true_next_to_on_is_an_unknown_key(
    tmp_path: Path, other: str, other_first: bool
) -> None:
    """`On:`/`yes:`/`true:` beside `on:` is an unknown key at its line, not a silent override."""
    keys = [f"{other}: [blocked]", "on: [credited]"]
    if not other_first:
        keys.reverse()
    lines = [
        "wallet: 1",
        "rules:",
        "  - name: r",
        *(f"    {key}" for key in keys),
        "    then: [book]",
    ]
    path = write(tmp_path, "w.yaml", "\n".join(lines) + "\n")
    line = 4 if other_first else 5
    hint = "; did you mean 'on'?" if other.lower() == "on" else ""
    assert problems(path) == [
        f"{path}:{line}: rules[0].{other}: unknown key {other!r} (known: name, on, if, then){hint}"
    ]


def test_description_may_look_like_a_date(tmp_path: Path) -> None:
    """`description:` is free text, also when it looks like a date that does not exist."""
    path = write(tmp_path, "w.yaml", "wallet: 1\ndescription: 2024-13-45\nrules: []\n")
    assert [rs.wallet for rs in RuleBook.load(path, specs=SPECS).rulesets] == [1]


def test_value_yaml_cannot_build_is_a_problem_in_every_file(tmp_path: Path) -> None:
    """Values YAML parses but cannot build are problems with file, line and key, all at once."""
    write(tmp_path, "a.yaml", "wallet: !!int main\nrules: []\n")
    huge = "1" + ":0" * 200 + ".5"  # a base-60 float too large for a float: OverflowError
    text = """
        wallet: 2
        rules:
          - name: r
            on: [credited]
            if:
              amount: {lte: !!float lots, gt: HUGE}
            then: [book]
        """
    write(tmp_path, "b.yaml", text.replace("HUGE", huge))
    assert problems(tmp_path) == [
        f"{tmp_path}/a.yaml:1: wallet: invalid YAML: the value cannot be read as an integer",
        f"{tmp_path}/b.yaml:6: rules[0].if.amount.lte: invalid YAML: the value cannot be read as"
        " a number",
        f"{tmp_path}/b.yaml:6: rules[0].if.amount.gt: invalid YAML: the value cannot be read as"
        " a number",
    ]


def test_trigger_names_match_the_tracker() -> None:
    """The rule triggers are exactly the tracker's Trigger values."""
    assert set(TRIGGERS) == {t.value for t in Trigger}


# --- evaluation --------------------------------------------------------------------------------

CONDITIONS = """
wallet: "*"
rules:
  - name: cond
    on: [needs_details]
    if:
      {cond}
    then: [ignore]
"""


@pytest.mark.parametrize(
    ("cond", "dep", "matches"),
    [
        ("currency: [usdt, USDC]", {}, True),
        ("currency: BTC", {}, False),
        ("network: TRON", {}, True),
        ("network: [ETH, BSC]", {}, False),
        ('amount: {lte: "100.5"}', {}, True),
        ('amount: {lt: "100.5"}', {}, False),
        ('amount: {gt: "100", lt: "101"}', {}, True),
        ('amount: {eq: "100.50"}', {}, True),
        ('amount: {gte: "100.51"}', {}, False),
        ('amount: {gte: "1"}', {"amount": None}, False),
        ("amount: {gt: 100}", {}, True),
        ("fromAddress: [TAbcDef, TOther]", {}, True),
        ("fromAddress: tabcdef", {}, False),
        ("walletName: Main", {}, True),
        ("walletName: [Other]", {}, False),
        ("profile: found", {}, False),
        ("profile: missing", {}, True),
    ],
)
def test_condition(tmp_path: Path, cond: str, dep: dict[str, Any], matches: bool) -> None:
    """Each condition holds or not against the deposit's fields."""
    rules = book(tmp_path, ("r.yaml", CONDITIONS.replace("{cond}", cond)))
    intents = rules.evaluate(deposit(**dep), "needs_details", profile_found=False)
    assert bool(intents) is matches


def test_every_matching_rule_runs_in_file_order(tmp_path: Path) -> None:
    """All matching rules run, in file order, each action an Intent with set, version, rule."""
    rules = book(
        tmp_path,
        (
            "r.yaml",
            """
            wallet: 1001
            rules:
              - name: first
                on: [credited]
                then: [book, {alert: {severity: info, channels: slack}}]
              - name: skipped
                on: [blocked]
                then: [ignore]
              - name: second
                on: [credited, DEPOSIT_ORDER_NOTIFICATION]
                then:
                  - forward: {url: "https://bo.example/h", secret_file: s.txt}
            """,
        ),
    )
    intents = rules.evaluate(deposit(), "credited", profile_found=True)
    version = rules.rulesets[0].version
    assert [(i.rule_set, i.version, i.rule, i.trigger, i.action) for i in intents] == [
        ("r.yaml", version, "first", "credited", "book"),
        ("r.yaml", version, "first", "credited", "alert"),
        ("r.yaml", version, "second", "credited", "forward"),
    ]
    assert intents[1].params == {"severity": "info", "channels": ["slack"]}
    assert intents[2].params == {"url": "https://bo.example/h", "secret_file": f"{tmp_path}/s.txt"}
    raw = rules.evaluate(deposit(), "DEPOSIT_ORDER_NOTIFICATION", profile_found=True)
    assert [i.rule for i in raw] == ["second"]


def test_ignore_stops_later_rules(tmp_path: Path) -> None:
    """`ignore` ends evaluation for that trigger; other triggers are unaffected."""
    rules = book(
        tmp_path,
        (
            "r.yaml",
            """
            wallet: "*"
            rules:
              - name: dust
                on: [credited]
                if: {amount: {lt: "1"}}
                then: [{alert: {severity: info}}, ignore]
              - name: book
                on: [credited, completed]
                then: [book]
            """,
        ),
    )
    small = deposit(amount=Decimal("0.5"))
    assert [i.action for i in rules.evaluate(small, "credited", profile_found=False)] == [
        "alert",
        "ignore",
    ]
    assert [i.action for i in rules.evaluate(small, "completed", profile_found=False)] == ["book"]
    assert [i.action for i in rules.evaluate(deposit(), "credited", profile_found=False)] == [
        "book"
    ]
    verdicts = rules.explain(small, "credited", profile_found=False)
    assert verdicts[1].matched is False
    assert verdicts[1].reason == "not evaluated: rule 'dust' ran ignore"


def test_explain_after_ignore_gives_other_triggers_rules_their_own_reason(tmp_path: Path) -> None:
    """After an `ignore`, a later rule that is not on the trigger says so, as it would without
    the ignore: only a rule that could have run is "not evaluated"."""
    rules = book(
        tmp_path,
        (
            "all.yaml",
            """
            wallet: "*"
            rules:
              - {name: stop, "on": [credited], then: [ignore]}
              - {name: ask, "on": [needs_details], then: [{alert: {severity: info}}]}
              - {name: book, "on": [credited], then: [book]}
            """,
        ),
    )
    verdicts = rules.explain(deposit(), "credited", profile_found=False)
    assert [(v.rule, v.reason) for v in verdicts] == [
        ("stop", None),
        ("ask", "not on credited (on: needs_details)"),
        ("book", "not evaluated: rule 'stop' ran ignore"),
    ]


WALLETS = (
    ("a-default.yaml", "wallet: '*'\nrules:\n  - {name: any, on: [credited], then: [book]}\n"),
    ("b-id.yaml", "wallet: 1001\nrules:\n  - {name: by id, on: [credited], then: [book]}\n"),
    ("c-name.yaml", "wallet: Savings\nrules:\n  - {name: by name, on: [credited], then: [book]}\n"),
)


@pytest.mark.parametrize(
    ("wallet_id", "wallet_name", "rule"),
    [
        (1001, "Savings", "by id"),
        (2002, "Savings", "by name"),
        (2002, "Other", "any"),
        (2002, None, "any"),
    ],
)
def test_wallet_specific_set_beats_default(
    tmp_path: Path, wallet_id: int, wallet_name: str | None, rule: str
) -> None:
    """walletId first, then walletName, then "*"."""
    rules = book(tmp_path, *WALLETS)
    dep = deposit(wallet_id=wallet_id, wallet_name=wallet_name)
    assert [i.rule for i in rules.evaluate(dep, "credited", profile_found=False)] == [rule]


def test_no_set_applies(tmp_path: Path) -> None:
    """Without a matching set (or with no rules at all) nothing runs."""
    rules = book(tmp_path, WALLETS[1])
    assert rules.ruleset_for(5, "x") is None
    assert rules.evaluate(deposit(wallet_id=5), "credited", profile_found=False) == []
    assert RuleBook.empty().evaluate(deposit(), "credited", profile_found=True) == []


def test_explain_names_the_failing_condition(tmp_path: Path) -> None:
    """explain gives each rule's verdict and, when not matched, the condition that failed."""
    rules = book(
        tmp_path,
        (
            "r.yaml",
            """
            wallet: "*"
            rules:
              - name: small
                on: [needs_details]
                if: {currency: USDT, amount: {lte: "50000"}}
                then: [submit_profile]
              - name: usdc
                on: [needs_details]
                if: {currency: USDC}
                then: [ignore]
              - name: later
                on: [credited]
                then: [book]
              - name: needs profile
                on: [needs_details]
                if: {profile: found}
                then: [submit_profile]
              - name: from
                on: [needs_details]
                if: {fromAddress: TElse}
                then: [ignore]
            """,
        ),
    )
    verdicts = rules.explain(deposit(amount=Decimal("60000")), "needs_details", profile_found=False)
    assert [(v.rule, v.matched, v.reason) for v in verdicts] == [
        ("small", False, "amount 60000 is not lte 50000"),
        ("usdc", False, "currency USDT is not one of USDC"),
        ("later", False, "not on needs_details (on: credited)"),
        ("needs profile", False, "profile: no stored profile applies (rule needs found)"),
        ("from", False, "fromAddress TAbcDef is not one of the rule's 1 address(es)"),
    ]
    matched = rules.explain(deposit(), "needs_details", profile_found=True)
    assert [v.rule for v in matched if v.matched] == ["small", "needs profile"]
    assert matched[0].reason is None
    assert [a.name for a in matched[0].actions] == ["submit_profile"]


def test_submit_profile_may_name_a_profile(tmp_path: Path) -> None:
    """`submit_profile: {profile: NAME}` carries the name when the profile exists."""
    rules = book(
        tmp_path,
        (
            "r.yaml",
            "wallet: 1\nrules:\n  - name: r\n    on: [needs_details]\n"
            "    then: [{submit_profile: {profile: acme}}]\n",
        ),
    )
    [intent] = rules.evaluate(deposit(wallet_id=1), "needs_details", profile_found=False)
    assert intent.params == {"profile": "acme"}


# --- the shipped files ------------------------------------------------------------------------


def test_shipped_rules_load_with_shipped_profiles() -> None:
    """rules/ (default.yaml) and the per-wallet example load cleanly."""
    names = Profiles.load(SHIPPED / "profiles.yaml").names()
    rules = RuleBook.load(SHIPPED, profile_names=names, specs=SPECS)
    assert [rs.name for rs in rules.rulesets] == ["default.yaml"]
    example = SHIPPED / "examples" / "wallet-1001.example.yaml"
    assert RuleBook.load(example, profile_names=names, specs=SPECS).rulesets[0].wallet == 1001


@pytest.mark.parametrize(
    ("trigger", "found", "actions"),
    [
        ("needs_details", True, [("submit_profile", {})]),
        (
            "needs_details",
            False,
            [
                (
                    "alert",
                    {"severity": "warning", "channels": None, "message": "payer details needed"},
                )
            ],
        ),
        ("credited", False, [("book", {})]),
        ("blocked", True, [("alert", {"severity": "critical", "channels": None})]),
        ("failed", True, [("alert", {"severity": "critical", "channels": None})]),
        ("submitted", True, []),
    ],
)
def test_default_rules_do_the_sensible_thing(
    trigger: str, found: bool, actions: list[tuple[str, dict[str, Any]]]
) -> None:
    """The shipped default submits a stored profile, asks a human, books, alerts on trouble."""
    rules = RuleBook.load(SHIPPED / "default.yaml", specs=SPECS)
    intents = rules.evaluate(deposit(), trigger, profile_found=found)
    assert [(i.action, i.params) for i in intents] == actions


def test_default_rules_alert_on_rejection() -> None:
    """A rejection raises a warning alert."""
    [intent] = RuleBook.load(SHIPPED / "default.yaml", specs=SPECS).evaluate(
        deposit(), "rejected", profile_found=True
    )
    assert (intent.action, intent.params["severity"]) == ("alert", "warning")


# --- rules test --------------------------------------------------------------------------------

PROFILES = """
profiles:
  acme:
    correspondentType: ENTITY
    fullName: Secret Holdings Ltd
    countryCode: SG
    companyAddress: 9 Hidden Lane
    walletType: SELF_HOSTED
addresses:
  TKnown: acme
"""


def event(event_type: str, **data: Any) -> dict[str, Any]:
    body = {
        "transactionId": "tx-9",
        "amount": "2500.75",
        "currency": "USDT",
        "network": "TRON",
        "fromAddress": "TKnown",
        "walletId": 1001,
        "walletName": "Main",
        "status": "PROCESSING",
        "whiteListStatus": "init",
    }
    body.update(data)
    return {
        "eventId": f"evt-{event_type}",
        "eventType": event_type,
        "referenceId": "tx-9",
        "status": body["status"],
        "timestamp": 1_700_000_000_000,
        "data": body,
    }


@pytest.fixture
def config(tmp_path: Path) -> Path:
    write(tmp_path, "profiles.yaml", PROFILES)
    write(tmp_path, "rules/default.yaml", (SHIPPED / "default.yaml").read_text())
    return write(
        tmp_path,
        "depositd.yaml",
        """
        provider: {base_url: "http://127.0.0.1:9", api_key: k, api_secret: s}
        webhook: {api_key: k, secret: w}
        storage: {path: data/depositd.db}
        rules: rules
        profiles: profiles.yaml
        """,
    )


def stored(config: Path, *events: dict[str, Any]) -> Path:
    """A real store database holding `events`, processed into a deposit row."""
    path = config.parent / "data" / "depositd.db"
    path.parent.mkdir(exist_ok=True)
    conn = connect(path)
    db = sqlite_utils.Database(conn)
    migrate(db)
    with conn:
        for body in events:
            conn.execute(
                "INSERT INTO events (event_id, event_type, body, status) VALUES (?, ?, ?, ?)",
                [body["eventId"], body["eventType"], json.dumps(body), "processed"],
            )
            fact = fact_from_event(WebhookEnvelope.model_validate(body))
            assert fact is not None
            apply_fact(db, fact, None)
    conn.close()
    return path


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def run_test(config: Path, *argv: str) -> tuple[int, str]:
    """`depositd rules test --config CONFIG ARGV...` through the real argument parser."""
    lines: list[str] = []
    args = build_parser().parse_args(["rules", "test", "--config", str(config), *argv])
    code = rules_test(args, out=lines.append)
    return code, "\n".join(lines)


def test_rules_test_event_file_shows_matches(config: Path) -> None:
    """A file event prints the deposit, its trigger, verdicts and the action; no DB is created."""
    path = write(config.parent, "ev.json", json.dumps(event("DEPOSIT_WHITELIST_REQUIRED")))
    code, text = run_test(config, str(path))
    assert code == 0
    assert "state: (not tracked yet) -> needs_details" in text
    assert "profile: acme (via address; profile: found)" in text
    assert "[match] submit stored profile -> submit_profile" in text
    assert "[ no  ] payer details needed: profile: a stored profile applies" in text
    assert "would run: submit_profile profile acme (rule 'submit stored profile')" in text
    assert "Secret" not in text and "Hidden" not in text
    assert not (config.parent / "data").exists()


def test_rules_test_stored_event_touches_nothing(config: Path) -> None:
    """`--event` on events already processed shows each as it was when it arrived (the deposit
    rebuilt from the facts before it), read-only: the database is unchanged."""
    required = event("DEPOSIT_WHITELIST_REQUIRED")
    credited = event("DEPOSIT_WHITELIST_CREDITED", whiteListStatus="approved")
    db_path = stored(config, required, credited)
    before = snapshot(db_path.parent)
    code, text = run_test(config, "--event", credited["eventId"])
    assert code == 0
    assert "state: needs_details -> credited; tracked now: credited" in text
    assert "[match] book credited deposit -> book" in text
    assert "would run: book (rule 'book credited deposit')" in text
    code, text = run_test(config, "--event", required["eventId"])
    assert code == 0
    # The event that made the deposit known: not "not tracked yet", since it is tracked.
    assert "state: (first seen in this event) -> needs_details; tracked now: credited" in text
    assert "would run: submit_profile profile acme" in text
    assert snapshot(db_path.parent) == before


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "an event must be a JSON object"),
        (
            '{"eventId": "e", "eventType": "DEPOSIT_WHITELIST_REQUIRED", "data": {}}',
            "transactionId: Field required",
        ),
    ],
)
def test_rules_test_bad_event_file_exits_2(
    config: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    """A bad event file exits 2 with a message naming the file."""
    path = write(config.parent, "bad.json", content)
    code, _ = run_test(config, str(path))
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path}: " in err and message in err


def test_rules_test_unknown_stored_event_exits_2(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An eventId that is not stored exits 2."""
    stored(config)
    code, _ = run_test(config, "--event", "nope")
    assert code == 2
    assert "no stored event with eventId 'nope'" in capsys.readouterr().err


def test_rules_test_reads_a_live_database_without_writing(config: Path) -> None:
    """With the service's writer attached (WAL in use), the event is read and the file kept."""
    db_path = stored(config)
    writer = connect(db_path)
    with writer:
        body = event("DEPOSIT_WHITELIST_REQUIRED")
        writer.execute(
            "INSERT INTO events (event_id, event_type, body) VALUES (?, ?, ?)",
            [body["eventId"], body["eventType"], json.dumps(body)],
        )
    try:
        assert db_path.with_name("depositd.db-wal").exists()
        main_before = db_path.read_bytes()
        code, text = run_test(config, "--event", body["eventId"])
        assert code == 0
        assert "[match] submit stored profile" in text
        assert db_path.read_bytes() == main_before
    finally:
        writer.close()


def test_check_warns_when_no_rule_set_is_found(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rules folder without any *.yaml rule set passes, with a warning that nothing acts."""
    (config.parent / "rules/default.yaml").rename(config.parent / "rules/default.yml")
    assert main(["check", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert "holds no rule set (*.yaml); nothing acts" in err
    assert f"rules: {config.parent / 'rules/default.yml'} is not read (rule sets are *.yaml)" in err


def test_check_warns_of_an_alert_channel_notify_does_not_configure(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rule alerting on e-mail with only Slack configured passes, with a warning naming the
    rule: those alerts would only be logged."""
    write(
        config.parent,
        "rules/w.yaml",
        """
        wallet: 1001
        rules:
          - name: tell the desk
            on: [blocked]
            then: [{alert: {severity: critical, channels: [email, slack]}}]
        """,
    )
    config.write_text(
        config.read_text() + "notify: {slack: {webhook_url: 'https://hooks.example/x'}}\n"
    )
    assert main(["check", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert "rule 'tell the desk' alerts on email, which notify does not configure" in err
    assert "alerts on slack" not in err and "email, slack" not in err


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
def test_check_warns_when_a_200_may_not_survive_a_power_failure(
    config: Path, capsys: pytest.CaptureFixture[str], synchronous: str
) -> None:
    """`check` passes either way, and says what storage.synchronous NORMAL gives up."""
    text = config.read_text().replace(
        "{path: data/depositd.db}", f"{{path: data/depositd.db, synchronous: {synchronous}}}"
    )
    config.write_text(text)
    assert main(["check", "--config", str(config)]) == 0
    warned = "storage.synchronous: NORMAL; an event answered 200 can be lost" in (
        capsys.readouterr().err
    )
    assert warned is (synchronous == "NORMAL")


def test_check_lists_dates_and_true_keys_and_exits_2(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check` names file, line and field for an impossible unquoted date, a value YAML cannot
    build and an `On:` beside `on:`, all at once, and exits 2 instead of crashing."""
    profiles = """
        profiles:
          ada:
            correspondentType: INDIVIDUAL
            firstName: Ada
            lastName: Lovelace
            birthday: 1990-02-30
            residentialAddress: 12 St James
            countryCode: GB
            walletType: SELF_HOSTED
        """
    write(config.parent, "profiles.yaml", profiles)
    write(
        config.parent,
        "rules/w.yaml",
        """
        wallet: 1001
        description: 2024-13-45
        rules:
          - name: r
            on: [credited]
            On: [blocked]
            then: [book]
        """,
    )
    write(config.parent, "rules/x.yaml", "wallet: !!int main\nrules: []\n")
    code = main(["check", "--config", str(config)])
    err = capsys.readouterr().err
    folder = config.parent
    assert code == 2
    assert err.splitlines() == [
        f"{folder}/profiles.yaml:6: profile 'ada': birthday must be a real date in the format "
        "yyyy-MM-dd",
        f"{folder}/rules/w.yaml:6: rules[0].On: unknown key 'On' (known: name, on, if, then); "
        "did you mean 'on'?",
        f"{folder}/rules/x.yaml:1: wallet: invalid YAML: the value cannot be read as an integer",
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["rules", "--config", "CONFIG", "test", "ev.json"],
        ["rules", "test", "--config", "CONFIG", "ev.json"],
    ],
)
def test_rules_test_config_given_before_or_after_test(argv: list[str]) -> None:
    """`--config` is kept whether it comes before or after the `test` subcommand."""
    args = build_parser().parse_args(argv)
    assert args.config == "CONFIG"
    assert args.event_file == "ev.json"


def test_on_quoted_or_not_loads_the_same_rules(tmp_path: Path) -> None:
    """`"on":` (what YAML 1.1 tools read as the text "on") and a bare `on:` load the same rule."""
    rule = "wallet: 1\nrules:\n  - name: r\n    {key}: [credited]\n    then: [book]\n"
    quoted = RuleBook.load(write(tmp_path / "q", "w.yaml", rule.format(key='"on"')), specs=SPECS)
    bare = RuleBook.load(write(tmp_path / "b", "w.yaml", rule.format(key="on")), specs=SPECS)
    assert quoted.rulesets[0].rules == bare.rulesets[0].rules
    assert quoted.rulesets[0].rules[0].on == frozenset({"credited"})


def test_shipped_rules_read_the_same_to_a_yaml_1_1_tool() -> None:
    """Every shipped rule file, read by plain PyYAML (YAML 1.1), has text keys only: no `on:`
    turned into the boolean true."""
    files = sorted(SHIPPED.glob("**/*.yaml"))
    assert files

    def keys(data: Any) -> list[Any]:
        if isinstance(data, dict):
            return [*data, *(k for v in data.values() for k in keys(v))]
        if isinstance(data, list):
            return [k for item in data for k in keys(item)]
        return []

    for path in files:
        data = yaml.safe_load(path.read_text())
        bad = [key for key in keys(data) if isinstance(key, bool)]
        assert not bad, f"{path}: {bad}"
