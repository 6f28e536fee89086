"""The console in a real headless Chromium (Debian's `chromium` and `chromium-driver`) against a
real stack: sandbox, worker with its console, Slack endpoint and SMTP server on loopback.

Selenium blocks its thread, so the stack runs on an event loop in another thread
(`livestack.LiveStack`).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service

from tests.support.livestack import LiveStack

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "apt-get install -y chromium chromium-driver (as root), or run `make tools`"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    """One stack with the console for the module's tests."""
    stack = LiveStack(tmp_path_factory.mktemp("console"))
    try:
        yield stack
    finally:
        stack.close()


def _options(profile: Path) -> webdriver.ChromeOptions:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    return options


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """One headless Chromium for the whole run (a fresh profile); fails, never skips, when the
    browser is missing, naming the command that installs it."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing and not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.fail(f"{', '.join(missing)} missing: {INSTALL}")
    try:
        driver = webdriver.Chrome(
            options=_options(tmp_path_factory.mktemp("chromium-profile")),
            service=Service(str(CHROMEDRIVER)),
        )
    except WebDriverException as exc:
        pytest.fail(f"cannot start headless Chromium ({exc.msg}); {INSTALL}")
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium: webdriver.Chrome) -> Iterator[webdriver.Chrome]:
    """The shared Chromium with no cookie left by an earlier test."""
    chromium.delete_all_cookies()
    yield chromium
    chromium.delete_all_cookies()
