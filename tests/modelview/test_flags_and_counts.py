"""A repeated ``-p`` adds values to the parameter's axis (as a repeated ``-n`` does), and ``SweepResult.counts`` counts
the run's cells, not the rows a ``processes`` > 1 sweep writes for each of them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nnforge.modelview import open_store, sweep
from nnforge.modelview.spec import SpecError, load_spec, parse_param_flags


def test_repeated_params_accumulate() -> None:
    assert parse_param_flags(["hidden=8", "hidden=16"]) == {"hidden": [8, 16]}
    assert parse_param_flags(["bonito.width=96", "hidden=8,16", "bonito.width=384,96", "hidden=32"]) == {
        "bonito": {"width": [96, 384]}, "hidden": [8, 16, 32]}
    assert parse_param_flags(["hidden=8", "hidden=8"]) == {"hidden": 8}  # a repeated value is one value


def test_repeated_params_reach_the_grid() -> None:
    spec = load_spec(None, {"variants": ["lstm_manual"], "backends": ["eager"],
                            "params": parse_param_flags(["hidden=8", "hidden=16"])})
    assert spec.params == {"hidden": [8, 16]}


@pytest.mark.parametrize("flags", [["bonito=3", "bonito.width=96"], ["bonito.width=96", "bonito=3"]])
def test_a_name_both_variant_and_parameter_is_a_spec_error(flags: list[str]) -> None:
    with pytest.raises(SpecError, match="param"):
        parse_param_flags(flags)


def test_counts_are_cells_with_several_processes(db: str, fast: dict[str, Any]) -> None:
    fast["timing"]["processes"] = 2
    spec = dict(variants=["lstm_manual"], backends=["eager", "jit.script"], batch=[2], seq_len=[3],
                params={"input_size": 5, "hidden": 6}, name="p2", seed=4321, **fast)
    res = sweep(spec, db=db, progress=False, table=False)
    assert res.ran == 2 and res.counts == {"ok": 2}
    with open_store(db) as s:  # two process rows and one pooled row per cell were written
        assert len(s.cells(res.run_id, latest_only=False)) == 6
        assert {json.loads(m)["processes"] for m in s.cells(res.run_id)["metrics_json"]} == {2}
