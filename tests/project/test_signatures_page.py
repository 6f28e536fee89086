"""docs/signatures.md: its worked example is what depositd's own code computes, and its
settings table is the table in worker.provider.signing."""

from __future__ import annotations

import re
from pathlib import Path

from worker.provider.signing import SETTINGS, Scheme, sign

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "signatures.md").read_text(encoding="utf-8")
CODE = re.compile(r"`([^`]*)`")


def table_after(marker: str) -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table after `marker`, header left out."""
    rest = PAGE[PAGE.index(marker) :].splitlines()
    start = next(i for i, line in enumerate(rest) if line.startswith("|"))
    rows = []
    for line in rest[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows[2:]


def example_inputs() -> tuple[str, str]:
    """The worked example's secret and timestamp, as the page gives them."""
    block = re.search(r"```\nsecret\s+(\S+)\nAPI-TIMESTAMP\s+(\d+)\n```", PAGE)
    assert block, "the worked example lost its secret and timestamp block"
    return block.group(1), block.group(2)


def scheme_of(cell: str) -> Scheme:
    """`published`, `signature_encoding: base64` -> that Scheme."""
    name, *settings = CODE.findall(cell)
    attrs = {s.key: s.attr for s in SETTINGS}
    chosen = dict(item.split(": ") for item in settings)
    return Scheme(name, **{attrs[key]: value for key, value in chosen.items()})


def test_worked_example_is_what_the_code_computes() -> None:
    """Each row's string to sign and API-SIGNATURE equal what worker.provider.signing gives
    for that request, secret and timestamp."""
    secret, ts = example_inputs()
    rows = table_after("<!-- worked-example:")
    assert len(rows) >= 6
    for request, scheme_cell, signed_cell, signature_cell in rows:
        codes = CODE.findall(request)
        method, target = codes[0].split(" ", 1)
        body = codes[1].encode() if len(codes) > 1 else b""
        scheme = scheme_of(scheme_cell)
        [signed] = CODE.findall(signed_cell)
        [signature] = CODE.findall(signature_cell)
        assert scheme.message(ts, method, target, body) == signed.encode(), request
        assert sign(secret, ts, method, target, body, scheme) == signature, request


def test_worked_example_covers_every_kind_of_request() -> None:
    """The example has a body, a parameter string (sorted and as sent), neither, base64 and
    the older scheme."""
    rows = table_after("<!-- worked-example:")
    schemes = {cells[1] for cells in rows}
    assert {
        "`published`",
        "`method-path-v1`",
        "`published`, `signature_params: as-sent`",
    } <= schemes
    assert "`published`, `signature_encoding: base64`" in schemes
    assert any(cells[2].startswith("`&") for cells in rows)  # no body, no parameters
    assert any("with body" in cells[0] for cells in rows)


def test_openssl_line_matches_the_first_row() -> None:
    """The OpenSSL check prints the first row's signature."""
    first = table_after("<!-- worked-example:")[0]
    [signature] = CODE.findall(first[3])
    assert f"# SHA2-256(stdin)= {signature}" in PAGE


def test_settings_table_is_the_code_table() -> None:
    """The page's settings table lists every key with its default and its choices."""
    rows = table_after("## Settings")
    listed = {CODE.findall(r[0])[0]: (CODE.findall(r[1])[0], CODE.findall(r[2])) for r in rows}
    assert listed == {s.key: (s.default, list(s.choices)) for s in SETTINGS}
