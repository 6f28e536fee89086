"""depositd's configuration as the tests write it: `make_config` builds a complete one around a
database, `serve_config` one for a running `serve`, `write_config` puts one in a file; and the
credentials they hold, which the sandbox (tests/support/sandboxes.py) and the tests that sign
requests or webhooks use as well."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support.paths import PROFILES, RULES

# The provider's credentials: the sandboxes the tests start accept them.
PROVIDER_KEY, PROVIDER_SECRET = "serve-provider-key", "serve-provider-secret"
# Where depositd takes webhooks (the default path) and what they are signed with.
HOOK_PATH = "/webhooks/provider"
HOOK_KEY, HOOK_SECRET = "ops-hook-key", "ops-hook-secret"
# A provider that never answers (the discard port): for what never calls it.
NO_PROVIDER = "http://127.0.0.1:9"
JSON_LOGS = {"format": "json", "level": "info"}

Storage = Mapping[str, Any] | Path


def make_config(
    storage: Storage, provider_url: str = NO_PROVIDER, *, port: int | None = None, **sections: Any
) -> dict[str, Any]:
    """A complete configuration: the provider at `provider_url` with PROVIDER_KEY, webhooks signed
    with HOOK_KEY (taken on loopback `port`, when given), the database `storage` (a `storage`
    section, or a SQLite file). Each of `sections` is added; one the configuration has already
    gets the keys given added or replaced (`webhook={"tolerance_s": 60}`); None leaves it out."""
    cfg: dict[str, Any] = {
        "provider": {
            "base_url": provider_url,
            "api_key": PROVIDER_KEY,
            "api_secret": PROVIDER_SECRET,
        },
        "webhook": {"api_key": HOOK_KEY, "secret": HOOK_SECRET},
        "storage": {"path": str(storage)} if isinstance(storage, Path) else dict(storage),
    }
    if port is not None:
        cfg["webhook"]["listen"] = f"127.0.0.1:{port}"
    return _laid_over(cfg, sections)


def serve_config(storage: Storage, provider_url: str, port: int, **sections: Any) -> dict[str, Any]:
    """`make_config` for a running `serve`: webhooks on loopback `port`, the shipped rules and
    profiles, log lines in JSON at info; `sections` as for `make_config`."""
    shipped = make_config(
        storage,
        provider_url,
        port=port,
        rules=str(RULES),
        profiles=str(PROFILES),
        log=dict(JSON_LOGS),
    )
    return _laid_over(shipped, sections)


def _laid_over(cfg: dict[str, Any], sections: Mapping[str, Any]) -> dict[str, Any]:
    for name, value in sections.items():
        if value is None:
            cfg.pop(name, None)
        elif isinstance(value, Mapping) and isinstance(cfg.get(name), Mapping):
            cfg[name] = {**cfg[name], **value}
        else:
            cfg[name] = value
    return cfg


def write_config(path: Path, cfg: Mapping[str, Any]) -> Path:
    """Write `cfg` to the file `path` (a folder: its depositd.yaml) as JSON, which is YAML;
    the file's path."""
    if path.is_dir():
        path = path / "depositd.yaml"
    path.write_text(json.dumps(cfg, default=str))
    return path
