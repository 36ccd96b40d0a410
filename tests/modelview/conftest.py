"""Shared fixtures: tiny, fast timing settings so that sweeps in tests take seconds, never assert speed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
FAULTY = str(HERE / "faulty_plugin.py")

FAST_TIMING: dict[str, Any] = {
    "budget_s": 0.15,
    "warmup_max_s": 0.1,
    "min_samples": 5,
    "round_samples": 3,
    "threads": 1,
    "target_rel_ci": 0.05,
}


@pytest.fixture
def faulty() -> str:
    """Path of the plugin file with misbehaving variants and backends."""
    return FAULTY


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "mv.db")


@pytest.fixture
def fast() -> dict[str, Any]:
    return {"timing": dict(FAST_TIMING), "measure_peaks": False, "isolation": {"timeout_s": 60.0, "memory_mb": 4096}}

