"""`depositd evidence TX --out FILE --by NAME [--with-personal-data]` and `depositd
verify-evidence FILE [--anchor SEQ:HASH]` (docs/audit.md, "Evidence for one deposit").

`evidence` reads everything about one deposit in one snapshot and writes it as one canonical
JSON document, to a temporary file in FILE's folder that is renamed over FILE once complete
(never a partial file under FILE's name), mode 0600, then checks what it wrote. With
`--with-personal-data` the submissions' payer values are in it: the command says so on stderr
and first appends an `exported` journal entry (who, the file's name). Its output names counts
and hashes, never a value.

`verify-evidence` needs neither the configuration nor the database: exit 0 when the bundle
verifies (the head its proof ends at printed), 3 naming the first problem, 2 for a file that is
not a bundle.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from worker.commands.dbopen import NoDatabase, open_db
from worker.commands.ops import backup_target_problem
from worker.config.settings import Settings, load_settings
from worker.ingest.receipt import checks_at_receipt
from worker.store import evidence, journal
from worker.store.db import Db
from worker.store.errors import StoreError
from worker.store.evidence_file import Encoder, NotABundle, Verdict, check

EXIT_NOT_VERIFIED = 3  # verify-evidence: the bundle does not verify
DIGESTS_CHUNK = 10_000  # proof digests read and written at a time


def _target_problem(settings: Settings, out: Path) -> str | None:
    if not out.parent.is_dir():
        return f"{out.parent} is not a folder; --out names a file in an existing folder"
    if settings.storage.url is None:
        return backup_target_problem(settings.storage.file, out)
    return f"{out} is a directory; give the path of the file to write" if out.is_dir() else None


def _journal_export(
    args: argparse.Namespace, settings: Settings, tx: str, by: str, out: Path
) -> journal.Entry | None:
    """Append the `exported` entry (who, the file's name) before the file is written; None
    when the deposit is unknown (nothing appended)."""

    from worker.store.sqlitestore import database, transaction

    with open_db(args, readonly=False, settings=settings) as conn:
        db = database(conn)
        with transaction(db):
            if not evidence.known(db, tx):
                return None
            body = {"by": by, "with_personal_data": True, "file": out.name}
            return journal.append(db, journal.EXPORTED, tx, body)


def _chunks(conn: Db, content: dict[str, Any], encoder: Encoder) -> Iterator[bytes]:
    yield encoder.start()
    proof = content["journal"]["proof"]
    if proof is not None:
        after, upto = int(proof["from"]) - 1, journal.Head.parse(proof["head"]).seq
        while after < upto:
            chunk = evidence.digests(conn, after, upto, limit=DIGESTS_CHUNK)
            if not chunk:
                break  # a gap in the journal: the file's own check names it
            yield encoder.digests(chunk)
            after += len(chunk)
    yield encoder.end()


def _write_atomically(out: Path, chunks: Iterator[bytes]) -> Verdict:
    """Write the chunks to a temporary file beside `out` (mode 0600), check it, rename it over
    `out`; the check's verdict. The temporary file is removed on any failure."""
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        try:
            verdict = check(tmp.read_bytes())
        except NotABundle as exc:  # never written so; said rather than raised
            verdict = Verdict("", f"not a bundle: {exc}", None, 0, False)
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # the rename made durable where the folder allows it
        dir_fd = os.open(out.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return verdict


def _summary(content: dict[str, Any]) -> str:
    parts = [
        f"{len(content['webhooks']['events'])} webhook(s)",
        f"{len(content['facts'])} fact(s)",
        f"{len(content['rules']['matched'])} action(s)",
        f"{len(content['submissions'])} submission(s)",
        f"{len(content['operator']['actions'])} operator action(s)",
        "a ledger row" if content["ledger"] is not None else "no ledger row",
        f"{len(content['journal']['entries'])} journal entries",
    ]
    return ", ".join(parts)


def _evidence(args: argparse.Namespace, settings: Settings) -> int:
    tx, out, by = args.transaction_id, Path(args.out), args.by.strip()
    exported = None
    if args.with_personal_data:
        exported = _journal_export(args, settings, tx, by, out)
        if exported is None:
            print(f"depositd: no deposit {tx!r} (not tracked, not booked, not journaled)",
                  file=sys.stderr)  # fmt: skip
            return 1
    receipt = checks_at_receipt(settings.webhook)
    with open_db(args, settings=settings) as conn:
        with evidence.snapshot(conn):
            content = evidence.gather(
                conn, tx, personal_data=args.with_personal_data, receipt=receipt, by=by
            )
        if content is None:
            print(f"depositd: no deposit {tx!r} (not tracked, not booked, not journaled)",
                  file=sys.stderr)  # fmt: skip
            return 1
        encoder = Encoder(content)
        verdict = _write_atomically(out, _chunks(conn, content, encoder))
    if exported is not None:
        held = sum(s.get("payload") is not None for s in content["submissions"])
        what = (
            f"holds personal data: the payer values of {held} submission(s)"
            if held
            else "holds no payer value (none kept: retention removed them, or none was sent)"
        )
        print(
            f"depositd: {out} {what}; its export is journal entry {exported.seq} (by {by})",
            file=sys.stderr,
        )
    proof = content["journal"]["proof"]
    print(f"evidence of {tx} written to {out}: {_summary(content)}")
    print(f"sha256 {encoder.sha256}")
    if proof is not None:
        print(f"head {proof['head']}")
    if verdict.problem is not None:
        print(
            f"depositd: {out} does not verify: {verdict.problem}; the database disagrees with"
            " its journal (`depositd verify` names what)",
            file=sys.stderr,
        )
        return 1
    return 0


def run_evidence(args: argparse.Namespace) -> int:
    """`depositd evidence TX --out FILE --by NAME [--with-personal-data]`."""
    if not args.by.strip():
        print("depositd: --by NAME says who writes the bundle; it is empty", file=sys.stderr)
        return 2
    settings = load_settings(args.config)
    problem = _target_problem(settings, Path(args.out))
    if problem is not None:
        print(f"depositd: evidence refused: {problem}", file=sys.stderr)
        return 2
    try:
        return _evidence(args, settings)
    except NoDatabase as exc:
        print(f"depositd: {exc}", file=sys.stderr)
        return 1
    except StoreError as exc:
        print(f"depositd: cannot read the database: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"depositd: cannot write {args.out}: {exc}", file=sys.stderr)
        return 1


ADVICE = (
    "Compare this head with one kept outside the database (the daily head in the log or an"
    " alert channel, or `depositd verify --head` saved at the time): the same head, or an"
    " anchor on this proof's chain (--anchor SEQ:HASH), proves the journal entries in the"
    " bundle are the ones written then."
)


def run_verify_evidence(args: argparse.Namespace) -> int:
    """`depositd verify-evidence FILE [--anchor SEQ:HASH]`."""
    anchor = None
    if args.anchor is not None:
        try:
            anchor = journal.Head.parse(args.anchor)
        except ValueError as exc:
            print(f"depositd: --anchor: {exc}", file=sys.stderr)
            return 2
    try:
        data = Path(args.file).read_bytes()
    except OSError as exc:
        print(f"depositd: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        verdict = check(data, anchor=anchor)
    except NotABundle as exc:
        print(f"depositd: {args.file} is not an evidence bundle: {exc}", file=sys.stderr)
        return 2
    if verdict.problem is not None:
        print(f"{args.file}: does not verify: {verdict.problem}")
        return EXIT_NOT_VERIFIED
    personal = "with" if verdict.with_personal_data else "without"
    print(
        f"{args.file}: verifies: the evidence of deposit {verdict.transaction_id}, {personal}"
        f" personal data, {verdict.entries} journal entries"
    )
    if verdict.head is None:
        print("no journal entry is about this deposit: only the bundle's own sha256 was checked")
        return 0
    print(f"head {verdict.head}")
    if anchor is not None:
        print(f"anchor {anchor}: on the proof's chain")
    print(ADVICE)
    return 0
