"""Action kinds: a kind registered in `KINDS` is accepted by the rules, recorded and run; the
submission refusal table covers the provider's wallet codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from worker.act.kinds import KINDS
from worker.act.kinds.base import Kind, Recording
from worker.act.kinds.submit import CODE_OUTCOMES
from worker.act.outbox import Outbox
from worker.act.queue import ActionRows
from worker.act.reactor import RuleReactor
from worker.clock import now_ms
from worker.config.profiles import Profiles
from worker.config.yamlsrc import Loc
from worker.errors import ConfigError
from worker.provider.client import ProviderClient
from worker.provider.codes import WALLET_CODES, WalletCode
from worker.provider.models import DepositOrder
from worker.rules import ActionSpec, ParamCheck, RuleBook
from worker.store.sqlitestore import Store
from worker.track.facts import fact_from_order
from worker.track.processor import Processor
from worker.track.tracker import Deposit, Fact

NOTE_RULES = """\
wallet: '*'
rules:
  - name: note it
    on: [needs_details]
    then: [{note: {text: '%s'}}]
"""


class NoteRunner:
    """Runs note rows: remembers what it ran, marks the row done."""

    ran: list[tuple[str | None, str]] = []

    def __init__(self, rows: ActionRows) -> None:
        self._rows = rows

    async def run(
        self,
        action_id: int,
        row: dict[str, Any],
        deposit: Deposit | None,
        params: dict[str, Any],
        attempts: int,
    ) -> None:
        NoteRunner.ran.append((deposit.transaction_id if deposit else None, params["text"]))
        await self._rows.finish(action_id, "done", "noted")

    async def close(self) -> None:
        return None


def check_note(file: ParamCheck, params: dict[str, Any], loc: Loc) -> dict[str, Any] | None:
    file.unknown_keys(params, loc, ("text",))
    if not isinstance(params.get("text"), str):
        file.bad((*loc, "text"), "must be a string")
        return None
    return {"text": params["text"]}


def record_note(rec: Recording) -> None:
    rec.add(params=dict(rec.intent.params))


NOTE = Kind(
    ActionSpec("note", check=check_note),
    record_note,
    runner=lambda deps: NoteRunner(deps.rows),
)


def order(tx: str) -> Fact:
    """The fact of a deposit waiting for payer details."""
    record = {
        "transactionId": tx,
        "transactionHash": "0xhash",
        "walletId": 1001,
        "walletName": "main",
        "currency": "USDT",
        "network": "TRON",
        "amount": "100",
        "fromAddress": "TQ5aXj8Tq6u2pG2Lw6xXw9zC3vGmZ5a1bB",
        "toAddress": "TMerchant",
        "status": "PROCESSING",
        "whiteListStatus": "init",
        "createTime": 1_700_000_000_000,
        "updateTime": 1_700_000_000_000,
    }
    return fact_from_order(
        DepositOrder.model_validate(record), sent_at=record.get("updateTime") or now_ms()
    )


async def test_a_registered_kind_is_accepted_recorded_and_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind added to KINDS is checked by the rule loader, recorded with the transition and run
    by the outbox after the commit, with nothing else changed."""
    monkeypatch.setitem(KINDS, "note", NOTE)  # type: ignore[index]
    monkeypatch.setattr(NoteRunner, "ran", [])
    specs = {name: kind.spec for name, kind in KINDS.items()}
    path = tmp_path / "rules.yaml"
    path.write_text(NOTE_RULES % "hello")
    rulebook = RuleBook.load(path, specs=specs)
    store = Store(tmp_path / "d.db")
    await store.open()
    client = ProviderClient("http://127.0.0.1:9", "key", "secret", retries=0)
    try:
        processor = Processor(store, reactor=RuleReactor(lambda: rulebook, Profiles.empty))
        await processor.observe_fact(order("TXN"))
        queued = await store.read(
            lambda db: [dict(r) for r in db.query("SELECT action, status, params FROM actions")]
        )
        assert queued == [{"action": "note", "status": "pending", "params": '{"text": "hello"}'}]
        outbox = Outbox(
            store,
            client=client,
            notifiers={},
            profiles=Profiles.empty,
            observe=processor.observe_fact,
        )
        await outbox.run_until_idle()
        done = await store.read(lambda db: [dict(r) for r in db.query("SELECT * FROM actions")])
    finally:
        await client.close()
        await store.close()
    assert NoteRunner.ran == [("TXN", "hello")]
    assert [(r["status"], r["outcome"]) for r in done] == [("done", "noted")]


def test_a_registered_kind_s_params_are_checked_by_the_rule_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule loader reports a bad parameter of a registered kind by file and line, and a
    kind not registered as an unknown action."""
    monkeypatch.setitem(KINDS, "note", NOTE)  # type: ignore[index]
    specs = {name: kind.spec for name, kind in KINDS.items()}
    path = tmp_path / "rules.yaml"
    path.write_text(NOTE_RULES.replace("text: '%s'", "text: [1]"))
    with pytest.raises(ConfigError) as bad:
        RuleBook.load(path, specs=specs)
    assert bad.value.problems == [f"{path}:5: rules[0].then[0].note.text: must be a string"]
    without = {name: spec for name, spec in specs.items() if name != "note"}
    path.write_text(NOTE_RULES % "hello")
    with pytest.raises(ConfigError) as unknown:
        RuleBook.load(path, specs=without)
    assert "unknown action 'note'" in unknown.value.problems[0]


def test_every_wallet_code_of_a_refused_submission_has_an_outcome() -> None:
    """Each wallet code the provider may refuse a submission with maps to what depositd does
    (10000104, "cannot submit now", is retried later before the table is read)."""
    listed = set(WALLET_CODES) - {WalletCode.CANNOT_SUBMIT_NOW.value}
    assert set(CODE_OUTCOMES) == listed
