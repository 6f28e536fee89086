"""One serve per database: the lock, and what `status` learns from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.errors import AlreadyServing
from worker.service.lock import lock_path, serve_lock, serving


def test_the_lock_is_held_while_serving_and_refuses_a_second(tmp_path: Path) -> None:
    """Held: `serving` says so and a second holder is refused, naming the first's pid; released
    (the process's descriptor closed, as at any exit): free again."""
    db = tmp_path / "depositd.db"
    assert serving(db) is False  # never served
    with serve_lock(db):
        assert serving(db) is True
        held_by_us = rf"another depositd serve \(pid {os.getpid()}\)"
        with pytest.raises(AlreadyServing, match=held_by_us), serve_lock(db):
            pass
    assert serving(db) is False
    with serve_lock(db):
        assert serving(db) is True


def test_a_lock_that_cannot_be_looked_at_is_unknown(tmp_path: Path) -> None:
    """`status` run by a user who may not open the lock file learns nothing, and does not fail."""
    db = tmp_path / "depositd.db"
    lock = lock_path(db)
    lock.symlink_to(lock)  # a loop: opening it fails with ELOOP, as an unreadable file would
    assert serving(db) is None
