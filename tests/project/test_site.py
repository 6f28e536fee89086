"""The documentation site as built (`mkdocs build --strict`), read in headless Chromium: it
loads nothing from another host, and its code blocks fit the page at 1280 px."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# What makes a browser request something: an element's source, a stylesheet's url() or @import.
LOADS = re.compile(
    r"<(?:script|img|iframe|source|audio|video|embed)\b[^>]*\bsrc=\"(?P<src>[^\"]+)\""
    r"|<link\b[^>]*\bhref=\"(?P<href>[^\"]+)\""
    r"|url\(\s*['\"]?(?P<url>[^'\")]+)|@import\s+['\"](?P<imp>[^'\"]+)"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as `make lint` builds it."""
    out = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    subprocess.run(
        [str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """Headless Chromium 1280 px wide; fails, never skips, when it is missing."""
    if not (CHROMIUM.exists() or shutil.which("chromium")):
        pytest.fail("chromium missing: apt-get install -y chromium chromium-driver, or make tools")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--window-size=1280,900", f"--user-data-dir={tmp_path_factory.mktemp('profile')}",
    ):  # fmt: skip
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    except WebDriverException as exc:
        pytest.fail(f"cannot start headless Chromium ({exc.msg})")
    try:
        yield driver
    finally:
        driver.quit()


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("index.html") if p.parent.name != "404")


def test_the_site_names_no_resource_on_another_host(site: Path) -> None:
    """No page or stylesheet loads a script, font, picture or style from another host (the
    theme's web fonts are off), and no page holds a diagram the theme would draw with a script
    from another host."""
    files = [*site.rglob("*.html"), *site.rglob("*.css")]
    outside = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for found in LOADS.finditer(text):
            target = next(v for v in found.groupdict().values() if v)
            if re.match(r"(https?:)?//", target):
                outside.append(f"{path.relative_to(site)}: {target}")
        if path.suffix == ".html":
            assert 'class="mermaid"' not in text, path
    assert outside == []
    assert len(pages(site)) >= 15


def test_no_page_requests_another_host(site: Path, browser: webdriver.Chrome) -> None:
    """Each page, loaded in Chromium with its scripts run, requested files of the site only."""
    requested: dict[str, list[str]] = {}
    for page in pages(site):
        browser.get(page.as_uri())
        names = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
        )
        outside = [name for name in names if not name.startswith("file://")]
        if outside:
            requested[str(page.relative_to(site))] = outside
    assert requested == {}


def test_code_blocks_fit_the_page_at_1280_px(site: Path, browser: webdriver.Chrome) -> None:
    """At 1280 px no code block is wider than its box (a long line wraps instead of hiding
    behind a scrollbar): the quick start, the profile examples, every page."""
    cut: dict[str, list[str]] = {}
    for page in pages(site):
        browser.get(page.as_uri())
        wide = browser.execute_script(
            "return [...document.querySelectorAll('pre > code')]"
            ".filter(c => c.scrollWidth > c.clientWidth + 1)"
            ".map(c => c.textContent.split('\\n').sort((a, b) => b.length - a.length)[0])"
        )
        if wide:
            cut[str(page.relative_to(site))] = wide
    assert cut == {}
