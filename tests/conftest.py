"""Shared test set-up: every test runs in its own nnforge session (no pending effects leak between tests)."""

from __future__ import annotations

import pytest

from nnforge.trace import fresh_session


@pytest.fixture(autouse=True)
def _fresh_nnforge_session():
    with fresh_session():
        yield
