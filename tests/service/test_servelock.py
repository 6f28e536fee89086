"""The serve lock of a database: shared by its instances, and what `status` learns from it."""

from __future__ import annotations

from pathlib import Path

from worker.store.servelock import lock_path, serve_lock, serving


def test_the_lock_is_shared_by_instances_and_says_which_came_alone(tmp_path: Path) -> None:
    """Held: `serving` says so; a second instance joins (not alone), the first came alone;
    released (the process's descriptor closed, as at any exit): free again."""
    db = tmp_path / "depositd.db"
    assert serving(db) is False  # never served
    with serve_lock(db) as first:
        assert first is True
        assert serving(db) is True
        with serve_lock(db) as second:
            assert second is False
            assert serving(db) is True
        assert serving(db) is True
    assert serving(db) is False
    with serve_lock(db) as again:
        assert again is True
        assert serving(db) is True


def test_a_lock_that_cannot_be_looked_at_is_unknown(tmp_path: Path) -> None:
    """`status` run by a user who may not open the lock file learns nothing, and does not fail."""
    db = tmp_path / "depositd.db"
    lock = lock_path(db)
    lock.symlink_to(lock)  # a loop: opening it fails with ELOOP, as an unreadable file would
    assert serving(db) is None
