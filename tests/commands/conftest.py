"""Fixtures of the command tests' stacks (each module defines its own `stack`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from worker.dev.harness import Stack


@pytest.fixture
def register_bodies(stack: Stack) -> list[dict[str, Any]]:
    """Every register body the sandbox receives (its real handler still runs)."""
    bodies: list[dict[str, Any]] = []
    real = stack.sandbox.register_address

    def spy(body: Mapping[str, Any]) -> dict[str, Any]:
        bodies.append(dict(body))
        return real(body)

    stack.sandbox.register_address = spy  # type: ignore[method-assign]
    return bodies
