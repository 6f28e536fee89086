"""This suite runs on both stores: every stack it starts stores on SQLite, then on PostgreSQL."""

from __future__ import annotations

import pytest

from tests.support.booking import env
from tests.support.stores import StoreMaker

__all__ = ["env"]  # the booking stack, for every suite here


@pytest.fixture
def stack_stores(make_store: StoreMaker) -> StoreMaker:
    """The stacks' stores: the test's engine."""
    return make_store
