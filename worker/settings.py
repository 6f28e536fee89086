"""The configuration file (SPEC section 4), validated once at start with pydantic.

`${VAR}` is read from the environment, `*_file` keys from files (e.g. systemd credentials),
relative paths resolve against the config file's folder. Unknown keys, an unset variable or an
unreadable file are errors naming the file, line and key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from worker.errors import ConfigError
from worker.provider.signing import ALGORITHMS, DEFAULT_ALGORITHM
from worker.yamlsrc import Loc, YamlSource, yaml_error
from worker.yamlsrc import load as load_yaml

DEFAULT_CONFIG = "depositd.yaml"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Section(BaseModel):
    """Base of every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _check_algorithm(value: str) -> str:
    if value not in ALGORITHMS:
        raise ValueError(f"unknown signature algorithm {value!r} (known: {', '.join(ALGORITHMS)})")
    return value


class ProviderSettings(Section):
    """How to reach and authenticate to the provider."""

    base_url: str
    api_key: SecretStr
    api_secret: SecretStr
    timeout_s: float = Field(10, gt=0)
    signature: str = DEFAULT_ALGORITHM

    _alg = field_validator("signature")(_check_algorithm)

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


class WebhookSettings(Section):
    """The webhook endpoint."""

    listen: str = "127.0.0.1:8080"
    path: str = "/webhooks/provider"
    api_key: SecretStr
    secret: list[SecretStr] = Field(min_length=1)
    tolerance_s: float = Field(300, gt=0)
    max_body_bytes: int = Field(1_048_576, gt=0)
    signature: str = DEFAULT_ALGORITHM
    # `serve` answers webhooks from a process of its own (see worker.front); false: in its own.
    ingress_process: bool = True

    _alg = field_validator("signature")(_check_algorithm)

    @field_validator("secret", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:8080")
        return value

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with /")
        return value

    @property
    def host(self) -> str:
        """Listen host."""
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        """Listen port."""
        return int(self.listen.rpartition(":")[2])


class StorageSettings(Section):
    """The SQLite database."""

    path: Path
    synchronous: Literal["FULL", "NORMAL", "EXTRA"] = "FULL"
    retention_days: int = Field(90, ge=1)


class SchedulerSettings(Section):
    """Polling intervals."""

    enabled: bool = True
    history_interval_s: float = Field(60, gt=0)
    detail_interval_s: float = Field(120, gt=0)
    page_size: int = Field(50, ge=1, le=500)


class SlackSettings(Section):
    """Slack incoming webhook."""

    webhook_url: SecretStr


class EmailSettings(Section):
    """SMTP alerts."""

    host: str
    port: int = 587
    starttls: bool = True
    username: str | None = None
    password: SecretStr | None = None
    from_: str = Field(alias="from")
    to: list[str] = Field(min_length=1)

    @field_validator("to", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class NotifySettings(Section):
    """Alert channels; none configured means alerts are logged only."""

    slack: SlackSettings | None = None
    email: EmailSettings | None = None


class LogSettings(Section):
    """Logging; format defaults to json under systemd (no TTY), console otherwise."""

    format: Literal["json", "console"] | None = None
    level: Literal["debug", "info", "warning", "error"] = "info"


class Settings(Section):
    """The whole configuration file."""

    provider: ProviderSettings
    webhook: WebhookSettings
    storage: StorageSettings
    scheduler: SchedulerSettings = SchedulerSettings()
    rules: Path | None = None
    profiles: Path | None = None
    notify: NotifySettings = NotifySettings()
    log: LogSettings = LogSettings()
    config_path: Path | None = Field(default=None, exclude=True)


# Keys that name a path, resolved against the config folder.
_PATH_KEYS: tuple[Loc, ...] = (("storage", "path"), ("rules",), ("profiles",))


def config_path(explicit: str | os.PathLike[str] | None) -> Path:
    """--config, else $DEPOSITD_CONFIG, else ./depositd.yaml."""
    return Path(explicit or os.environ.get("DEPOSITD_CONFIG") or DEFAULT_CONFIG)


def _expand(value: Any, loc: Loc, src: YamlSource, problems: list[str]) -> Any:
    """Replace ${VAR} in every string; unset variables are problems."""
    if isinstance(value, dict):
        return {k: _expand(v, (*loc, k), src, problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, (*loc, i), src, problems) for i, v in enumerate(value)]
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                dotted = ".".join(str(p) for p in loc)
                problems.append(
                    f"{src.where(loc)}: {dotted}: environment variable {name} is not set"
                )
                return ""
            return os.environ[name]

        return _VAR.sub(sub, value)
    return value


def _read_files(data: dict[str, Any], base: Path, src: YamlSource, problems: list[str]) -> None:
    """Turn every `<key>_file` inside a section into `<key>` read from that file."""
    for section_name, section in list(data.items()):
        sections: list[tuple[Loc, Any]] = [((section_name,), section)]
        if section_name == "notify" and isinstance(section, dict):
            sections = [((section_name, k), v) for k, v in section.items()]
        for loc, sec in sections:
            if not isinstance(sec, dict):
                continue
            for key in [k for k in sec if isinstance(k, str) and k.endswith("_file")]:
                target = key[: -len("_file")]
                dotted = ".".join(str(p) for p in (*loc, key))
                where = src.where((*loc, key))
                if target in sec:
                    problems.append(f"{where}: {dotted}: give either {target} or {key}, not both")
                    continue
                files = sec.pop(key)
                names = files if isinstance(files, list) else [files]
                values = []
                for name in names:
                    path = Path(str(name))
                    path = path if path.is_absolute() else base / path
                    try:
                        values.append(path.read_text(encoding="utf-8").strip())
                    except OSError as exc:
                        problems.append(f"{where}: {dotted}: cannot read {path}: {exc.strerror}")
                sec[target] = values if isinstance(files, list) else (values[0] if values else "")


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    for loc in _PATH_KEYS:
        holder: Any = data
        for part in loc[:-1]:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and isinstance(holder.get(loc[-1]), str):
            path = Path(holder[loc[-1]])
            holder[loc[-1]] = str(path if path.is_absolute() else base / path)


def format_validation(exc: ValidationError, src: YamlSource) -> list[str]:
    """One line per pydantic error: file:line: dotted.key: message."""
    problems = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        problems.append(f"{src.where(loc)}: {dotted}: {msg}")
    return problems


def load_settings(path: str | os.PathLike[str] | None = None) -> Settings:
    """Load and validate the config file; `ConfigError` lists every problem at once."""
    cfg = config_path(path).resolve()
    try:
        src = load_yaml(cfg)
    except OSError as exc:
        raise ConfigError([f"{cfg}: cannot read configuration: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([yaml_error(cfg, exc)]) from None
    if not isinstance(src.data, dict):
        raise ConfigError([f"{cfg}:1: configuration must be a YAML mapping"])
    problems: list[str] = []
    data = _expand(src.data, (), src, problems)
    _read_files(data, cfg.parent, src, problems)
    _resolve_paths(data, cfg.parent)
    try:
        settings = Settings.model_validate({**data, "config_path": cfg})
    except ValidationError as exc:
        problems.extend(format_validation(exc, src))
        raise ConfigError(problems) from None
    if problems:
        raise ConfigError(problems)
    return settings
