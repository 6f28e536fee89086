"""The evidence file (docs/audit.md, "Evidence for one deposit"): one JSON document
`{"bundle": CONTENT, "sha256": SHA-256 of CONTENT's canonical encoding}`, itself written in the
canonical encoding (`journal.canonical`), so that its bytes are exactly the encoding of what it
holds and a changed byte shows.

`Encoder` writes it a chunk at a time: the content whole (a deposit's rows are few), then the
proof's digests as they are read, then the end. `check` is what `depositd verify-evidence` makes
of a file on its own, without the database: the encoding, the sha256, every journal entry and
the proof up to its head, and the rows the journal describes against their entries.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.store import journal
from worker.store.evidence import FORMAT
from worker.store.submissions import payload_sha256


class Encoder:
    """The bytes of one evidence file, in order: `start()`, `digests(...)` for every chunk of
    the proof's digests (none when the content has no proof), `end()`."""

    def __init__(self, content: Mapping[str, Any]) -> None:
        proof = content["journal"]["proof"]
        self.expected = 0
        if proof is None:
            self._before, self._after = journal.canonical(dict(content)), b""
        else:
            # The digests' place in the encoded content, marked by a text nothing else holds.
            marker = f"\x00digests:{secrets.token_hex(16)}"
            framed = {**content, "journal": {**content["journal"]}}
            framed["journal"]["proof"] = {**proof, "digests": marker}
            self._before, sep, self._after = journal.canonical(framed).partition(
                journal.canonical(marker)
            )
            assert sep, "the marker is in the encoding"
            self.expected = journal.Head.parse(proof["head"]).seq - int(proof["from"]) + 1
        self._proof = proof is not None
        self._hash = hashlib.sha256()
        self.written = 0  # digests so far

    def _out(self, data: bytes) -> bytes:
        self._hash.update(data)
        return data

    def start(self) -> bytes:
        """The document up to the proof's first digest (all of the content without a proof)."""
        return b'{"bundle":' + self._out(self._before + (b"[" if self._proof else b""))

    def digests(self, items: Sequence[str]) -> bytes:
        """The next digests of the proof."""
        if not items:
            return b""
        encoded = b",".join(journal.canonical(d) for d in items)
        if self.written:
            encoded = b"," + encoded
        self.written += len(items)
        return self._out(encoded)

    def end(self) -> bytes:
        """The rest of the content, and its sha256."""
        tail = self._out((b"]" if self._proof else b"") + self._after)
        return tail + b',"sha256":' + journal.canonical(self._hash.hexdigest()) + b"}"

    @property
    def sha256(self) -> str:
        """The content's SHA-256 (once `end` was called)."""
        return self._hash.hexdigest()


def encode(content: Mapping[str, Any], digests: Iterable[str] = ()) -> bytes:
    """A whole evidence file at once (tests, small bundles)."""
    encoder = Encoder(content)
    return encoder.start() + encoder.digests(list(digests)) + encoder.end()


class NotABundle(ValueError):
    """The file is not an evidence bundle at all (not JSON, or not its shape)."""


@dataclass(frozen=True)
class Verdict:
    """What `check` found: the first problem (None: the bundle verifies) and what it proves."""

    transaction_id: str
    problem: str | None
    head: journal.Head | None  # the head its proof ends at (None: no journal entry in it)
    entries: int
    with_personal_data: bool


def read(data: bytes) -> dict[str, Any]:
    """The document of an evidence file; `NotABundle` saying why it is not one."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is no JSON value")

    try:
        doc = json.loads(data, parse_constant=refuse)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise NotABundle(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or set(doc) != {"bundle", "sha256"}:
        raise NotABundle('not {"bundle": ..., "sha256": ...}')
    bundle = doc["bundle"]
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise NotABundle(f"its bundle's format is not {FORMAT}")
    return doc


def check(data: bytes, *, anchor: journal.Head | None = None) -> Verdict:
    """Check an evidence file on its own (`NotABundle` for a file that is not one)."""
    doc = read(data)
    bundle = doc["bundle"]
    entries: list[journal.Entry] = []
    proof = None
    problem = _encoding_problem(data, doc)
    if problem is None:
        try:
            entries = [journal.Entry.from_json(e) for e in bundle["journal"]["entries"]]
            proof = bundle["journal"]["proof"]
        except (KeyError, TypeError, ValueError) as exc:
            problem = f"the journal part is not readable ({exc})"
    if problem is None:
        problem = _journal_problem(entries, proof, anchor)
    if problem is None:
        problem = _content_problem(bundle, entries)
    head = None
    if isinstance(proof, dict):
        try:
            head = journal.Head.parse(str(proof.get("head")))
        except ValueError:
            head = None
    return Verdict(
        transaction_id=str(bundle.get("transaction_id")),
        problem=problem,
        head=head,
        entries=len(entries),
        with_personal_data=bundle.get("with_personal_data") is True,
    )


def _encoding_problem(data: bytes, doc: Mapping[str, Any]) -> str | None:
    if journal.canonical(doc) != data:
        return (
            "the file's bytes are not the canonical encoding of what it holds (changed after"
            " it was written?)"
        )
    if journal.sha256_hex(journal.canonical(doc["bundle"])) != doc["sha256"]:
        return "the bundle's content does not match its sha256 (changed after it was written?)"
    return None


def _journal_problem(
    entries: list[journal.Entry], proof: Any, anchor: journal.Head | None
) -> str | None:
    if proof is None:
        if entries:
            return "the bundle holds journal entries and no proof of them"
        if anchor is not None:
            return "the bundle holds no journal entry, so no proof to check an anchor against"
        return None
    if not isinstance(proof, dict):
        return "the proof is not readable"
    problem = journal.check_proof(proof, entries)
    if problem is None and anchor is not None:
        problem = _anchor_problem(proof, anchor)
    return problem


def _anchor_problem(proof: Mapping[str, Any], anchor: journal.Head) -> str | None:
    """Whether the proof's chain passes through `anchor` (a head kept outside the database)."""
    first, prev = int(proof["from"]), str(proof["prev_hash"])
    digests = [str(d) for d in proof["digests"]]
    last = first + len(digests) - 1
    if not first - 1 <= anchor.seq <= last:
        return (
            f"the anchor {anchor} is outside the proof (entries {first} to {last}): this"
            " bundle cannot check it; `depositd verify --anchor` checks it on the database"
        )
    for digest in digests[: anchor.seq - first + 1]:
        prev = journal.chain(prev, digest)
    if prev != anchor.hash:
        return f"the proof's chain does not pass through the anchor {anchor}"
    return None


def _content_problem(bundle: Mapping[str, Any], entries: list[journal.Entry]) -> str | None:
    """The first row of the bundle that disagrees with the journal entry about it (or with
    itself: a webhook body's forms)."""
    try:
        return (
            _webhook_problem(bundle["webhooks"]["events"])
            or _ledger_problem(bundle, entries)
            or _submission_problem(bundle, entries)
            or _reconciled_problem(bundle, entries)
            or _export_problem(bundle, entries)
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"a part of the bundle is not readable ({exc!r})"


def _webhook_problem(events: Iterable[Mapping[str, Any]]) -> str | None:
    for event in events:
        try:
            body = base64.b64decode(str(event["body_base64"]), validate=True)
        except binascii.Error:
            return f"webhook event {event['event_id']}: its body_base64 is not base64"
        text = event["body_text"]
        if journal.sha256_hex(body) != event["body_sha256"] or (
            text is not None and text.encode("utf-8") != body
        ):
            return f"webhook event {event['event_id']}: its body's forms disagree"
    return None


def _about(bundle: Mapping[str, Any], entries: list[journal.Entry]) -> list[journal.Entry]:
    return [e for e in entries if e.subject == bundle["transaction_id"]]


def _ledger_problem(bundle: Mapping[str, Any], entries: list[journal.Entry]) -> str | None:
    booked = [e for e in _about(bundle, entries) if e.kind in (journal.BOOKED, journal.ADOPTED)]
    ledger = bundle["ledger"]
    if ledger is None:
        if booked:
            return (
                f"journal entry {booked[-1].seq} ({booked[-1].kind}) records a ledger row, and"
                " the bundle holds none"
            )
        return None
    if not booked:
        return "the ledger row has no booked or adopted journal entry"
    if len(booked) > 1:
        # A deposit is booked once: a second entry was appended by hand.
        return (
            f"journal entry {booked[1].seq} ({booked[1].kind}) books the deposit a second time"
            f" (the first is entry {booked[0].seq})"
        )
    entry = booked[0]
    for name in journal.LEDGER_FIELDS:
        if entry.body.get(name) != ledger.get(name):
            return (
                f"the ledger row's {name} is not what journal entry {entry.seq} ({entry.kind})"
                " holds"
            )
    return None


def _submission_problem(bundle: Mapping[str, Any], entries: list[journal.Entry]) -> str | None:
    # By action and payload hash: a submission retried with a corrected profile sent another
    # payload under the same action (one entry and one record each).
    submitted = {
        (int(e.body["action_id"]), str(e.body.get("payload_sha256"))): e
        for e in _about(bundle, entries)
        if e.kind == journal.SUBMITTED and "action_id" in e.body
    }
    for sent in bundle["submissions"]:
        action_id = int(sent["action_id"])
        entry = submitted.pop((action_id, str(sent.get("payload_sha256"))), None)
        if entry is None:
            return (
                f"submission of action {action_id} has no submitted journal entry with its"
                " payload_sha256"
            )
        for name in ("payload_sha256", "fields", "profile"):
            if name in entry.body and entry.body[name] != sent[name]:
                return (
                    f"submission of action {action_id}: its {name} is not what journal entry"
                    f" {entry.seq} holds"
                )
        payload = sent.get("payload")
        if payload is not None and payload_sha256(payload) != entry.body.get("payload_sha256"):
            return (
                f"submission of action {action_id}: its payer values do not hash to the"
                f" payload_sha256 of journal entry {entry.seq}"
            )
    for (action_id, _), entry in sorted(submitted.items()):
        return (
            f"journal entry {entry.seq} records the submission of action {action_id}, which"
            " the bundle does not hold"
        )
    return None


def _reconciled_problem(bundle: Mapping[str, Any], entries: list[journal.Entry]) -> str | None:
    """Each day's reconciled entry has its run among the day's runs (runs are only added)."""
    runs = {
        day["day"]: [(r["outcome"], r["findings"], r["ledger_mark"]) for r in day["runs"]]
        for day in bundle["reconciliation"]
    }
    for entry in entries:
        if entry.kind != journal.RECONCILED:
            continue
        day = entry.subject.removeprefix("day:")
        ran = (entry.body.get("outcome"), entry.body.get("findings"), entry.body.get("ledger_mark"))
        if ran not in runs.get(day, []):
            return f"journal entry {entry.seq} (reconciled): no run of {day} in the bundle is its"
    return None


def _export_problem(bundle: Mapping[str, Any], entries: list[journal.Entry]) -> str | None:
    if not bundle["with_personal_data"]:
        if any("payload" in s for s in bundle["submissions"]):
            return "the bundle says it holds no personal data, and holds payer values"
        return None
    exported = [
        e
        for e in _about(bundle, entries)
        if e.kind == journal.EXPORTED and e.body.get("by") == bundle["written_by"]
    ]
    if not exported:
        return "the bundle holds personal data and no exported journal entry records its export"
    return None
