"""This suite runs on both stores: every stack it starts stores on SQLite, then on PostgreSQL."""

from __future__ import annotations

import pytest

from tests.act.test_booking import env
from tests.support.stores import StoreMaker

__all__ = ["env"]  # the booking suite's stack, for the suites beside it


@pytest.fixture
def stack_stores(make_store: StoreMaker) -> StoreMaker:
    """The stacks' stores: the test's engine."""
    return make_store
