"""The configuration file (docs/configuration.md), validated once at start with pydantic.

`${VAR}` is read from the environment, `*_file` keys from files (e.g. systemd credentials),
relative paths resolve against the config file's folder. Unknown keys, a key given twice, an
unset variable, an unreadable or non-UTF-8 file and an empty credential are errors naming the
file, line and key (never a secret's value).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from worker.config.messages import plain
from worker.config.yamlkeys import duplicate_keys
from worker.config.yamlsrc import Loc, YamlSource, yaml_error
from worker.config.yamlsrc import load as load_yaml
from worker.errors import ConfigError
from worker.provider.signing import DEFAULT, SETTING, Scheme
from worker.urls import mask_url

DEFAULT_CONFIG = "depositd.yaml"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Section(BaseModel):
    """Base of every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _non_empty(value: SecretStr) -> SecretStr:
    # An empty HMAC key verifies signatures anyone can make; an empty API key fails every call.
    if not value.get_secret_value().strip():
        raise PydanticCustomError("empty_credential", "is empty")
    return value


# A secret or key: empty (or only whitespace) after ${VAR} and *_file expansion is an error.
Credential = Annotated[SecretStr, AfterValidator(_non_empty)]


# The signature keys (docs/signatures.md): each one of its choices in
# `worker.provider.signing.SETTINGS`; an old name is read as the new one.
SignatureName = Annotated[str, AfterValidator(SETTING["signature"].check)]
SignatureHash = Annotated[str, AfterValidator(SETTING["signature_hash"].check)]
SignatureEncoding = Annotated[str, AfterValidator(SETTING["signature_encoding"].check)]
SignatureParams = Annotated[str, AfterValidator(SETTING["signature_params"].check)]


class Signed(Section):
    """A section with the signature keys (`signature`, `signature_hash`, ...)."""

    @property
    def scheme(self) -> Scheme:
        """The signature scheme these keys select."""
        return Scheme.of(self)


def _checked_listen(value: str, example: str) -> str:
    """`value` when it is HOST:PORT (a port 0-65535), else a ValueError naming `example`."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"must be HOST:PORT, e.g. {example}")
    return value


def _host_port(listen: str) -> tuple[str, int]:
    """The host (IPv6 brackets dropped) and port of a checked HOST:PORT."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


class ProviderSettings(Signed):
    """How to reach and authenticate to the provider."""

    base_url: str
    api_key: Credential
    api_secret: Credential
    timeout_s: float = Field(10, gt=0)
    # How requests are signed (docs/signatures.md).
    signature: SignatureName = DEFAULT.name
    signature_hash: SignatureHash = DEFAULT.hash
    signature_encoding: SignatureEncoding = DEFAULT.encoding
    signature_params: SignatureParams = DEFAULT.params
    # An answer body above this is a protocol error, never read whole (a real page is KBs).
    max_answer_bytes: int = Field(16 * 1024 * 1024, ge=65_536)
    # Plain http:// to a host other than loopback is refused unless this says it is meant.
    allow_insecure_http: bool = False
    # The request budget every poll shares (submissions and operator reads go first); the
    # provider publishes no limit (docs/polling.md says why 5).
    max_requests_per_s: float = Field(5, gt=0, le=1000)

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        # Its origin goes into the console's Content-Security-Policy: a host and nothing that
        # could end the directive or add a source.
        parts = urlsplit(value)
        if not parts.hostname or parts.username or any(c in value for c in " \t\r\n;,'\""):
            raise ValueError("must be an http(s) URL with a host and no spaces, ; , or quotes")
        return value.rstrip("/")


class WebhookSettings(Signed):
    """The webhook endpoint."""

    listen: str = "127.0.0.1:8080"
    path: str = "/webhooks/provider"
    api_key: Credential
    secret: list[Credential] = Field(min_length=1)
    tolerance_s: float = Field(300, gt=0)
    max_body_bytes: int = Field(1_048_576, gt=0)
    # How deliveries are signed (docs/signatures.md).
    signature: SignatureName = DEFAULT.name
    signature_hash: SignatureHash = DEFAULT.hash
    signature_encoding: SignatureEncoding = DEFAULT.encoding
    signature_params: SignatureParams = DEFAULT.params
    # `serve` answers webhooks from a process of its own (worker.ingest.process); false: in its own.
    ingress_process: bool = True
    # Connection limits of the webhook listener (worker.ingest.limits).
    head_timeout_s: float = Field(5, gt=0)  # a request head complete within this of its 1st byte
    idle_timeout_s: float = Field(60, gt=0)  # a connection with no request open is closed after
    max_connections: int = Field(1000, ge=1)  # open at once; LimitNOFILE in the unit is above
    # Request bodies being read at once, all requests together; over it: 503 with Retry-After.
    body_budget_bytes: int = Field(67_108_864, gt=0)
    # HOST:PORT of a listener for /metrics and /readyz; set: the webhook port no longer serves them.
    ops_listen: str | None = None

    @field_validator("secret", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("listen", "ops_listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        return None if value is None else _checked_listen(value, "127.0.0.1:8080")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with /")
        return value

    @property
    def host(self) -> str:
        """Listen host."""
        return _host_port(self.listen)[0]

    @property
    def port(self) -> int:
        """Listen port."""
        return _host_port(self.listen)[1]

    @property
    def ops_address(self) -> tuple[str, int] | None:
        """Host and port of `ops_listen`, or None."""
        if self.ops_listen is None:
            return None
        return _host_port(self.ops_listen)


class StorageSettings(Section):
    """The database: a SQLite file (`path`), or PostgreSQL (`url`, with `password`)."""

    path: Path | None = None
    url: str | None = None
    password: Credential | None = None
    synchronous: Literal["FULL", "NORMAL", "EXTRA"] = "FULL"
    retention_days: int = Field(90, ge=1)
    # An outage of the database longer than this is logged once more and alerted, once
    # (docs/operations.md, "When the database is unavailable").
    outage_alert_s: float = Field(60, gt=0)
    # SQLite: False, a second `serve` on the file refuses to start, naming the first; True,
    # several instances on this machine share it (docs/postgresql.md). PostgreSQL: always.
    several_instances: bool = False

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        return value

    @model_validator(mode="after")
    def _one_database(self) -> StorageSettings:
        if (self.path is None) == (self.url is None):
            raise ValueError(
                "give exactly one of storage.path (SQLite) and storage.url (PostgreSQL)"
            )
        if self.password is not None and self.url is None:
            raise ValueError("storage.password goes with storage.url")
        return self

    @property
    def file(self) -> Path:
        """The SQLite file (`path`); an error on PostgreSQL, where there is none."""
        if self.path is None:
            raise ConfigError(["storage.path: this command needs SQLite (storage.url is set)"])
        return self.path

    @property
    def where(self) -> str:
        """The database as logs and output name it (a URL with its password masked)."""
        return str(self.path) if self.path is not None else mask_url(self.url or "")


class SchedulerSettings(Section):
    """Polling intervals."""

    enabled: bool = True
    history_interval_s: float = Field(60, gt=0)
    detail_interval_s: float = Field(120, gt=0)
    # A deposit in motion with no new fact for detail_young_s is read less often: the wait
    # doubles each time its age doubles, up to detail_max_interval_s (docs/polling.md).
    detail_young_s: float = Field(3600, ge=0)
    detail_max_interval_s: float = Field(3600, gt=0)
    # BLOCKED deposits: their detail is read this often, for this long after they were blocked
    # (support may release them: blocked -> credited, trigger released).
    blocked_interval_s: float = Field(3600, gt=0)
    blocked_watch_days: float = Field(30, gt=0)
    # Records per page of every paged read: as large as the provider takes, so the work
    # queues cost pages, not deposits (a provider refusing it on the queues: 50 is used).
    page_size: int = Field(500, ge=1, le=500)
    # Pages one paged read (each history queue, the address list) fetches per run at most.
    max_pages: int = Field(100, ge=1)
    # Catch-up: the full history read from the covered-until mark (minus the margin) to now, in
    # windows of catchup_window_s, at start, after the provider was unreachable, and every
    # catchup_interval_s; with no mark yet, from now minus catchup_lookback_s.
    catchup_margin_s: float = Field(600, ge=0)
    catchup_window_s: float = Field(3600, ge=1)
    catchup_lookback_s: float = Field(3 * 86_400, ge=0)
    catchup_interval_s: float = Field(3600, gt=0)
    # Daily, UTC: the previous day's full history, read again as a safety net.
    sweep_at: str = Field("01:00", pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
    # The abnormal-fund list, every page, this often (section 15).
    abnormal_interval_s: float = Field(300, gt=0)
    # Daily, UTC: reconcile the previous day against the provider's report (section 14).
    reconcile_at: str = Field("02:30", pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
    # Daily, UTC: verify the journal and publish its head to the log and the alert channels
    # (docs/audit.md, "Anchoring the head"); after the reconciliation, whose entries it covers.
    journal_at: str = Field("03:00", pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")


class InstanceSettings(Section):
    """instance: this serve among several on one database."""

    lease_s: float = Field(60, ge=1)


class SlackSettings(Section):
    """Slack incoming webhook."""

    webhook_url: Credential


class EmailSettings(Section):
    """SMTP alerts."""

    host: str
    port: int = 587
    starttls: bool = True
    username: str | None = None
    password: Credential | None = None
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


class ConsoleSettings(Section):
    """The operator console (worker.console); absent: none."""

    listen: str = "127.0.0.1:8081"
    # The login token, read from this file at every login (a rotated token needs no restart).
    token_file: Path
    # Where the provider's hosted deposit Travel Rule page lives (its origin is the only one
    # the console frames and takes messages from); None: no embedded page.
    hosted_url: str | None = None
    # Plain http:// to a hosted page off this machine is refused unless this says it is meant.
    allow_insecure_http: bool = False
    session_ttl_s: float = Field(8 * 3600, ge=60)
    dark_mode: bool = False

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return _checked_listen(value, "127.0.0.1:8081")

    @field_validator("hosted_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        # Its origin goes into the console's Content-Security-Policy: a host and nothing that
        # could end the directive or add a source.
        parts = urlsplit(value)
        if not parts.hostname or parts.username or any(c in value for c in " \t\r\n;,'\""):
            raise ValueError("must be an http(s) URL with a host and no spaces, ; , or quotes")
        return value.rstrip("/")

    @property
    def host(self) -> str:
        """Listen host."""
        return _host_port(self.listen)[0]

    @property
    def port(self) -> int:
        """Listen port."""
        return _host_port(self.listen)[1]


def _whole_days(value: Any) -> Any:
    # A count of days is a whole number as written: `true` (which pydantic would read as 1) and
    # `30.0` are refused, not rounded; text comes from a ${VAR} and is read as written.
    if isinstance(value, bool | float) or (isinstance(value, str) and not value.strip().isdigit()):
        raise PydanticCustomError("whole_days", "must be a whole number of days, e.g. 1825")
    return value


class RetentionSettings(Section):
    """retention: how long personal data is kept (docs/audit.md, "Retention of personal data")."""

    # Payer values kept in stored submissions are removed this many days after their deposit
    # finished (completed or failed); None (unset): kept.
    personal_data_days: Annotated[int, BeforeValidator(_whole_days), Field(gt=0)] | None = None


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
    instance: InstanceSettings = InstanceSettings()
    rules: Path | None = None
    profiles: Path | None = None
    notify: NotifySettings = NotifySettings()
    console: ConsoleSettings | None = None
    retention: RetentionSettings = RetentionSettings()
    log: LogSettings = LogSettings()
    config_path: Path | None = Field(default=None, exclude=True)


# Keys that name a path, resolved against the config folder.
_PATH_KEYS: tuple[Loc, ...] = (
    ("storage", "path"),
    ("rules",),
    ("profiles",),
    ("console", "token_file"),
)

# Where `<key>_file` reads `<key>` from a file. Only keys the section has: a typo such as
# `api_secrte_file` stays as written and is reported as an unknown key on its own line.
_SECTIONS: dict[Loc, type[Section]] = {
    ("provider",): ProviderSettings,
    ("webhook",): WebhookSettings,
    ("storage",): StorageSettings,
    ("scheduler",): SchedulerSettings,
    ("instance",): InstanceSettings,
    ("notify", "slack"): SlackSettings,
    ("notify", "email"): EmailSettings,
    ("console",): ConsoleSettings,
    ("retention",): RetentionSettings,
    ("log",): LogSettings,
}


def config_path(explicit: str | os.PathLike[str] | None) -> Path:
    """--config, else $DEPOSITD_CONFIG, else ./depositd.yaml."""
    return Path(explicit or os.environ.get("DEPOSITD_CONFIG") or DEFAULT_CONFIG)


def _no_config(cfg: Path, explicit: str | os.PathLike[str] | None) -> str:
    """A configuration file that is not there: which one was looked for, and why that one."""
    if explicit:
        why = "given with --config"
    elif os.environ.get("DEPOSITD_CONFIG"):
        why = "named by $DEPOSITD_CONFIG"
    else:
        why = "the default, ./depositd.yaml: neither --config nor $DEPOSITD_CONFIG names one"
    return (
        f"{cfg}: no configuration file here ({why}); give one with --config PATH or"
        " $DEPOSITD_CONFIG, or write a local setup with `depositd init --sandbox DIR`"
    )


def _at(data: Any, loc: Loc) -> Any:
    for part in loc:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data


@dataclass
class _Origins:
    """Where expanded values came from, so a problem names the key as written and its source."""

    renamed: dict[Loc, Loc] = field(default_factory=dict)  # (section, key) -> (section, key_file)
    sources: dict[Loc, str] = field(default_factory=dict)  # value -> "environment variable X"
    reported: set[Loc] = field(default_factory=set)  # values with a problem already

    def source(self, loc: Loc) -> str | None:
        """Where the value at `loc` (or the value holding it) came from, if not the YAML."""
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.sources:
                return self.sources[loc[:n]]
        return None

    def is_reported(self, loc: Loc) -> bool:
        """Whether the value at `loc` (or the value holding it) already has a problem."""
        return any(loc[:n] in self.reported for n in range(1, len(loc) + 1))

    def as_written(self, loc: Loc, data: Any) -> Loc:
        """`loc` as the file spells it: `secret_file` for a `secret` read from a file, no list
        index for a single value the validator wrapped in a list."""
        if loc and isinstance(loc[-1], int) and not isinstance(_at(data, loc[:-1]), list):
            loc = loc[:-1]
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.renamed:
                return self.renamed[loc[:n]] + loc[n:]
        return loc


def _expand(value: Any, loc: Loc, src: YamlSource, problems: list[str], origins: _Origins) -> Any:
    """Replace ${VAR} in every string; unset variables are problems."""
    if isinstance(value, dict):
        return {k: _expand(v, (*loc, k), src, problems, origins) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, (*loc, i), src, problems, origins) for i, v in enumerate(value)]
    if isinstance(value, str):
        names = _VAR.findall(value)
        if names:
            plural = "s" if len(names) > 1 else ""
            origins.sources[loc] = f"environment variable{plural} {', '.join(names)}"

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                dotted = ".".join(str(p) for p in loc)
                problems.append(
                    f"{src.where(loc)}: {dotted}: environment variable {name} is not set"
                )
                origins.reported.add(loc)
                return ""
            return os.environ[name]

        return _VAR.sub(sub, value)
    return value


def read_secret_file(path: Path) -> str:
    """A secret file's text without surrounding whitespace (a trailing newline is usual)."""
    return path.read_bytes().decode("utf-8").strip()


def _read_files(
    data: dict[str, Any], base: Path, src: YamlSource, problems: list[str], origins: _Origins
) -> None:
    """Turn every `<key>_file` of a known `<key>` into `<key>` read from that file.

    A file that cannot be read gives an empty value, marked as reported so that it is not
    also "empty"; the text of a file never appears in a problem (it is a secret).
    """
    for loc, model in _SECTIONS.items():
        sec = _at(data, loc)
        if not isinstance(sec, dict):
            continue
        keys = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
        for key in [k for k in sec if isinstance(k, str) and k.endswith("_file")]:
            target = key[: -len("_file")]
            if target not in keys:
                continue  # an unknown key: validation names it as written
            dotted = ".".join(str(p) for p in (*loc, key))
            files = sec.pop(key)
            if target in sec:
                problems.append(
                    f"{src.where((*loc, key))}: {dotted}: give either {target} or {key}, not both"
                )
                continue
            origins.renamed[(*loc, target)] = (*loc, key)
            many = isinstance(files, list)
            values = []
            for i, name in enumerate(files if many else [files]):
                where = src.where((*loc, key, i) if many else (*loc, key))
                value_loc = (*loc, target, i) if many else (*loc, target)
                path = Path(str(name))
                path = path if path.is_absolute() else base / path
                origins.sources[value_loc] = f"file {path}"
                problem = None
                try:
                    values.append(read_secret_file(path))
                except OSError as exc:
                    problem = f"cannot read {path}: {exc.strerror}"
                except UnicodeDecodeError:
                    problem = f"{path} is not UTF-8 text"
                if problem is not None:
                    problems.append(f"{where}: {dotted}: {problem}")
                    origins.reported.add(value_loc)
                    values.append("")
            sec[target] = values if many else values[0]


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    for loc in _PATH_KEYS:
        holder: Any = data
        for part in loc[:-1]:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and isinstance(holder.get(loc[-1]), str):
            path = Path(holder[loc[-1]])
            holder[loc[-1]] = str(path if path.is_absolute() else base / path)


def format_validation(
    exc: ValidationError,
    src: YamlSource,
    origins: _Origins | None = None,
    data: Mapping[str, Any] | None = None,
) -> list[str]:
    """One line per pydantic error: file:line: dotted.key: message.

    With `origins` and the expanded `data`: keys as written (`api_secret_file`), an empty
    credential names where it came from, and values already reported are left out.
    """
    origins = origins or _Origins()
    problems = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
        if origins.is_reported(loc):
            continue  # an unset variable or unreadable file, already a problem
        shown = origins.as_written(loc, data)
        dotted = ".".join(str(p) for p in shown) or "(top level)"
        msg = plain(err, shown, dotted, {(): Settings, **_SECTIONS})
        if err["type"] == "empty_credential" and (source := origins.source(loc)):
            msg = f"{msg} (from {source})"
        problems.append(f"{src.where(shown)}: {dotted}: {msg}")
    return problems


@dataclass
class Loaded:
    """A config file as read: the settings when valid, else every problem found.

    `files` maps `rules` and `profiles` to their path (None: not set) whenever the file gives
    it plainly, even with problems elsewhere, so `check` can validate those files too; a key
    whose own value is broken is left out.
    """

    path: Path
    settings: Settings | None
    problems: list[str]
    files: dict[str, Path | None]


def read_settings(path: str | os.PathLike[str] | None = None) -> Loaded:
    """Read and validate the config file, collecting every problem instead of raising."""
    cfg = config_path(path).resolve()
    try:
        src = load_yaml(cfg)
    except FileNotFoundError:
        return Loaded(cfg, None, [_no_config(cfg, path)], {})
    except OSError as exc:
        return Loaded(cfg, None, [f"{cfg}: cannot read configuration: {exc.strerror}"], {})
    except UnicodeDecodeError:
        # The message would quote a byte of the file, which may hold a secret.
        return Loaded(cfg, None, [f"{cfg}:1: configuration is not UTF-8 text"], {})
    except yaml.YAMLError as exc:
        return Loaded(cfg, None, [yaml_error(cfg, exc)], {})
    except ConfigError as exc:
        return Loaded(cfg, None, exc.problems, {})
    if not isinstance(src.data, dict):
        return Loaded(cfg, None, [f"{cfg}:1: configuration must be a YAML mapping"], {})
    problems = duplicate_keys(src)
    origins = _Origins()
    data = _expand(src.data, (), src, problems, origins)
    _read_files(data, cfg.parent, src, problems, origins)
    _resolve_paths(data, cfg.parent)
    try:
        settings = Settings.model_validate({**data, "config_path": cfg})
    except ValidationError as exc:
        problems.extend(format_validation(exc, src, origins, data))
        broken = {err["loc"][0] for err in exc.errors() if err["loc"]}
    else:
        if not problems:
            return Loaded(
                cfg, settings, [], {"rules": settings.rules, "profiles": settings.profiles}
            )
        broken = set()
    files: dict[str, Path | None] = {}
    for key in ("rules", "profiles"):
        value = data.get(key)
        if value is None:
            files[key] = None
        elif isinstance(value, str) and key not in broken and not origins.is_reported((key,)):
            files[key] = Path(value)
    return Loaded(cfg, None, problems, files)


def load_settings(path: str | os.PathLike[str] | None = None) -> Settings:
    """Load and validate the config file; `ConfigError` lists every problem at once."""
    loaded = read_settings(path)
    if loaded.settings is None:
        raise ConfigError(loaded.problems)
    return loaded.settings
