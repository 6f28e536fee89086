"""Where the rule sets and profiles that ship with depositd are: the checkout's `rules/`, or
the copy deploy/install.sh puts next to the virtualenv (`PREFIX/share/rules` for `PREFIX/venv`)."""

from __future__ import annotations

import sys
from pathlib import Path

from worker.errors import ConfigError

_CHECKOUT = Path(__file__).resolve().parents[2]


def shipped_rules() -> Path:
    """The `rules/` folder that ships with depositd: the checkout's, the installed copy
    (install.sh's `PREFIX/share/rules`), else ./rules."""
    installed = Path(sys.prefix).parent / "share"
    for base in (_CHECKOUT, installed, Path.cwd()):
        if (base / "rules" / "default.yaml").is_file():
            return base / "rules"
    raise ConfigError(
        [
            "rules/: the shipped rules folder was not found (run from the checkout, or from"
            f" an install by deploy/install.sh, which puts it in {installed / 'rules'})"
        ]
    )


def example_events() -> dict[str, Path]:
    """The example events that ship in `rules/events/` (a webhook body, or a deposit order as a
    poll reads it, for each trigger), by name: `needs_details`, `credited`, ..."""
    try:
        folder = shipped_rules() / "events"
    except ConfigError:
        return {}
    return {path.stem: path for path in sorted(folder.glob("*.json"))}
