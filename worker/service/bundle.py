"""What the worker acts on: rules and profiles loaded and validated together (`serve`, `check`,
`rules`, `backfill`), with the warnings and problems that concern both."""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from worker.act.specs import NAMED_CHANNELS, SPECS, URLS
from worker.config.profiles import Profiles
from worker.config.settings import Settings, read_secret_file
from worker.errors import ConfigError
from worker.rules import Action, Rule, RuleBook, RuleSet
from worker.urls import plain_http_problem


@dataclass
class Bundle:
    """What the worker acts on: rules and profiles, validated together."""

    rules: RuleBook
    profiles: Profiles
    warnings: list[str] = field(default_factory=list)


def names_in_file(path: Path) -> set[str] | None:
    """The profile names a profiles file that did not load gives; None when unreadable."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):  # ValueError: a date YAML cannot build
        return None
    profiles = data.get("profiles") if isinstance(data, dict) else None
    return {str(name) for name in profiles} if isinstance(profiles, dict) else None


def load_bundle(settings: Settings) -> Bundle:
    """Load profiles then rules; `ConfigError` lists every problem of both."""
    problems: list[str] = []
    warnings: list[str] = []
    if settings.storage.synchronous == "NORMAL":
        warnings.append(
            "storage.synchronous: NORMAL; an event answered 200 can be lost on a power failure or"
            " an OS crash (FULL, the default, and EXTRA cannot)"
        )
    profiles = Profiles.empty()
    # The names rules may give. A profiles file with problems of its own has them reported, and
    # a rule naming one of its profiles is not reported again as naming an unknown one.
    profile_names: set[str] | None = set()
    if settings.profiles is None:
        warnings.append("profiles: not set; submit_profile never finds a profile")
    else:
        try:
            profiles = Profiles.load(settings.profiles)
            profile_names = profiles.names()
        except ConfigError as exc:
            problems.extend(exc.problems)
            profile_names = names_in_file(settings.profiles)
    rules = RuleBook.empty()
    if settings.rules is None:
        warnings.append("rules: not set; nothing acts (events are stored and tracked only)")
    else:
        try:
            rules = RuleBook.load(settings.rules, profile_names=profile_names, specs=SPECS)
        except ConfigError as exc:
            problems.extend(exc.problems)
        else:
            if not rules.rulesets:
                warnings.append(
                    f"rules: {settings.rules} holds no rule set (*.yaml); nothing acts (events"
                    " are stored and tracked only)"
                )
            if settings.rules.is_dir():
                warnings += [
                    f"rules: {path} is not read (rule sets are *.yaml)"
                    for path in sorted(settings.rules.glob("*.yml"))
                ]
            warnings += _unconfigured_channels(settings, rules)
    http_warnings, http_problems = plain_http(settings, rules)
    warnings += http_warnings
    problems += http_problems
    console_warnings, console_problems = console_checks(settings)
    warnings += console_warnings
    problems += console_problems
    if problems:
        raise ConfigError(problems)
    return Bundle(rules, profiles, warnings)


def plain_http(settings: Settings, rules: RuleBook) -> tuple[list[str], list[str]]:
    """(warnings, problems) of plain http:// for the provider and forward URLs: a warning to
    loopback or where allowed, else a problem (`check` and `serve` both refuse it). The action
    kinds that post somewhere say where (`worker.act.specs.URLS`)."""
    warnings: list[str] = []
    problems: list[str] = []
    found = [
        (
            f"{settings.config_path}: provider.base_url",
            plain_http_problem(
                settings.provider.base_url,
                allowed=settings.provider.allow_insecure_http,
                key="provider.allow_insecure_http",
            ),
        )
    ]
    for name, url_of in URLS.items():
        for ruleset, rule, action in rules.actions(name):
            where = f"{ruleset.path}:{rule.line}: rule {rule.name!r}: {name}"
            url, allowed = url_of(action.params)
            found.append(
                (where, plain_http_problem(url, allowed=allowed, key="allow_insecure_http"))
            )
    for where, (warning, problem) in found:
        if warning is not None:
            warnings.append(f"{where}: {warning}")
        if problem is not None:
            problems.append(f"{where}: {problem}")
    return warnings, problems


def console_checks(settings: Settings) -> tuple[list[str], list[str]]:
    """(warnings, problems) of the console block: a token file that cannot be read or is empty
    is a problem, one others may read a warning; plain http:// to a hosted page off this
    machine a problem unless `console.allow_insecure_http`."""
    console = settings.console
    if console is None:
        return [], []
    where = f"{settings.config_path}: console"
    warnings: list[str] = []
    problems: list[str] = []
    path = console.token_file
    try:
        token = read_secret_file(path)
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{where}.token_file: cannot read {path}: {type(exc).__name__}")
    else:
        if not token:
            problems.append(f"{where}.token_file: {path} is empty")
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            warnings.append(
                f"{where}.token_file: {path} can be read by group or others"
                f" (mode {stat.S_IMODE(mode):o}); chmod 600 it"
            )
    if console.hosted_url is not None:
        warning, problem = plain_http_problem(
            console.hosted_url,
            allowed=console.allow_insecure_http,
            key="console.allow_insecure_http",
        )
        warnings += [f"{where}.hosted_url: {warning}"] if warning else []
        problems += [f"{where}.hosted_url: {problem}"] if problem else []
    return warnings, problems


def _unconfigured_channels(settings: Settings, rules: RuleBook) -> list[str]:
    """Rule alerts (and `escalate:` lists) naming a channel `notify` does not configure: those
    go to the log only."""
    configured = {name for name in ("slack", "email") if getattr(settings.notify, name)}
    warnings = []
    for channels_of, ruleset, rule, action in naming_channels(rules):
        missing = sorted(set(channels_of(action.params)) - configured)
        if missing:
            warnings.append(
                f"{ruleset.path}:{rule.line}: rule {rule.name!r} alerts on"
                f" {', '.join(missing)}, which notify does not configure: logged only"
            )
    for ruleset in rules.rulesets:
        missing = sorted(set(ruleset.escalate or ()) - configured)
        if missing:
            warnings.append(
                f"{ruleset.path}:{ruleset.escalate_line}: escalate names {', '.join(missing)},"
                " which notify does not configure: an overdue deposit's alert is logged only"
                " there"
            )
    return warnings


def naming_channels(
    rules: RuleBook,
) -> Iterator[tuple[Callable[[Mapping[str, Any]], Sequence[str]], RuleSet, Rule, Action]]:
    """Every action of a kind that names alert channels (`worker.act.specs.NAMED_CHANNELS`,
    each with how to read them), in kind order."""
    for name, channels_of in NAMED_CHANNELS.items():
        for ruleset, rule, action in rules.actions(name):
            yield channels_of, ruleset, rule, action
