"""A worker stack with its console, run on an event loop in a thread of its own.

Selenium blocks its thread, so the stack cannot share the test's loop: tests are plain
functions and reach the stack through `LiveStack.run(coro)`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from worker.dev.harness import Stack

T = TypeVar("T")


class LiveStack:
    """A `Stack` with the console, on an event loop running in a thread of its own."""

    def __init__(self, workdir: Path, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stack = Stack(workdir, console=True, **kw)
        self.run(self.stack.start())

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the stack's loop and wait for its result."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        """Run a plain function on the stack's loop (sandbox calls that schedule work)."""

        async def wrapped() -> T:
            return fn()

        return self.run(wrapped())

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 20) -> None:
        """Poll `predicate` (run on the stack's loop) until it holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.call(predicate):
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def until(
        self, predicate: Callable[[], Coroutine[Any, Any, bool]], what: str, timeout: float = 20
    ) -> None:
        """Poll an async `predicate` (run on the stack's loop) until it holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.run(predicate()):
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def close(self) -> None:
        """Stop the stack and its loop."""
        try:
            self.run(self.stack.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


def log_in(driver: webdriver.Chrome, live: LiveStack, token: str | None = None) -> None:
    """Log in to the live stack's console through the login form."""
    driver.get(live.stack.console_url + "/login")
    driver.find_element(By.NAME, "token").send_keys(token or live.stack.console_token)
    driver.find_element(By.NAME, "operator").send_keys("ana")
    submit(driver, driver.find_element(By.CSS_SELECTOR, "form button[type=submit]"))


def submit(driver: webdriver.Chrome, button: WebElement) -> None:
    """Click a form's button and wait until the page it leads to replaced this one."""
    driver.execute_script("window.consoleTestMarker = true")
    button.click()

    def replaced(d: webdriver.Chrome) -> bool:
        try:
            return bool(
                d.execute_script(
                    "return !window.consoleTestMarker && document.readyState === 'complete'"
                )
            )
        except WebDriverException:  # between two pages
            return False

    WebDriverWait(driver, 15).until(replaced)
