"""`depositd schema config|rules|profiles`: the JSON Schema of each kind of file.

Editors read them through the `# yaml-language-server: $schema=...` line of a YAML file; the
repository keeps them in docs/schemas/ (docs/configuration.md), checked equal to these.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

KINDS = ("config", "rules", "profiles")


def schema_of(kind: str) -> dict[str, Any]:
    """The JSON Schema of one kind of file, from the models and tables that validate it."""
    from worker.config.schema import config_schema, profiles_schema

    if kind == "config":
        return config_schema()
    if kind == "profiles":
        return profiles_schema()
    if kind == "rules":
        from worker.act.kinds import SPECS
        from worker.rules.schema import rules_schema

        return rules_schema(SPECS)
    raise ValueError(f"no schema for {kind!r}")


def text_of(kind: str) -> str:
    """The schema as printed and as kept in docs/schemas/: indented JSON with a final newline."""
    return json.dumps(schema_of(kind), indent=2, ensure_ascii=False) + "\n"


def run(args: argparse.Namespace) -> int:
    """`depositd schema KIND`."""
    print(text_of(args.kind), end="")
    return 0
