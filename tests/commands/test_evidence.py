"""`depositd evidence` and `depositd verify-evidence` through the command line, on a real
database of either engine: a bundle verifies on its own and fails once a byte of it changes;
payer values are in it only with `--with-personal-data`, which says so and is journaled."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.configs import make_config, write_config
from tests.support.stores import StoreMaker
from worker.commands import evidence as evidence_command
from worker.commands.cli import main
from worker.logs import configure
from worker.provider.jsonio import dumpb
from worker.provider.signing import HEADER_TIMESTAMP
from worker.store import conflicts, journal, operator, retention, submissions
from worker.store.actions import insert_action
from worker.store.evidence_file import encode
from worker.store.sqlitestore import event_row
from worker.track.processor import Processor

TX = "tx-evidence-1"
T0 = 1_700_000_000_000
# The payer details submitted: every value is searched for in the bundles.
PAYER = {
    "correspondentType": "ENTITY",
    "fullName": "Quillon Marsh Holdings Ltd",
    "countryCode": "SG",
    "companyAddress": "44 Quillon Crescent, Singapore",
    "walletType": "VASP",
    "provider": "Binance",
    "walletLabel": "Quillon treasury wallet",
    "addressType": "STANDARD",
}
LEDGER = {
    "transaction_id": TX,
    "wallet_id": 1001,
    "wallet_name": "main",
    "currency": "USDT",
    "network": "TRON",
    "amount": "1250.125",
    "from_address": "TQuillonSource0000000000000000001",
    "tx_hash": "0xfeedbeef",
    "booked_at": "2026-03-04T05:06:07.000Z",
    "trigger": "credited",
}
RULES_HASH = "ab" * 32


def envelope(event_id: str, event_type: str, t: int, **data: Any) -> dict[str, Any]:
    """A deposit webhook envelope about TX."""
    return {
        "eventId": event_id,
        "eventType": event_type,
        "referenceId": TX,
        "status": "PROCESSING",
        "timestamp": T0 + t,
        "data": {
            "transactionId": TX,
            "amount": LEDGER["amount"],
            "currency": "USDT",
            "network": "TRON",
            "walletId": 1001,
            "walletName": "main",
            "fromAddress": LEDGER["from_address"],
            "transactionHash": LEDGER["tx_hash"],
            "status": "PROCESSING",
            **data,
        },
    }


def _deposit_rows(db: Any) -> None:
    """What the flow writes for TX: a submission with its entry, the booking with its entry,
    an operator's approval, its day's reconciliation."""
    action_id = insert_action(
        db,
        transaction_id=TX,
        event_id="ev-1",
        trigger="needs_details",
        rule_set="wallet-1001.yaml",
        rule_set_version="v123",
        rule="auto-submit",
        action="submit_profile",
        params=json.dumps({"profile": "quillon", "content_hash": "c0ffee", "named": True}),
        idempotency_key="key-1",
        status="done",
        outcome="accepted: whiteListStatus pending",
    )
    digest = submissions.record_sent(
        db,
        action_id=action_id,
        transaction_id=TX,
        profile="quillon",
        body=PAYER,
        sent_at="2026-03-04T05:00:00.000Z",
        outcome="accepted",
    )
    journal.append(
        db,
        journal.SUBMITTED,
        TX,
        {
            "action_id": action_id,
            "profile": "quillon",
            "fields": submissions.field_names(PAYER),
            "payload_sha256": digest,
            "rule_set": "wallet-1001.yaml",
            "rule_set_version": "v123",
            "rules_hash": RULES_HASH,
            "outcome": "accepted",
        },
    )
    operator.record(
        db, "submit_profile", TX, note="approved on the phone", outcome="queued", remote="ana@::1"
    )
    names = ", ".join(LEDGER)
    db.execute(
        f"INSERT INTO ledger ({names}) VALUES ({', '.join('?' * len(LEDGER))})",
        list(LEDGER.values()),
    )
    body = {
        **journal.ledger_body(LEDGER),
        "rule_set": "wallet-1001.yaml",
        "rule_set_version": "v123",
        "rules_hash": RULES_HASH,
        "event_id": "ev-2",
    }
    journal.append(db, journal.BOOKED, TX, body)
    db.execute(
        "INSERT INTO reconcile_runs (day, started_at, finished_at, outcome, findings,"
        " ledger_mark) VALUES ('2026-03-04', '2026-03-05T02:30:00.000Z',"
        " '2026-03-05T02:30:01.000Z', 'clean', 0, '1:abc')"
    )
    (finding,) = db.execute(
        "INSERT INTO findings (day, kind, subject, transaction_id, tx_hash, ledger_amount,"
        " report_amount, first_seen, acknowledged_by, acknowledged_at, note) VALUES"
        " ('2026-03-04', 'amount_differs', '0XFEEDBEEF', NULL, '0XFEEDBEEF', '1250.125',"
        " '1250.12', '2026-03-05T02:30:01.000Z', 'bo', '2026-03-05T09:00:00.000Z',"
        " 'rounding at the provider') RETURNING id"
    ).fetchone()
    operator.record(
        db, "ack_finding", f"finding#{finding}", note="rounding at the provider",
        outcome="acknowledged", remote="bo@::1",
    )  # fmt: skip
    conflicts.insert_conflict(
        db, TX, "amount", fixed_value="1250.125", seen_value="1250.13", source="poll",
        event_id=None, observed_at=T0, now="2026-03-04T03:00:00.000Z",
    )  # fmt: skip
    conflicts.record_decision(
        db, TX, "amount", "1250.125", by="cy", note="the chain says so", now="2026-03-04T04:00Z"
    )
    journal.append(
        db,
        journal.RECONCILED,
        "day:2026-03-04",
        {"day": "2026-03-04", "outcome": "clean", "findings": 0, "ledger_mark": "1:abc"},
    )


def _others(db: Any) -> None:
    """Entries about other deposits, after TX's: the proof runs past them to the head."""
    for n in range(5):
        journal.append(db, journal.HELD, f"tx-other-{n}", {"reason": "no profile"})


async def _fill(store: Any) -> None:
    await store.open()
    for n, (event_type, data) in enumerate(
        (
            ("DEPOSIT_WHITELIST_REQUIRED", {}),
            ("DEPOSIT_WHITELIST_CREDITED", {"creditTime": 1_772_600_767_000}),
        ),
        start=1,
    ):
        ev = envelope(f"ev-{n}", event_type, n, **data)
        headers = {HEADER_TIMESTAMP: str(T0 + n), "Content-Type": "application/json"}
        await store.queue_event(
            event_row(
                ev["eventId"], event_type, TX, TX, dumpb(ev), headers, f"2026-03-04T0{n}:00:00.000Z"
            )
        )
    await Processor(store).run_until_idle()
    await store.write(_deposit_rows)
    await store.write(_others)
    await store.close()


@pytest.fixture(autouse=True)
def logs_to_stderr() -> None:
    """Keep log lines out of stdout, which the tests read."""
    configure("console", "warning", stream=sys.stderr)


@pytest.fixture
async def config(tmp_path: Path, make_store: StoreMaker) -> Path:
    """A database holding TX's webhooks, facts, submission, booking, approval and
    reconciliation, with their journal entries; on SQLite and on PostgreSQL."""
    webhook = {"secret": ["ws-old", "ws-new"], "tolerance_s": 120}
    path = write_config(tmp_path, make_config(make_store.storage(), webhook=webhook))
    await _fill(make_store())
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the CLI; (exit status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def write_bundle(
    capsys: pytest.CaptureFixture[str], config: Path, out: Path, *extra: str
) -> tuple[str, str]:
    status, stdout, stderr = run(
        capsys, "evidence", TX, "--out", str(out), "--by", "audit-desk", "--config", str(config),
        *extra,
    )  # fmt: skip
    assert status == 0, stderr
    return stdout, stderr


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included, and the decoded webhook bodies."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield key
            yield from strings(inner)
            if key == "body_base64":
                yield base64.b64decode(inner).decode("utf-8", "replace")
    elif isinstance(value, list):
        for inner in value:
            yield from strings(inner)


def payer_values_in(data: bytes) -> list[str]:
    """The payer values found in a bundle file: as a whole string anywhere, or inside one
    (the longer ones), or in its raw bytes."""
    found = []
    texts = list(strings(json.loads(data)))
    for value in PAYER.values():
        inside = len(value) >= 6 and (value.encode() in data or any(value in t for t in texts))
        if inside or value in texts:
            found.append(value)
    return found


def verify(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> tuple[int, str, str]:
    return run(capsys, "verify-evidence", str(path), *extra)


def test_a_bundle_verifies_on_its_own(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bundle holds the deposit's webhooks as received (with how they were checked), its
    facts, the rule that matched and the provider's answer, the submission's field names and
    hash, the operators' decisions (an approval, a finding on its txHash acknowledged, a
    conflict decided), the ledger row, its day's run and findings, and the journal entries with
    a proof up to the head; verify-evidence checks it without the database (exit 0, the head)."""
    out = tmp_path / "evidence.json"
    stdout, stderr = write_bundle(capsys, config, out)
    assert "personal data" not in stderr
    data = out.read_bytes()
    doc = json.loads(data)
    assert journal.canonical(doc) == data
    assert doc["sha256"] == journal.sha256_hex(journal.canonical(doc["bundle"]))
    assert out.stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob("*.partial"))
    bundle = doc["bundle"]
    webhooks = bundle["webhooks"]
    assert [e["event_id"] for e in webhooks["events"]] == ["ev-1", "ev-2"]
    first = webhooks["events"][0]
    assert json.loads(base64.b64decode(first["body_base64"]))["eventId"] == "ev-1"
    assert json.loads(first["body_text"])["eventType"] == "DEPOSIT_WHITELIST_REQUIRED"
    assert first["headers"][HEADER_TIMESTAMP] == str(T0 + 1)
    checks = webhooks["checks_at_receipt"]
    assert checks["signature_scheme"].startswith("published (HMAC-SHA256")
    assert checks["secrets_configured"] == 2
    assert any("API-SIGNATURE verified" in c for c in checks["stored_only_after"])
    assert any("within 120 s" in c for c in checks["stored_only_after"])
    assert {f["source"] for f in bundle["facts"]} == {"webhook"}
    assert bundle["facts"][0]["from"] == "webhook event ev-1"
    (matched,) = bundle["rules"]["matched"]
    assert (matched["trigger"], matched["rule_set"], matched["rule"]) == (
        "needs_details",
        "wallet-1001.yaml",
        "auto-submit",
    )
    assert bundle["rules"]["rules_hashes"] == [RULES_HASH]
    assert bundle["provider_answers"][0]["outcome"] == "accepted: whiteListStatus pending"
    (sent,) = bundle["submissions"]
    assert sent["fields"] == sorted(PAYER) and "payload" not in sent
    assert sent["payload_sha256"] == submissions.payload_sha256(PAYER)
    approval, ack = bundle["operator"]["actions"]
    assert (approval["by"], approval["note"]) == ("ana@::1", "approved on the phone")
    assert (ack["by"], ack["kind"], ack["outcome"]) == ("bo@::1", "ack_finding", "acknowledged")
    (acknowledged,) = bundle["operator"]["findings_acknowledged"]
    assert (acknowledged["kind"], acknowledged["acknowledged_by"]) == ("amount_differs", "bo")
    (conflict,) = bundle["operator"]["conflicts"]
    assert (conflict["seen_value"], conflict["decided_value"], conflict["decided_by"]) == (
        "1250.13",
        "1250.125",
        "cy",
    )
    assert bundle["ledger"] == LEDGER
    (day,) = bundle["reconciliation"]
    assert day["day"] == "2026-03-04" and day["runs"][0]["outcome"] == "clean"
    assert [f["kind"] for f in day["findings"]] == ["amount_differs"]
    entries = bundle["journal"]["entries"]
    kinds = [e["kind"] for e in entries]
    assert kinds[:3] == [journal.SUBMITTED, journal.BOOKED, journal.RECONCILED]
    assert "tx-other-0" not in {e["subject"] for e in entries}
    proof = bundle["journal"]["proof"]
    head = journal.Head.parse(proof["head"])
    assert head.seq == entries[-1]["seq"] + 5 and len(proof["digests"]) == head.seq
    assert "written to" in stdout and f"head {proof['head']}" in stdout

    status, stdout, _ = verify(capsys, out)
    assert status == 0
    assert f"head {proof['head']}" in stdout.splitlines()
    assert "kept outside the database" in stdout


def _flip(data: bytes, at: int) -> bytes:
    """The file with the character at `at` replaced by another of its kind (JSON stays valid)."""
    old = chr(data[at])
    new = "0" if old == "1" else "1" if old.isdigit() else "b" if old == "a" else "a"
    return data[:at] + new.encode() + data[at + 1 :]


def test_a_changed_byte_fails_it(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One byte changed in a webhook's body, a journal entry, the proof, the sha256 or the
    ledger row: exit 3 naming what does not hold."""
    out = tmp_path / "evidence.json"
    write_bundle(capsys, config, out)
    data = out.read_bytes()
    text = data.decode()
    bundle = json.loads(data)["bundle"]
    entry = bundle["journal"]["entries"][0]
    places = {
        "a webhook body": text.index(bundle["webhooks"]["events"][0]["body_base64"]) + 10,
        "an entry's body": text.index('"payload_sha256":"' + entry["body"]["payload_sha256"]) + 20,
        "an entry's hash": text.index(entry["hash"]) + 5,
        "a proof digest": text.index(bundle["journal"]["proof"]["digests"][-1]) + 7,
        "the head": text.index(bundle["journal"]["proof"]["head"]) + 4,
        "the ledger row": text.index('"amount":"1250.125"') + 12,
        "the sha256": text.rindex('"sha256":"') + 15,
    }
    for what, at in places.items():
        changed = tmp_path / "changed.json"
        changed.write_bytes(_flip(data, at))
        status, stdout, _ = verify(capsys, changed)
        assert status == 3, what
        assert "does not verify" in stdout and "sha256" in stdout, what


def _forged(path: Path, change: Any) -> bytes:
    """The bundle changed by `change(bundle)` and sealed again with a fresh sha256, as someone
    who edits a bundle would: only the journal shows it."""
    bundle = json.loads(path.read_bytes())["bundle"]
    change(bundle)
    return journal.canonical(
        {"bundle": bundle, "sha256": journal.sha256_hex(journal.canonical(bundle))}
    )


def test_an_edit_sealed_again_is_found_by_the_journal(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle edited and given a new sha256: the ledger row against its booked entry, the
    submission's hash against its entry, an entry against its digest, a proof digest against
    the chain, a body against its other forms, a day's run against its reconciled entry; each
    exit 3 naming it."""
    out = tmp_path / "evidence.json"
    write_bundle(capsys, config, out)

    def amount(b: dict[str, Any]) -> None:
        b["ledger"]["amount"] = "1350.125"

    def payload_hash(b: dict[str, Any]) -> None:
        b["submissions"][0]["payload_sha256"] = "0" * 64

    def entry_body(b: dict[str, Any]) -> None:
        b["journal"]["entries"][1]["body"]["amount"] = "1350.125"
        b["ledger"]["amount"] = "1350.125"

    def proof_digest(b: dict[str, Any]) -> None:
        b["journal"]["proof"]["digests"][-1] = "0" * 64

    def body_text(b: dict[str, Any]) -> None:
        event = b["webhooks"]["events"][0]
        event["body_text"] = event["body_text"].replace("1250.125", "1350.125")

    def no_ledger(b: dict[str, Any]) -> None:
        b["ledger"] = None

    def dropped_submission(b: dict[str, Any]) -> None:
        b["submissions"] = []

    def run_outcome(b: dict[str, Any]) -> None:
        b["reconciliation"][0]["runs"][0]["outcome"] = "findings"

    expected = {
        amount: "the ledger row's amount is not what journal entry 2 (booked) holds",
        payload_hash: "submission of action 1 has no submitted journal entry with its payload",
        entry_body: "journal entry 2: its content does not match its digest",
        proof_digest: "the proof's chain does not end at the head",
        body_text: "webhook event ev-1: its body's forms disagree",
        no_ledger: "journal entry 2 (booked) records a ledger row, and the bundle holds none",
        dropped_submission: "journal entry 1 records the submission of action",
        run_outcome: "journal entry 3 (reconciled): no run of 2026-03-04 in the bundle is its",
    }
    for change, message in expected.items():
        forged = tmp_path / "forged.json"
        forged.write_bytes(_forged(out, change))
        status, stdout, _ = verify(capsys, forged)
        assert status == 3, change.__name__
        assert message in stdout, (change.__name__, stdout)


def test_payer_values_only_with_the_flag_which_is_said_and_journaled(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], make_store: StoreMaker
) -> None:
    """Without --with-personal-data no payer value is anywhere in the bundle; with it every
    value is, stderr says the file holds personal data, an `exported` entry names who and the
    file, and the values hash to the journaled payload hash. No value is printed either way."""
    plain = tmp_path / "plain.json"
    stdout, stderr = write_bundle(capsys, config, plain)
    assert payer_values_in(plain.read_bytes()) == []
    full = tmp_path / "with-payer.json"
    stdout2, stderr2 = write_bundle(capsys, config, full, "--with-personal-data")
    assert sorted(payer_values_in(full.read_bytes())) == sorted(PAYER.values())
    assert "holds personal data" in stderr2 and "by audit-desk" in stderr2
    for text in (stdout, stderr, stdout2, stderr2):
        assert not [v for v in PAYER.values() if len(v) > 2 and v in text]
    bundle = json.loads(full.read_bytes())["bundle"]
    assert bundle["with_personal_data"] is True
    assert bundle["submissions"][0]["payload"] == PAYER
    exported = [e for e in bundle["journal"]["entries"] if e["kind"] == journal.EXPORTED]
    assert [e["body"] for e in exported] == [
        {"by": "audit-desk", "with_personal_data": True, "file": "with-payer.json"}
    ]
    status, stdout3, _ = verify(capsys, full)
    assert status == 0 and "with personal data" in stdout3
    # The export is in the database's journal, and in no bundle written without the flag.
    again = tmp_path / "again.json"
    write_bundle(capsys, config, again)
    kinds = [e["kind"] for e in json.loads(again.read_bytes())["bundle"]["journal"]["entries"]]
    assert journal.EXPORTED in kinds and payer_values_in(again.read_bytes()) == []

    def payer_edited(b: dict[str, Any]) -> None:
        b["submissions"][0]["payload"]["fullName"] = "Someone Else Ltd"

    forged = tmp_path / "forged.json"
    forged.write_bytes(_forged(full, payer_edited))
    status, stdout4, _ = verify(capsys, forged)
    assert status == 3 and "its payer values do not hash to the payload_sha256" in stdout4
    assert "Someone Else" not in stdout4


def test_an_unknown_deposit(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown transactionId: exit 1 naming it, no file written, no export journaled."""
    out = tmp_path / "evidence.json"
    for extra in ((), ("--with-personal-data",)):
        status, _, stderr = run(
            capsys, "evidence", "tx-nobody", "--out", str(out), "--by", "x", "--config",
            str(config), *extra,
        )  # fmt: skip
        assert status == 1 and "no deposit 'tx-nobody'" in stderr
        assert not out.exists() and not list(tmp_path.glob("*.partial"))
    write_bundle(capsys, config, out)
    entries = json.loads(out.read_bytes())["bundle"]["journal"]["entries"]
    assert journal.EXPORTED not in [e["kind"] for e in entries]


def test_what_is_not_a_bundle(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that is not JSON, JSON that is not a bundle, a missing file, an unreadable
    anchor: exit 2; an --out in no folder or onto the database: exit 2, nothing written."""
    cases = {
        "not-json.json": b"hello",
        "other.json": b'{"bundle":{"format":"something else"},"sha256":"x"}',
        "list.json": b"[1,2]",
        "nan.json": b'{"bundle":{"format":"depositd-evidence/1","x":NaN},"sha256":"0"}',
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        status, _, stderr = verify(capsys, path)
        assert status == 2 and "is not an evidence bundle" in stderr, name
    status, _, stderr = verify(capsys, tmp_path / "missing.json")
    assert status == 2 and "cannot read" in stderr
    out = tmp_path / "evidence.json"
    write_bundle(capsys, config, out)
    status, _, stderr = verify(capsys, out, "--anchor", "12")
    assert status == 2 and "SEQ:HASH" in stderr
    for target in (tmp_path / "no-folder" / "e.json", tmp_path):
        status, _, stderr = run(
            capsys, "evidence", TX, "--out", str(target), "--by", "x", "--config", str(config)
        )
        assert status == 2 and "evidence refused" in stderr, target


def test_an_anchor_on_the_proof(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--anchor SEQ:HASH: a head kept elsewhere that the proof's chain passes through verifies;
    another hash at that place, or a place outside the proof, does not (exit 3)."""
    out = tmp_path / "evidence.json"
    write_bundle(capsys, config, out)
    entries = json.loads(out.read_bytes())["bundle"]["journal"]["entries"]
    booked = journal.Entry.from_json(entries[1])
    status, stdout, _ = verify(capsys, out, "--anchor", f"{booked.seq}:{booked.hash}")
    assert status == 0 and f"anchor {booked.seq}:{booked.hash}: on the proof's chain" in stdout
    status, stdout, _ = verify(capsys, out, "--anchor", f"{booked.seq}:{'0' * 64}")
    assert status == 3 and "does not pass through the anchor" in stdout
    status, stdout, _ = verify(capsys, out, "--anchor", f"99:{booked.hash}")
    assert status == 3 and "outside the proof" in stdout


def test_the_proof_is_written_in_chunks_and_never_partially(
    config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Digests read a few at a time make the same file as all at once; a write that fails half
    way leaves the file already there as it was and no temporary file."""
    monkeypatch.setattr(evidence_command, "DIGESTS_CHUNK", 3)
    out = tmp_path / "evidence.json"
    write_bundle(capsys, config, out)
    doc = json.loads(out.read_bytes())
    bundle = doc["bundle"]
    digests = bundle["journal"]["proof"].pop("digests")
    assert len(digests) > 3 * 2
    bundle["journal"]["proof"] = {**bundle["journal"]["proof"]}
    assert encode(bundle, digests) == out.read_bytes()
    assert verify(capsys, out)[0] == 0

    before = out.read_bytes()
    calls = []

    def failing(*args: Any, **kw: Any) -> list[str]:
        calls.append(1)
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return ["0" * 64] * 3

    monkeypatch.setattr(evidence_command.evidence, "digests", failing)
    status, _, stderr = run(
        capsys, "evidence", TX, "--out", str(out), "--by", "x", "--config", str(config)
    )
    assert status == 1 and "No space left" in stderr
    assert out.read_bytes() == before
    assert not list(tmp_path.glob("*.partial"))


def test_a_bundle_after_retention_still_proves_what_was_sent(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], make_store: StoreMaker
) -> None:
    """Once retention removed the payer values, a bundle (even with --with-personal-data)
    holds none, names the purge entry, and still verifies: the hash and field names kept are
    those the submission's entry holds."""

    def finish_and_purge(db: Any) -> None:
        db.execute("UPDATE deposits SET state = 'completed' WHERE transaction_id = ?", [TX])
        chunk = retention.purge_chunk(db, before="2999-01-01T00:00:00.000Z", days=30)
        assert chunk.purged

    async def purge() -> None:
        store = make_store()
        await store.open()
        await store.write(finish_and_purge)
        await store.close()

    asyncio.run(purge())
    out = tmp_path / "purged.json"
    _, stderr = write_bundle(capsys, config, out, "--with-personal-data")
    assert "holds no payer value" in stderr
    assert payer_values_in(out.read_bytes()) == []
    bundle = json.loads(out.read_bytes())["bundle"]
    (sent,) = bundle["submissions"]
    assert sent["payload"] is None and sent["purged_at"]
    assert sent["payload_sha256"] == submissions.payload_sha256(PAYER)
    (purged,) = [e for e in bundle["journal"]["entries"] if e["kind"] == journal.PURGED]
    assert purged["body"]["action_ids"] == [sent["action_id"]]
    status, stdout, _ = verify(capsys, out)
    assert status == 0, stdout
