"""What the demo's scenarios share: the running demo, named expectations, a scenario's result."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TextIO

from worker.dev.harness import Stack
from worker.provider.models import WhiteListStatus
from worker.store.facts import sources_and_facts
from worker.track.tracker import Deposit, Fact, State, observe


@dataclass
class Result:
    """How one scenario ended."""

    got: str
    ok: bool


@dataclass
class Checks:
    """Named expectations of a scenario; the failed ones become its `got`."""

    failed: list[str] = field(default_factory=list)

    def expect(self, what: str, holds: bool) -> None:
        """Record one expectation."""
        if not holds:
            self.failed.append(what)

    def result(self, summary: str) -> Result:
        """`summary` when everything held, else what did not."""
        if self.failed:
            return Result("NOT " + "; NOT ".join(self.failed) + f" ({summary})", False)
        return Result(summary, True)


class Demo:
    """The running demo: the stack, the console, and the deposits of the current scenario."""

    def __init__(self, stack: Stack, out: TextIO) -> None:
        self.stack = stack
        self.out = out
        self.txs: list[str] = []

    def say(self, text: str = "") -> None:
        """One console line."""
        print(text, file=self.out, flush=True)

    def step(self, text: str) -> None:
        """A step of the script."""
        self.say(f"  > {text}")

    def inject(self, wallet_id: int, currency: str, network: str, amount: str, source: str) -> str:
        """An on-chain deposit in the sandbox; returns its transactionId."""
        order = self.stack.sandbox.inject_deposit(wallet_id, currency, network, amount, source)
        tx = str(order["transactionId"])
        self.txs.append(tx)
        self.step(
            f"on chain: {amount} {currency} on {network} into wallet {wallet_id}"
            f" from {source} -> transaction {tx}"
        )
        return tx

    def sandbox_wls(self, tx: str) -> WhiteListStatus | None:
        """The sandbox's whiteListStatus of a deposit."""
        return self.stack.sandbox.state.orders[tx].white_list_status

    async def wait_submitted(self, tx: str) -> None:
        """Until the worker's submission put the deposit under review at the sandbox."""
        await self.stack.wait_for(
            lambda: self.sandbox_wls(tx) is WhiteListStatus.PENDING,
            what=f"payer details submitted for {tx}",
        )

    async def wait_state(self, tx: str, state: State) -> Deposit:
        """Until the worker tracks the deposit in `state`."""
        found: list[Deposit] = []

        async def reached() -> bool:
            deposit = await self.stack.deposit(tx)
            if deposit is not None and deposit.state is state:
                found.append(deposit)
                return True
            return False

        await self.stack.wait_for(reached, what=f"{tx} in state {state.value}")
        return found[-1]

    async def submits(self, tx: str) -> list[dict[str, Any]]:
        """The submit_profile actions of a deposit."""
        return [a for a in await self.stack.actions(tx) if a["action"] == "submit_profile"]

    async def ledger_rows(self, tx: str) -> list[dict[str, Any]]:
        """The ledger rows of a deposit."""
        return [r for r in await self.stack.ledger() if r["transaction_id"] == tx]

    async def state_of(self, tx: str) -> str:
        """The tracked state's name, or 'unknown'."""
        deposit = await self.stack.deposit(tx)
        return deposit.state.value if deposit is not None else "unknown"

    # --- what happened to one deposit --------------------------------------------------------

    async def show(self, tx: str) -> None:
        """Print the webhooks, transitions, actions, alerts and ledger rows of one deposit."""
        stack = self.stack
        deposit = await stack.deposit(tx)
        self.say(f"  deposit {tx}: state {deposit.state.value if deposit else 'unknown'}")
        self.say("    webhooks received:")
        events = await stack.events(tx)
        for e in events:
            self.say(f"      {e['event_type']:<28} {e['status']}")
        for d in stack.sandbox.deliverer.history:
            if d.reference_id == tx and d.state == "dropped":
                self.say(f"      {d.envelope['eventType']:<28} dropped by the sandbox (lost)")
        if not events:
            self.say("      (none)")
        self.say("    transitions:")
        transitions = await self._transitions(tx)
        for line in transitions or ["(none)"]:
            self.say(f"      {line}")
        self.say("    actions:")
        actions = await stack.actions(tx)
        for a in actions:
            rule = f"rule '{a['rule']}'" if a["rule"] else "system"
            key = f" key {a['idempotency_key'][:12]}" if a["idempotency_key"] else ""
            profile = a["params"].get("profile")
            named = f" profile {profile}" if a["action"] == "submit_profile" and profile else ""
            self.say(
                f"      {a['action']:<14} on {a['trigger']:<16} {rule}{named}{key}"
                f" -> {a['status']}: {a['outcome'] or ''}"
            )
        if not actions:
            self.say("      (none)")
        alerts = [f"slack: {p['text'].split(' | ')[0]}" for p in stack.slack_for(tx)]
        # One line each: a folded or padded header is shown with single spaces.
        alerts += [f"e-mail: {' '.join(str(m['Subject']).split())}" for m in stack.emails_for(tx)]
        self.say("    alerts received:")
        for line in alerts or ["(none)"]:
            self.say(f"      {line}")
        self.say("    ledger:")
        rows = await self.ledger_rows(tx)
        for r in rows:
            self.say(
                f"      {r['amount']} {r['currency']} on {r['network']}, wallet {r['wallet_id']},"
                f" trigger {r['trigger']}, booked {r['booked_at']}"
            )
        if not rows:
            self.say("      (nothing booked)")

    async def _transitions(self, tx: str) -> list[str]:
        """Replay the recorded facts through the tracker: which fact fired which trigger."""
        rows = await self.stack.store.read(lambda db: sources_and_facts(db, tx))
        deposit: Deposit | None = None
        lines = []
        for row in rows:
            fact = Fact.from_json(json.loads(row["fact"]), observed_at=row["observed_at"])
            deposit, fired = observe(deposit, fact)
            origin = fact.event_type if fact.source == "webhook" else f"{fact.source}"
            lines += [f"{t.key:<16} from {origin} -> {deposit.state.value}" for t in fired]
        return lines


# --- the scenarios ---------------------------------------------------------------------------
