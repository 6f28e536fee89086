"""Where the checkout is: the tests start commands from it and read its shipped files."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules"  # the shipped rule set
PROFILES = RULES / "profiles.yaml"  # the shipped payer profiles
