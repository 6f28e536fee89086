"""`depositd check`: config, rules and profiles, every problem at once (SPEC section 3)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from worker.config.profiles import Profiles
from worker.config.settings import Loaded, Settings, read_settings
from worker.errors import ConfigError, ProviderError
from worker.rules import Action, Rule, RuleBook, RuleSet
from worker.urls import plain_http_problem

if TYPE_CHECKING:
    from worker.act.kinds import Kind


@dataclass
class Bundle:
    """What the worker acts on: rules and profiles, validated together."""

    rules: RuleBook
    profiles: Profiles
    warnings: list[str] = field(default_factory=list)


def load_bundle(settings: Settings) -> Bundle:
    """Load profiles then rules; `ConfigError` lists every problem of both."""
    from worker.act.kinds import SPECS

    problems: list[str] = []
    warnings: list[str] = []
    if settings.storage.synchronous == "NORMAL":
        warnings.append(
            "storage.synchronous: NORMAL; an event answered 200 can be lost on a power failure or"
            " an OS crash (FULL, the default, and EXTRA cannot)"
        )
    profiles = Profiles.empty()
    if settings.profiles is None:
        warnings.append("profiles: not set; submit_profile never finds a profile")
    else:
        try:
            profiles = Profiles.load(settings.profiles)
        except ConfigError as exc:
            problems.extend(exc.problems)
    rules = RuleBook.empty()
    if settings.rules is None:
        warnings.append("rules: not set; nothing acts (events are stored and tracked only)")
    else:
        try:
            rules = RuleBook.load(settings.rules, profile_names=profiles.names(), specs=SPECS)
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
    if problems:
        raise ConfigError(problems)
    return Bundle(rules, profiles, warnings)


def _files_problems(loaded: Loaded) -> list[str]:
    """With the config itself invalid: the problems of the rules and profiles it names, when
    it names them plainly (SPEC section 3: every problem at once)."""
    from worker.act.kinds import SPECS

    profiles_path = loaded.files.get("profiles")
    rules_path = loaded.files.get("rules")
    problems: list[str] = []
    names: set[str] | None = None  # profiles unknown or unreadable: rules may name any
    if "profiles" in loaded.files and profiles_path is None:
        names = set()  # not set: no profile exists, as in load_bundle
    elif profiles_path is not None:
        try:
            names = Profiles.load(profiles_path).names()
        except ConfigError as exc:
            problems.extend(exc.problems)
    if rules_path is not None:
        try:
            rules = RuleBook.load(rules_path, profile_names=names, specs=SPECS)
        except ConfigError as exc:
            problems.extend(exc.problems)
        else:
            problems.extend(forward_secret_problems(rules))
    return problems


def plain_http(settings: Settings, rules: RuleBook) -> tuple[list[str], list[str]]:
    """(warnings, problems) of plain http:// for the provider and forward URLs: a warning to
    loopback or where allowed, else a problem (`check` and `serve` both refuse it). The action
    kinds that post somewhere say where (`Kind.url`)."""
    from worker.act.kinds import KINDS

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
    for kind in KINDS.values():
        if kind.url is None:
            continue
        for ruleset, rule, action in rules.actions(kind.name):
            where = f"{ruleset.path}:{rule.line}: rule {rule.name!r}: {kind.name}"
            url, allowed = kind.url(action.params)
            found.append(
                (where, plain_http_problem(url, allowed=allowed, key="allow_insecure_http"))
            )
    for where, (warning, problem) in found:
        if warning is not None:
            warnings.append(f"{where}: {warning}")
        if problem is not None:
            problems.append(f"{where}: {problem}")
    return warnings, problems


def _unconfigured_channels(settings: Settings, rules: RuleBook) -> list[str]:
    """Rule alerts naming a channel `notify` does not configure: those go to the log only."""
    configured = {name for name in ("slack", "email") if getattr(settings.notify, name)}
    warnings = []
    for kind, ruleset, rule, action in _naming_channels(rules):
        missing = sorted(set(kind.channels(action.params) if kind.channels else ()) - configured)
        if missing:
            warnings.append(
                f"{ruleset.path}:{rule.line}: rule {rule.name!r} alerts on"
                f" {', '.join(missing)}, which notify does not configure: logged only"
            )
    return warnings


def _naming_channels(rules: RuleBook) -> Iterator[tuple[Kind, RuleSet, Rule, Action]]:
    """Every action of a kind that names alert channels (`Kind.channels`), in kind order."""
    from worker.act.kinds import KINDS

    for kind in KINDS.values():
        if kind.channels is not None:
            for ruleset, rule, action in rules.actions(kind.name):
                yield kind, ruleset, rule, action


def forward_secret_problems(rules: RuleBook) -> list[str]:
    """Forward rules whose secret_env is unset or empty, or whose secret_file cannot be read:
    such a forward is never sent (SPEC section 8: forward is signed) until the secret is there.
    Read from every action kind that signs with a secret (`Kind.secret_problem`)."""
    from worker.act.kinds import KINDS

    problems = []
    for kind in KINDS.values():
        if kind.secret_problem is None:
            continue
        for ruleset, rule, action in rules.actions(kind.name):
            problem = kind.secret_problem(action.params)
            if problem is not None:
                problems.append(
                    f"{ruleset.path}:{rule.line}: rule {rule.name!r}: {kind.name} {problem}; "
                    f"it would not be sent ({kind.name} is signed)"
                )
    return problems


def silent_alerts(settings: Settings, rules: RuleBook) -> list[str]:
    """A warning when rules alert but `notify` configures no channel: alerts are only logged."""
    if settings.notify.slack is not None or settings.notify.email is not None:
        return []
    alerting = [f"{rs.path}:{rule.line}" for _, rs, rule, _ in _naming_channels(rules)]
    if not alerting:
        return []
    more = f" and {len(alerting) - 1} more" if len(alerting) > 1 else ""
    return [
        f"{settings.config_path}: notify: no channel is configured, so the alerts of your rules"
        f" ({alerting[0]}{more}) are only written to the log; add notify.slack or notify.email"
        " to have them sent"
    ]


async def unknown_providers(settings: Settings, profiles: Profiles) -> list[str]:
    """Problems for profiles whose `provider` the options endpoint does not offer."""
    from worker.provider.client import ProviderClient

    async with ProviderClient.from_settings(settings.provider, retries=1) as client:
        names = await client.options()
    return profiles.provider_problems(names)


def run(args: argparse.Namespace) -> int:
    """Validate; print problems (exit 2) or a short summary (exit 0)."""
    loaded = read_settings(args.config)
    settings = loaded.settings
    if settings is None:
        for problem in [*loaded.problems, *_files_problems(loaded)]:
            print(problem, file=sys.stderr)
        return 2
    try:
        bundle = load_bundle(settings)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 2
    for warning in [*bundle.warnings, *silent_alerts(settings, bundle.rules)]:
        print(f"warning: {warning}", file=sys.stderr)
    # Checked here, not in load_bundle: serve starts without the secret (each forward waits
    # for it, alerting once); check, run where serve runs, says so before it matters.
    missing = forward_secret_problems(bundle.rules)
    for problem in missing:
        print(problem, file=sys.stderr)
    if missing:
        return 2
    if getattr(args, "online", False):
        try:
            bad = asyncio.run(unknown_providers(settings, bundle.profiles))
        except ProviderError as exc:
            print(f"provider: options endpoint failed: {exc}", file=sys.stderr)
            return 1
        if bad:
            for problem in bad:
                print(problem, file=sys.stderr)
            return 2
    print(
        f"ok: {settings.config_path}: {len(bundle.rules.rulesets)} rule set(s), "
        f"{len(bundle.profiles.names())} profile(s)"
    )
    return 0
