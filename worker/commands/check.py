"""`depositd check`: config, rules and profiles, every problem at once (docs/commands.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from worker.config.profiles import Profiles
from worker.config.settings import Loaded, Settings, read_settings
from worker.errors import ConfigError, ProviderAuthError, ProviderError
from worker.provider.signing import Scheme, variants
from worker.rules import RuleBook
from worker.service.bundle import Bundle, load_bundle, naming_channels
from worker.service.wallets import name_note


def _files_problems(loaded: Loaded) -> list[str]:
    """With the config itself invalid: the problems of the rules and profiles it names, when
    it names them plainly (docs/commands.md: every problem at once)."""
    from worker.act.kinds import SPECS
    from worker.service.bundle import names_in_file

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
            names = names_in_file(profiles_path)  # its problems are reported once, there
    if rules_path is not None:
        try:
            rules = RuleBook.load(rules_path, profile_names=names, specs=SPECS)
        except ConfigError as exc:
            problems.extend(exc.problems)
        else:
            problems.extend(forward_secret_problems(rules))
    return problems


def forward_secret_problems(rules: RuleBook) -> list[str]:
    """Forward rules whose secret_env is unset or empty, or whose secret_file cannot be read:
    such a forward is never sent (docs/rules.md: forward is signed) until the secret is there.
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
    alerting = [f"{rs.path}:{rule.line}" for _, rs, rule, _ in naming_channels(rules)]
    if not alerting:
        return []
    more = f" and {len(alerting) - 1} more" if len(alerting) > 1 else ""
    return [
        f"{settings.config_path}: notify: no channel is configured, so the alerts of your rules"
        f" ({alerting[0]}{more}) are only written to the log; add notify.slack or notify.email"
        " to have them sent"
    ]


# Names reserved for examples and documentation (RFC 2606, RFC 6761): nothing real answers
# there, so a setting that names one was copied from an example and not filled in.
_PLACEHOLDER_TLDS = ("example", "invalid", "test")
_PLACEHOLDER_DOMAINS = ("example.com", "example.net", "example.org")


def is_placeholder_host(host: str) -> bool:
    """Whether `host` is a reserved example name such as `provider.example`."""
    host = host.lower().rstrip(".")
    return host.rpartition(".")[2] in _PLACEHOLDER_TLDS or any(
        host == d or host.endswith("." + d) for d in _PLACEHOLDER_DOMAINS
    )


def placeholder_hosts(settings: Settings) -> list[str]:
    """A warning for each setting that names a placeholder host (the Slack URL by its host
    alone: the rest of it is a secret)."""
    from urllib.parse import urlsplit

    named: list[tuple[str, str | None]] = [
        ("provider.base_url", urlsplit(settings.provider.base_url).hostname)
    ]
    if settings.console is not None and settings.console.hosted_url:
        named.append(("console.hosted_url", urlsplit(settings.console.hosted_url).hostname))
    email, slack = settings.notify.email, settings.notify.slack
    if email is not None:
        named.append(("notify.email.host", email.host))
        named.append(("notify.email.from", email.from_.rpartition("@")[2]))
        named.extend(("notify.email.to", to.rpartition("@")[2]) for to in email.to)
    if slack is not None:
        named.append(
            ("notify.slack.webhook_url", urlsplit(slack.webhook_url.get_secret_value()).hostname)
        )
    return [
        f"{settings.config_path}: {key}: {host} is a placeholder name (reserved for examples);"
        " put the real one"
        for key, host in named
        if host and is_placeholder_host(host)
    ]


async def online_problems(
    settings: Settings, bundle: Bundle
) -> tuple[list[str], list[str], list[str]]:
    """(problems, notes, summary) of `check --online`: profiles whose `provider` the options
    endpoint does not offer, and rule sets and profile fallbacks naming a wallet the provider's
    wallet list does not hold (`worker.service.wallets`); the summary says what was checked."""
    from worker.provider.client import ProviderClient
    from worker.service.wallets import wallet_problems

    async with ProviderClient.from_settings(settings.provider, retries=1) as client:
        names = await client.options()
        listed = await client.list_wallets()
    problems = bundle.profiles.provider_problems(names)
    wallets, notes = wallet_problems(bundle.rules, bundle.profiles, listed)
    return problems + wallets, notes, online_summary(settings, len(names), len(listed))


def online_summary(settings: Settings, providers: int, wallets: int) -> list[str]:
    """What `check --online` checked against the provider, and what it cannot check: the
    webhook secret, which only the provider signs with (docs/operator.md)."""
    from worker.ingest.secret_watch import REFUSALS_IN_A_ROW

    return [
        f"online: {settings.provider.base_url} accepted signed requests (provider.api_key,"
        f" provider.api_secret, provider.signature); its {providers} payer providers and"
        f" {wallets} wallets cover what the profiles and rules name",
        "online: the webhook secret and API key cannot be tested from here (the provider signs"
        " its deliveries, depositd only verifies them): compare webhook.secret and"
        " webhook.api_key with the provider's dashboard; once serve runs, a refused delivery"
        f" shows in `depositd status` (webhookRefusals), and {REFUSALS_IN_A_ROW} in a row with"
        " none accepted alert (critical)",
    ]


async def accepted_scheme(settings: Settings) -> Scheme | None:
    """The first other known scheme (fewest settings changed) under which the provider answers
    the options endpoint, a signed read that changes nothing; None when it refuses them all.
    The parameter order is not tried: depositd sends parameters sorted, so it changes nothing
    it signs."""
    import aiohttp

    from worker.provider.client import ProviderClient

    provider = settings.provider
    configured = provider.scheme
    async with aiohttp.ClientSession() as session:
        for scheme in variants(configured):
            if scheme.params != configured.params:
                continue
            client = ProviderClient(
                provider.base_url,
                provider.api_key.get_secret_value(),
                provider.api_secret.get_secret_value(),
                scheme=scheme,
                timeout_s=provider.timeout_s,
                retries=0,
                session=session,
                max_answer_bytes=provider.max_answer_bytes,
            )
            try:
                await client.options()
            except ProviderAuthError:
                continue
            return scheme
    return None


def refused_as_unauthorised(settings: Settings, exc: ProviderError) -> None:
    """Print what `check --online` found when the provider refused the configured scheme."""
    configured = settings.provider.scheme
    print(
        f"provider: the options endpoint refused the request as unauthorised: {exc}",
        file=sys.stderr,
    )
    try:
        other = asyncio.run(accepted_scheme(settings))
    except ProviderError as again:
        print(f"provider: could not try the other signature schemes: {again}", file=sys.stderr)
        return
    if other is None:
        print(
            "provider: no known signature scheme is accepted either (tried every one);"
            " check provider.api_key, provider.api_secret and this machine's clock",
            file=sys.stderr,
        )
        return
    lines = ", ".join(f"provider.{line}" for line in other.changes_from(configured))
    print(
        f"provider: it accepts {other.describe()}, not {configured.describe()}:"
        f" put {lines} in {settings.config_path} (docs/signatures.md)",
        file=sys.stderr,
    )


def database_line(settings: Settings) -> tuple[bool, str]:
    """What an acknowledged webhook survives with this database (`check --online`): SQLite's
    from `storage.synchronous`, PostgreSQL's read from the server; (False, the error) when it
    cannot be reached."""
    from worker.store.durability import durability_line, postgres_durability, sqlite_durability
    from worker.store.errors import StoreError

    storage = settings.storage
    if storage.url is None:
        promise = sqlite_durability(storage.synchronous)
        return True, f"database: {storage.where}: {durability_line(promise)}"
    from worker.store.pgstore import command_connection

    try:
        conn = command_connection(storage)
        try:
            promise = postgres_durability(conn)
        finally:
            conn.close()
    except StoreError as exc:
        return False, f"database: {exc}"
    return True, f"database: {storage.where}: {durability_line(promise)}"


def signature_lines(settings: Settings) -> list[str]:
    """The schemes in force, as `check` prints them."""
    return [
        f"provider requests signed with {settings.provider.scheme.describe()}",
        f"webhooks verified with {settings.webhook.scheme.describe()}",
    ]


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
    warnings = [*bundle.warnings, *silent_alerts(settings, bundle.rules)]
    for warning in [*warnings, *placeholder_hosts(settings)]:
        print(f"warning: {warning}", file=sys.stderr)
    # Checked here, not in load_bundle: serve starts without the secret (each forward waits
    # for it, alerting once); check, run where serve runs, says so before it matters.
    missing = forward_secret_problems(bundle.rules)
    for problem in missing:
        print(problem, file=sys.stderr)
    if missing:
        return 2
    online = getattr(args, "online", False)
    if not online:
        for note in filter(None, map(name_note, bundle.rules.rulesets)):
            print(f"note: {note}", file=sys.stderr)
    summary: list[str] = []
    if online:
        try:
            bad, notes, summary = asyncio.run(online_problems(settings, bundle))
        except ProviderAuthError as exc:
            refused_as_unauthorised(settings, exc)
            return 1
        except ProviderError as exc:
            print(f"provider: options or wallet list failed: {exc}", file=sys.stderr)
            return 1
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        reached, database = database_line(settings)
        print(database, file=sys.stderr if not reached else sys.stdout)
        if not reached:
            return 1
        if bad:
            for problem in bad:
                print(problem, file=sys.stderr)
            return 2
    print(
        f"ok: {settings.config_path}: {len(bundle.rules.rulesets)} rule set(s), "
        f"{len(bundle.profiles.names())} profile(s)"
    )
    for line in [*signature_lines(settings), *summary]:
        print(line)
    return 0
