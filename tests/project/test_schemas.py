"""JSON Schemas of depositd.yaml, rule files and profile files: `depositd schema KIND`, the copies
in docs/schemas/, and the `$schema=` line of every shipped YAML file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator

from worker.act import specs
from worker.commands.cli import main
from worker.commands.init import write_sandbox_setup
from worker.commands.schema import KINDS, schema_of, text_of
from worker.config import profiles
from worker.config.yamlsrc import loads
from worker.rules import loader

ROOT = Path(__file__).resolve().parents[2]
MODELINE = re.compile(r"# yaml-language-server: \$schema=(\S+)")
SHIPPED = sorted([*(ROOT / "rules").rglob("*.yaml"), *(ROOT / "deploy").glob("*.yaml")])


def as_editor_sees(path: Path) -> Any:
    """A YAML file as a language server validates it: keys and dates as text, `on` a key."""
    data = loads(path.read_text(encoding="utf-8"), path, bool_keys_as_text=True).data
    return json.loads(json.dumps(data, default=str))


def problems(kind: str, data: Any) -> list[str]:
    return [e.message for e in Draft7Validator(schema_of(kind)).iter_errors(data)]


def schema_named_by(path: Path) -> Path:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    m = MODELINE.fullmatch(first)
    assert m, f"{path}: the first line is not a yaml-language-server $schema= line"
    return (path.parent / m.group(1)).resolve()


@pytest.mark.parametrize("kind", KINDS)
def test_docs_schemas_are_the_generated_ones(kind: str) -> None:
    """docs/schemas/KIND.schema.json is what `depositd schema KIND` prints (`make schemas`
    writes them again), a valid draft-07 schema."""
    text = (ROOT / "docs" / "schemas" / f"{kind}.schema.json").read_text(encoding="utf-8")
    assert text == text_of(kind), "docs/schemas/ is out of date: run make schemas"
    Draft7Validator.check_schema(json.loads(text))


def test_schema_command_prints_each_kind(capsys: pytest.CaptureFixture[str]) -> None:
    """`depositd schema rules` prints the schema; an unknown kind is a usage error (2)."""
    assert main(["schema", "rules"]) == 0
    assert json.loads(capsys.readouterr().out) == schema_of("rules")
    with pytest.raises(SystemExit) as exit_:
        main(["schema", "rulez"])
    assert exit_.value.code == 2


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_yaml_names_its_schema_and_matches_it(path: Path) -> None:
    """Each YAML file in rules/ and deploy/ names its schema in docs/schemas/ on its first line
    (a path relative to the file, as editors resolve it) and validates against it."""
    schema = schema_named_by(path)
    assert schema.parent == ROOT / "docs" / "schemas" and schema.is_file()
    kind = schema.name.split(".")[0]
    expected = "config" if path.parent.name == "deploy" else None
    expected = expected or ("profiles" if "profiles" in path.name else "rules")
    assert kind == expected
    assert problems(kind, as_editor_sees(path)) == []


def test_init_writes_the_schemas_its_files_name(tmp_path: Path) -> None:
    """`depositd init --sandbox` writes schemas/ in its folder, which its YAML files name."""
    config = write_sandbox_setup(tmp_path / "local")
    for name, kind in (
        ("depositd", "config"),
        ("rules/default", "rules"),
        ("rules/examples/wallet-1001.example", "rules"),
        ("rules/profiles", "profiles"),
    ):
        path = config.parent / f"{name}.yaml"
        schema = schema_named_by(path)
        assert schema == config.parent / "schemas" / f"{kind}.schema.json"
        assert schema.read_text(encoding="utf-8") == text_of(kind)
        assert problems(kind, as_editor_sees(path)) == [], path


def test_the_schemas_refuse_what_the_loaders_refuse() -> None:
    """A misspelled key, an unknown trigger, a forward without a secret and an ENTITY payer
    without its name each fail the schema, as they fail `depositd check`."""
    config = {
        "provider": {"base_url": "https://p.example", "api_key": "k", "api_secret_file": "s"},
        "webhook": {"api_key": "k", "secret": "${WEBHOOK_SECRET}"},
        "storage": {"path": "depositd.db"},
    }
    assert problems("config", config) == []
    assert problems("config", {**config, "webhok": {}})
    assert problems("config", {**config, "storage": {"path": "x", "synchronous": "SOMETIMES"}})
    rule = {"name": "r", "on": ["needs_details"], "then": ["submit_profile"]}
    assert problems("rules", {"wallet": 1001, "rules": [rule]}) == []
    assert problems("rules", {"wallet": 1001, "rules": [{**rule, "on": ["needs_detail"]}]})
    forward_without_secret = {**rule, "then": [{"forward": {"url": "https://erp.example"}}]}
    assert problems("rules", {"wallet": 1001, "rules": [forward_without_secret]})
    payer = {
        "correspondentType": "ENTITY",
        "fullName": "Example Ltd",
        "companyAddress": "1 Example Road",
        "countryCode": "SG",
        "walletType": "SELF_HOSTED",
    }
    assert problems("profiles", {"profiles": {"p": payer}, "wallets": {"1001": "p"}}) == []
    nameless = {k: v for k, v in payer.items() if k != "fullName"}
    assert problems("profiles", {"profiles": {"p": nameless}})
    assert problems("profiles", {"profiles": {"p": {**payer, "countryCode": "UK"}}})


def test_the_schemas_know_the_keys_the_loaders_know() -> None:
    """Top-level and rule keys of the rules schema, and the profiles file's sections, are those
    the loaders accept."""
    rules = schema_of("rules")
    assert sorted(rules["properties"]) == sorted(loader.TOP_KEYS)
    assert sorted(rules["definitions"]["rule"]["properties"]) == sorted(loader.RULE_KEYS)
    assert sorted(schema_of("profiles")["properties"]) == sorted(profiles.TOP_KEYS)


def test_action_parameters_in_the_schema_are_those_the_checks_take() -> None:
    """Each action kind's parameter schema names exactly the keys its check accepts."""
    for params, keys in (
        (specs.ALERT_PARAMS, specs.ALERT_KEYS),
        (specs.FORWARD_PARAMS, specs.FORWARD_KEYS),
        (specs.SUBMIT_PARAMS, specs.SUBMIT_KEYS),
    ):
        properties: dict[str, Any] = params["properties"]  # type: ignore[assignment]
        assert sorted(properties) == sorted(keys)
