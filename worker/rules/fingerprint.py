"""The rules hash (docs/audit.md, "What is recorded"): one SHA-256 over the rule set files'
content and the profiles in force, kept with each decision a rule made, so that an auditor can
tell which rules and which payer profiles decided it, and that they changed in between.

It is the SHA-256 of the canonical JSON (keys sorted, no spaces, UTF-8) of
`{"rule_sets": [{"file", "wallet", "sha256"}, ...], "profiles": Profiles.in_force()}`, the
sets in file-name order, each with the SHA-256 of its file's bytes.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from worker.config.profiles import Profiles
from worker.rules.engine import RuleBook

# The last pairs hashed, by identity: a book and a profiles file are only replaced, never
# changed, so one is hashed once per reload rather than once per decision.
_KEEP = 8
_CACHE: dict[tuple[int, int], tuple[RuleBook, Profiles, str]] = {}
_LOCK = threading.Lock()


def rules_content(book: RuleBook, profiles: Profiles) -> dict[str, Any]:
    """What the rules hash covers."""
    sets = [
        {"file": rs.name, "wallet": str(rs.wallet), "sha256": rs.sha256 or rs.version}
        for rs in sorted(book.rulesets, key=lambda rs: (rs.name, str(rs.wallet)))
    ]
    return {"rule_sets": sets, "profiles": profiles.in_force()}


def rules_hash(book: RuleBook, profiles: Profiles) -> str:
    """The SHA-256 (hex) of the rule sets and profiles in force."""
    key = (id(book), id(profiles))
    with _LOCK:
        found = _CACHE.get(key)
    if found is not None and found[0] is book and found[1] is profiles:
        return found[2]
    text = json.dumps(
        rules_content(book, profiles), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    with _LOCK:
        if len(_CACHE) >= _KEEP:
            _CACHE.clear()
        _CACHE[key] = (book, profiles, digest)
    return digest
