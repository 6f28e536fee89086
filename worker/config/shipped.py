"""Where the rule sets and profiles that ship with depositd are: the checkout's `rules/`."""

from __future__ import annotations

from pathlib import Path

from worker.errors import ConfigError

_CHECKOUT = Path(__file__).resolve().parents[2]


def shipped_rules() -> Path:
    """The `rules/` folder that ships with depositd (the checkout's, else ./rules)."""
    for base in (_CHECKOUT, Path.cwd()):
        if (base / "rules" / "default.yaml").is_file():
            return base / "rules"
    raise ConfigError(["rules/: the shipped rules folder was not found (run from the checkout)"])


def example_events() -> dict[str, Path]:
    """The example events that ship in `rules/events/` (a webhook body, or a deposit order as a
    poll reads it, for each trigger), by name: `needs_details`, `credited`, ..."""
    try:
        folder = shipped_rules() / "events"
    except ConfigError:
        return {}
    return {path.stem: path for path in sorted(folder.glob("*.json"))}
