"""A rule set's `deadline:` and `escalate:` (docs/rules.md, "Deadlines"): read with the real rule
loader, refused at load with file and line, and checked by `depositd check` against the
channels `notify` configures."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from jsonschema import Draft7Validator

from worker.act.kinds import SPECS
from worker.commands.cli import main
from worker.commands.schema import schema_of
from worker.errors import ConfigError
from worker.rules import RuleBook

RULES = 'rules:\n  - {name: book, "on": [credited], then: [book]}\n'


def rule_file(folder: Path, head: str, name: str = "w.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(head) + RULES, encoding="utf-8")
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        RuleBook.load(path, specs=SPECS)
    return info.value.problems


@pytest.mark.parametrize(
    ("value", "seconds"), [("30m", 1800), ("4h", 14_400), ("2d", 172_800), ("366d", 31_622_400)]
)
def test_a_deadline_is_a_whole_number_and_a_unit(tmp_path: Path, value: str, seconds: int) -> None:
    """30m, 4h, 2d: minutes, hours, days; escalate names the channels, in the order given."""
    path = rule_file(tmp_path, f"wallet: 1001\ndeadline: {value}\nescalate: [email, slack]\n")
    [ruleset] = RuleBook.load(path, specs=SPECS).rulesets
    assert (ruleset.deadline_s, ruleset.escalate) == (seconds, ("email", "slack"))
    assert RuleBook.load(path, specs=SPECS).shortest_deadline_s == seconds


def test_without_a_deadline_nothing_is_ever_due(tmp_path: Path) -> None:
    """A set without `deadline:` has none; a book without any has no shortest deadline."""
    path = rule_file(tmp_path, "wallet: 1001\n")
    book = RuleBook.load(path, specs=SPECS)
    assert (book.rulesets[0].deadline_s, book.rulesets[0].escalate) == (None, None)
    assert book.shortest_deadline_s is None


@pytest.mark.parametrize(
    "value", ["4 hours", "90", "0m", "4H", "1.5h", "30s", "-1h", '""', "[4h]", "367d", "null"]
)
def test_a_bad_deadline_is_refused_naming_file_and_line(tmp_path: Path, value: str) -> None:
    """Anything but a positive whole number and m, h or d (at most a year) is refused at load,
    naming the file, the line and the key."""
    path = rule_file(tmp_path, f"wallet: 1001\ndescription: d\ndeadline: {value}\n")
    [problem] = problems(path)
    assert problem.startswith(f"{path}:3: deadline: "), problem


def test_unknown_escalate_channels_are_refused_naming_file_and_line(tmp_path: Path) -> None:
    """An unknown channel is refused at its line, with the known ones and a did-you-mean;
    escalate without a deadline, or empty, is refused too."""
    path = rule_file(tmp_path, "wallet: 1001\ndeadline: 4h\nescalate:\n  - email\n  - slak\n")
    assert problems(path) == [
        f"{path}:5: escalate: unknown channel 'slak' (known: slack, email); did you mean 'slack'?"
    ]
    alone = rule_file(tmp_path, "wallet: 1002\nescalate: [email]\n", "x.yaml")
    assert problems(alone) == [
        f"{alone}:2: escalate: needs a deadline: (it names the channels of the alert past the"
        " deadline)"
    ]
    empty = rule_file(tmp_path, "wallet: 1003\ndeadline: 1h\nescalate: []\n", "y.yaml")
    assert problems(empty)[0].startswith(f"{empty}:3: escalate: must be a non-empty list")


def test_the_schema_takes_what_the_loader_takes() -> None:
    """The rules schema accepts a deadline and escalate the loader accepts and refuses the
    mistakes it refuses (for editors)."""
    validator = Draft7Validator(schema_of("rules"))
    good = {"wallet": 1001, "deadline": "4h", "escalate": ["email"], "rules": []}
    assert list(validator.iter_errors(good)) == []
    for bad in ({"deadline": "4 hours"}, {"deadline": "0m"}, {"escalate": ["pager"]}):
        data = {**good, **bad}
        assert list(validator.iter_errors(data)), bad
    assert list(validator.iter_errors({"wallet": 1, "escalate": ["email"], "rules": []}))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "rules").mkdir()
    path = tmp_path / "depositd.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            provider: {base_url: "http://127.0.0.1:9", api_key: k, api_secret: s}
            webhook: {api_key: k, secret: w}
            storage: {path: data/depositd.db}
            rules: rules
            notify: {slack: {webhook_url: "https://hooks.example/x"}}
            """
        ),
        encoding="utf-8",
    )
    return path


def test_check_refuses_a_bad_deadline_and_warns_of_an_escalate_channel_not_configured(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`depositd check` exits 2 naming the file and line of a bad deadline; a good set whose
    escalate names a channel notify does not configure passes with a warning naming its line."""
    folder = config.parent / "rules"
    rule_file(folder, "wallet: 1001\ndeadline: soon\n")
    assert main(["check", "--config", str(config)]) == 2
    assert f"{folder}/w.yaml:2: deadline: must be a duration" in capsys.readouterr().err

    rule_file(folder, "wallet: 1001\ndeadline: 4h\nescalate: [email]\n")
    assert main(["check", "--config", str(config)]) == 0
    err = capsys.readouterr().err
    assert f"{folder}/w.yaml:3: escalate names email, which notify does not configure" in err
