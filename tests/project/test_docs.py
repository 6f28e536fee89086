"""The documentation a user has: the reference lists every config key, and nothing cites a
document the user does not have."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from worker.config.messages import keys_of
from worker.config.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def config_keys(model: type[BaseModel] = Settings, prefix: str = "") -> list[str]:
    """Every key of the configuration file, dotted (`webhook.listen`), `*_file` forms aside."""
    found = []
    for key in keys_of(model):
        if key.endswith("_file"):
            continue
        name = (
            key
            if key in model.model_fields
            else next(n for n, f in model.model_fields.items() if f.alias == key)
        )
        annotation = model.model_fields[name].annotation
        sections = [a for a in (annotation, *getattr(annotation, "__args__", ()))
                    if isinstance(a, type) and issubclass(a, BaseModel)]  # fmt: skip
        if sections:
            found.extend(config_keys(sections[0], f"{prefix}{key}."))
        else:
            found.append(f"{prefix}{key}")
    return found


def test_reference_lists_every_config_key() -> None:
    """docs/reference.md has a row for every configuration key the program accepts."""
    rows = set(re.findall(r"^\| `([\w.]+)` \|", (ROOT / "docs/reference.md").read_text(), re.M))
    assert sorted(set(config_keys()) - rows) == []
    assert "webhook.listen" in rows and "notify.email.from" in rows


def test_docs_cite_no_document_outside_the_repository() -> None:
    """README and docs never send the reader to a spec or a file outside the repository."""
    for doc in DOCS:
        text = doc.read_text()
        assert not re.search(r"\bSPEC\b", text), doc
        assert "../shared" not in text, doc


def test_readme_links_the_reference() -> None:
    """The README points to docs/reference.md."""
    assert "(docs/reference.md)" in (ROOT / "README.md").read_text()


def test_readme_is_a_landing_page() -> None:
    """The README fits in 300 lines and opens with its two commands, `make demo`, `make test`."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300
    opening = "\n".join(lines[:6])
    assert "make demo" in opening and "make test" in opening


def test_every_command_is_in_the_readme_and_the_commands_page() -> None:
    """Each command the parser knows has a row in the README's table and in docs/commands.md."""
    from worker.commands.cli import COMMANDS

    readme = (ROOT / "README.md").read_text()
    page = (ROOT / "docs" / "commands.md").read_text()
    for name in COMMANDS:
        assert re.search(rf"^\|[^|\n]*`{re.escape(name)}\b", readme, re.M), f"README: {name}"
        assert re.search(rf"^\|[^|\n]*`{re.escape(name)}\b", page, re.M), (
            f"docs/commands.md: {name}"
        )


def test_code_cites_only_docs_pages_that_exist() -> None:
    """Comments, docstrings, tests, bench, deploy files and the Makefile cite docs/<page>.md
    pages that are in the repository, and never the spec that is not."""
    spec = re.compile(r"\b" + "SP" + r"EC\b")  # spelled apart so that this file does not match
    cited = re.compile(r"docs/([\w-]+\.md)")
    files = [ROOT / "Makefile", *ROOT.glob("rules/**/*.yaml")]
    for folder in ("worker", "tests", "bench", "deploy"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".sh", ".md",
                  ".yaml", ".yml", ".service", ".html"}]  # fmt: skip
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert not spec.search(text), path
        for page in cited.findall(text):
            assert (ROOT / "docs" / page).is_file(), f"{path} cites docs/{page}"


def exit_statuses_in_code() -> set[int]:
    """Every status a command returns: `return N` in the commands and serve, and the tables of
    statuses (`EXIT = {...}`, `EXIT_FINDINGS = N`)."""
    found: set[int] = set()
    for path in [*(ROOT / "worker" / "commands").glob("*.py"), ROOT / "worker/service/serve.py"]:
        text = path.read_text()
        found.update(int(n) for n in re.findall(r"^\s+return (\d+)$", text, re.M))
        found.update(int(n) for n in re.findall(r"^EXIT\w* = (\d+)$", text, re.M))
        table = re.search(r"^EXIT = \{(.*?)^\}", text, re.M | re.S)
        if table:
            found.update(int(n) for n in re.findall(r": (\d+),", table.group(1)))
    return found


def test_every_exit_status_is_in_the_one_table_the_summaries_link() -> None:
    """The reference's table lists every status a command can exit with; each page that sums
    them up (README, commands, the operator's day) names every one and links the table."""
    reference = (ROOT / "docs/reference.md").read_text()
    table = reference.split("## Exit statuses", 1)[1].split("\n## ", 1)[0]
    listed = {int(n) for n in re.findall(r"^\| `(\d+)` \|", table, re.M)}
    assert exit_statuses_in_code() <= listed and {0, 1, 2, 3, 130} <= listed
    for page, link in (
        ("README.md", "(docs/reference.md#exit-statuses)"),
        ("docs/commands.md", "(reference.md#exit-statuses)"),
        ("docs/operator.md", "(reference.md#exit-statuses)"),
    ):
        text = " ".join((ROOT / page).read_text().split())
        summary = re.search(r"[Ee]xit status:? (.*?)\)", text)
        assert summary and link in text, page
        sentence = text[summary.start() : text.index(link.split("#")[0][1:], summary.start())]
        named = {int(n) for n in re.findall(r"\b(\d+)\b", sentence)}
        assert named == listed, (page, named)


def sandbox_verbs() -> set[str]:
    """The subcommands of `depositd sandbox`, from its own parser."""
    import argparse

    from worker.dev.sandboxctl import add_verbs

    parser = argparse.ArgumentParser()
    actions = parser.add_subparsers()
    add_verbs(actions, argparse.ArgumentParser(add_help=False))
    return set(actions.choices)


def test_docs_name_only_sandbox_verbs_that_exist() -> None:
    """Every `depositd sandbox VERB` the README and docs name is a verb of the sandbox."""
    verbs = sandbox_verbs()
    for doc in DOCS:
        named = set(re.findall(r"depositd sandbox ([a-z][a-z-]*)", doc.read_text()))
        assert named <= verbs, (doc, named - verbs)


def test_getting_started_says_how_each_next_step_ends() -> None:
    """The next steps of getting started use the sandbox's commands (not its control API by
    hand): a deposit into wallet 1001 waits for the sweep of its auto-collection, and a
    rejection is `sandbox reject`; and it says what happens when serve starts first."""
    text = " ".join((ROOT / "docs" / "getting-started.md").read_text().split())
    tries = text.split("## Things to try next", 1)[1]
    assert "depositd sandbox sweep" in tries and "auto-collection" in tries
    assert "depositd sandbox reject" in tries and "control API" not in tries
    assert "in either order" in text and "Start the sandbox before" not in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "Start the sandbox before" not in readme and "in either order" in readme


def test_cited_sections_exist() -> None:
    """A comment citing a section by its title (README or a docs page, then "Title")
    names a heading the cited page has."""
    cited = re.compile(r'\b(README|docs/[\w-]+\.md|deploy/README\.md), "([^"]+)"')
    files = [*ROOT.glob("deploy/*.yaml"), *ROOT.glob("rules/**/*.yaml"), ROOT / "Makefile"]
    files += list((ROOT / "worker").rglob("*.py"))
    found = 0
    for path in files:
        for page, title in cited.findall(path.read_text(encoding="utf-8")):
            target = ROOT / ("README.md" if page == "README" else page)
            headings = re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)
            assert title in headings, f"{path} cites {page}, {title!r}: no such section"
            found += 1
    assert found >= 1


def test_readme_names_everything_the_tests_need() -> None:
    """The README's prerequisites of `make test` name each tool `make tools` installs and each
    package the deploy tests' container needs (tests/support/machine.py), and that they boot a
    container."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    machine = (ROOT / "tests" / "support" / "machine.py").read_text()
    table = re.search(r"^TOOLS = \{(.*?)^\}", machine, re.M | re.S)
    assert table
    packages = set(re.findall(r': "([\w-]+)"', table.group(1))) - {"util-linux"}  # always there
    for needed in {"promtool", "Chromium", "PostgreSQL", "npm", "axe-core", *packages}:
        assert needed in readme, needed
    assert "container" in readme


def test_the_landing_page_starts_every_reader_somewhere() -> None:
    """The docs' landing page links every page of the nav from its "start here" table (the
    operator's day and the console included)."""
    index = (ROOT / "docs" / "index.md").read_text()
    table = index.split("| start here |", 1)[1]
    linked = set(re.findall(r"\]\(([\w-]+\.md)\)", table))
    nav = set(re.findall(r": ([\w-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert {"operator.md", "console.md"} <= linked
    assert nav - linked == {"index.md"}
