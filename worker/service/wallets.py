"""Rule sets and profiles checked against the wallets the provider lists (GET /v1/wallet/list).

A rule set keyed by a walletId or walletName the provider does not list never applies: that
wallet's deposits fall back to the `"*"` rule set (a typo such as "Main USD" for "Main USDT"
books every deposit with the thresholds of the wallet's own rules ignored). A `wallets:`
fallback of the profiles file for an unlisted walletId never applies either. `check --online`
fails for each (exit 2) and `serve` warns at start; each names the file, the line and the
closest names the provider lists (docs/operator.md). A rule set keyed by a walletName matches
names exactly: case and spaces count.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from worker.config.profiles import Profiles
from worker.provider.resources import WalletGroup
from worker.rules import RuleBook
from worker.rules.model import ANY_WALLET, RuleSet

_SHOWN = 3  # closest names given with a problem


def name_note(ruleset: RuleSet) -> str | None:
    """What a rule set keyed by a walletName matches (exactly), for `check`; None otherwise."""
    if isinstance(ruleset.wallet, int) or ruleset.wallet == ANY_WALLET:
        return None
    return (
        f"{ruleset.path}:{ruleset.line}: wallet: {ruleset.wallet!r} is a walletName: it matches"
        f" deposits whose walletName is exactly {ruleset.wallet!r} (case and spaces count);"
        " `depositd check --online` compares it with the provider's wallet list"
    )


def _label(wallet_id: int, name: str | None) -> str:
    return f"{wallet_id} {name!r}" if name else str(wallet_id)


def _closest(wanted: str, choices: Mapping[str, str]) -> str:
    """`; closest: ...` from `choices` (compared text -> label), best first; all of them (up to
    a few) when none is close."""
    lowered = {text.lower(): label for text, label in choices.items()}
    near = difflib.get_close_matches(wanted.lower(), list(lowered), n=_SHOWN, cutoff=0.5)
    if near:
        return "; closest: " + ", ".join(lowered[n] for n in near)
    listed = list(choices.values())[: _SHOWN * 3]
    return "; the provider lists: " + (", ".join(listed) if listed else "no wallet")


def wallet_problems(
    rules: RuleBook, profiles: Profiles, listed: Sequence[WalletGroup]
) -> tuple[list[str], list[str]]:
    """(problems, notes): rule sets and profile fallbacks naming a wallet the provider does not
    list, and how each rule set keyed by name matched."""
    ids = {g.walletId: g.name for g in listed}
    by_name = {g.name: g.walletId for g in listed if g.name}
    by_id_text = {str(i): _label(i, n) for i, n in sorted(ids.items())}
    by_name_text = {n: _label(i, n) for n, i in sorted(by_name.items())}
    problems: list[str] = []
    notes: list[str] = []
    fallback = (
        'its deposits fall back to the "*" rule set'
        if any(rs.wallet == ANY_WALLET for rs in rules.rulesets)
        else "no rule applies to its deposits"
    )
    for rs in rules.rulesets:
        where = f"{rs.path}:{rs.line}: wallet:"
        if rs.wallet == ANY_WALLET:
            continue
        if isinstance(rs.wallet, int):
            if rs.wallet not in ids:
                problems.append(
                    f"{where} {rs.wallet} is not a walletId the provider lists, so this rule set"
                    f" never applies ({fallback}){_closest(str(rs.wallet), by_id_text)}"
                )
        elif rs.wallet in by_name:
            notes.append(
                f"{where} {rs.wallet!r} matches the provider's wallet"
                f" {by_name[rs.wallet]} by walletName, exactly (case and spaces count)"
            )
        else:
            problems.append(
                f"{where} {rs.wallet!r} is not a walletName the provider lists (names match"
                f" exactly: case and spaces count), so this rule set never applies ({fallback})"
                f"{_closest(rs.wallet, by_name_text)}"
            )
    for wallet_id, profile, line in profiles.wallet_fallbacks():
        if wallet_id not in ids:
            problems.append(
                f"{profiles.path}:{line}: wallets: {wallet_id} (profile {profile!r}) is not a"
                " walletId the provider lists, so this fallback never applies"
                f"{_closest(str(wallet_id), by_id_text)}"
            )
    return problems, notes
