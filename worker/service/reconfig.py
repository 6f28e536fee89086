"""What a reload (SIGHUP) takes from the configuration file, and what needs a restart.

The rules and profiles (their paths and their files) and the notify channels are reloaded; a
change to any other key (listen addresses, storage, provider, scheduler, console, retention,
log) takes effect at the next start only, and is named as needing a restart in the log and in
the reload's STATUS (docs/operator.md). Values are never named: a key may hold a secret.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from worker.config.settings import Settings, load_settings

# The top-level keys a reload puts in force.
RELOADED = ("rules", "profiles", "notify")


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """The dotted keys whose values differ between two dumped configurations."""
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            yield from changed_keys(a, b, f"{name}.")
        elif a != b:
            yield name


def reread(current: Settings) -> tuple[Settings, list[str]]:
    """The settings in force after a reload (the current ones with the reloaded keys of the
    file as it is now) and the changed keys that need a restart; `ConfigError` when the file
    is invalid now. Without a file (settings built in code) nothing is re-read."""
    if current.config_path is None:
        return current, []
    fresh = load_settings(current.config_path)
    restart = [
        key
        for key in changed_keys(current.model_dump(), fresh.model_dump())
        if key.split(".")[0] not in RELOADED
    ]
    taken = current.model_copy(update={key: getattr(fresh, key) for key in RELOADED})
    return taken, restart
