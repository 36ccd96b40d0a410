"""Spec parsing, validation (errors name key and value), expansion and stable keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnforge.modelview.backends import backend_registry
from nnforge.modelview.spec import (
    Cell,
    SpecError,
    expand,
    merge,
    parse_param_flags,
    spec_from_mapping,
    spec_from_toml,
    validate,
)
from nnforge.modelview.spec import (
    settings as group_settings,
)
from nnforge.modelview.variants import variant_registry

VREG = variant_registry()
BREG = backend_registry()


def _expand(data: dict) -> list[Cell]:
    spec = spec_from_mapping(data)
    validate(spec, VREG, BREG)
    return expand(spec, VREG)


@settings(max_examples=30, deadline=None)
@given(
    variants=st.lists(st.sampled_from(["lstm_manual", "torch_gru", "min_gru", "transformer"]), min_size=1,
                      max_size=3, unique=True),
    backends=st.lists(st.sampled_from(["eager", "jit.script", "compile", "onnxruntime"]), min_size=1, max_size=3,
                      unique=True),
    batch=st.lists(st.integers(1, 512), min_size=1, max_size=3, unique=True),
    seq=st.lists(st.integers(1, 4096), min_size=1, max_size=2, unique=True),
    layouts=st.lists(st.sampled_from(["TNC", "NTC"]), min_size=1, max_size=2, unique=True),
    modes=st.lists(st.sampled_from(["inference", "training"]), min_size=1, max_size=2, unique=True),
)
def test_expansion_is_the_cross_product_with_unique_stable_keys(variants, backends, batch, seq, layouts, modes):
    data = {"variants": variants, "backends": backends, "batch": batch, "seq_len": seq, "layout": layouts,
            "mode": modes}
    cells = _expand(data)
    assert len(cells) == len(variants) * len(backends) * len(batch) * len(seq) * len(layouts) * len(modes)
    keys = [c.key for c in cells]
    assert len(set(keys)) == len(keys)
    assert keys == [c.key for c in _expand(data)]  # deterministic
    groups = group_settings(cells)
    assert len(groups) == len(cells) // len(backends)
    for group in groups.values():
        assert [c.backend for c in group] == backends
    for c in cells:
        assert Cell.from_dict(c.to_dict()) == c


def test_param_lists_expand_and_per_variant_tables_apply_only_to_their_variant():
    cells = _expand({"variants": ["bonito", "lstm_manual"], "backends": ["eager"],
                     "params": {"hidden": [8, 16], "bonito": {"width": [96, 384]}}})
    bonito = [c for c in cells if c.variant == "bonito"]
    lstm = [c for c in cells if c.variant == "lstm_manual"]
    assert sorted(c.params_dict["width"] for c in bonito) == [96, 384]
    assert sorted(c.params_dict["hidden"] for c in lstm) == [8, 16]
    assert all("hidden" not in c.params_dict for c in bonito)
    assert all(c.params_dict["input_size"] == 64 for c in lstm)  # declared default filled in


@pytest.mark.parametrize(
    ("data", "key", "value"),
    [
        ({"variants": ["lstm_manual"], "bogus": 1}, "bogus", 1),
        ({"variants": ["lstm_manual"], "layout": ["TNC", "CNT"]}, "layout", "CNT"),
        ({"variants": ["lstm_manual"], "dtype": "float8"}, "dtype", "float8"),
        ({"variants": ["lstm_manual"], "batch": [4, 0]}, "batch", 0),
        ({"variants": ["lstm_manual"], "batch": [4, "x"]}, "batch", "x"),
        ({"variants": ["lstm_manual"], "mode": ["trainning"]}, "mode", "trainning"),
        ({"variants": ["lstm_manual"], "timing": {"budget": 3}}, "timing.budget", 3),
        ({"variants": ["lstm_manual"], "timing": {"budget_s": -1.0}}, "timing.budget_s", -1.0),
        ({"variants": ["lstm_manual"], "timing": {"method": "fast"}}, "timing.method", "fast"),
        ({"variants": ["lstm_manual"], "isolation": {"timeout_s": "long"}}, "isolation.timeout_s", "long"),
        ({"variants": ["lstm_manual"], "tolerances": {"float32": [1e-3]}}, "tolerances.float32", [1e-3]),
        ({"variants": ["lstm_manual", "lstm_manual"]}, "variants", ["lstm_manual", "lstm_manual"]),
        ({"variants": ["lstm_manual"], "timing": {"min_samples": 100, "max_samples": 10}}, "timing.max_samples", 10),
    ],
)
def test_invalid_specs_name_the_key_and_value(data, key, value):
    with pytest.raises(SpecError) as e:
        spec_from_mapping(data)
    assert e.value.key == key and e.value.value == value
    assert key in str(e.value) and repr(value) in str(e.value)


@pytest.mark.parametrize(
    ("data", "key", "value"),
    [
        ({"variants": ["lstm_manul"]}, "variants", "lstm_manul"),
        ({"variants": ["lstm_manual"], "backends": ["eager", "tvm"]}, "backends", "tvm"),
        ({"variants": ["lstm_manual"], "params": {"width": 96}}, "params.width", 96),
        ({"variants": ["lstm_manual"], "params": {"hidden": 0}}, "params.hidden", 0),
        ({"variants": ["lstm_manual"], "params": {"hidden": 1.5}}, "params.hidden", 1.5),
        ({"variants": ["bonito"], "params": {"bonito": {"width": 95}}}, "params.bonito.width", 95),
        ({"variants": ["bonito"], "params": {"bonito": {"depth": 3}}}, "params.bonito.depth", 3),
        ({"variants": ["lstm_manual"], "params": {"bonito": {"width": 96}}}, "params.bonito", {"width": 96}),
        ({"variants": ["lstm_manual"], "params": {"hidden": [8, 8]}}, "params.hidden", [8, 8]),
        ({"variants": ["lstm_manual"], "params": {"hidden": []}}, "params.hidden", []),
        ({"variants": ["bonito"], "params": {"bonito": {"width": [96, 96]}}}, "params.bonito.width", [96, 96]),
        ({"variants": ["bonito"], "params": {"bonito": {"width": []}}}, "params.bonito.width", []),
    ],
)
def test_validation_against_registries_names_the_key_and_value(data, key, value):
    spec = spec_from_mapping(data)
    with pytest.raises(SpecError) as e:
        validate(spec, VREG, BREG)
    assert e.value.key == key and e.value.value == value


def test_toml_round_trip_and_cli_overrides(tmp_path: Path):
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "t"\nvariants = ["lstm_manual", "bonito"]\nbackends = ["eager", "jit.script"]\nbatch = [1, 8]\n'
        'seq_len = [100]\nlayout = ["TNC", "NTC"]\n\n[params]\nhidden = 32\n\n[params.bonito]\nwidth = [96, 384]\n\n'
        "[timing]\nbudget_s = 2.5\nflush_cache = true\n\n[isolation]\ntimeout_s = 30\n"
    )
    spec = spec_from_toml(path)
    assert spec.batch == (1, 8) and spec.timing.budget_s == 2.5 and spec.timing.flush_cache
    assert spec.isolation.timeout_s == 30.0 and spec.params["bonito"] == {"width": [96, 384]}
    over = merge(spec, {"batch": [4], "timing": {"threads": 1}, "params": {"input_size": 16}})
    assert over.batch == (4,) and over.timing.threads == 1 and over.timing.budget_s == 2.5
    assert over.params["hidden"] == 32 and over.params["input_size"] == 16
    assert spec_from_mapping(__import__("json").loads(over.to_json())) == over
    bad = tmp_path / "bad.toml"
    bad.write_text("variants = [\n")
    with pytest.raises(SpecError, match="not valid TOML"):
        spec_from_toml(bad)
    for missing, why in ((tmp_path / "nosuch.toml", "No such file or directory"), (tmp_path, "Is a directory")):
        with pytest.raises(SpecError, match=f"file = '{missing}': cannot read it: {why}$"):
            spec_from_toml(missing)


def test_param_flags():
    assert parse_param_flags(["hidden=128", "bonito.width=96,384", "x=true"]) == {
        "hidden": 128, "bonito": {"width": [96, 384]}, "x": True}
    with pytest.raises(SpecError) as e:
        parse_param_flags(["hidden"])
    assert e.value.key == "param"


def test_keys_are_stable_strings():
    c = Cell("lstm_manual", "eager", 16, 100, "TNC", "float32", "inference", "cpu", (("hidden", 64),))
    assert c.key == 'lstm_manual|N=16|T=100|TNC|float32|inference|cpu|{"hidden":64}|eager'
    assert c.setting_key == c.with_backend("compile").setting_key


def test_the_sweep_a_lent_gpu_runs_is_a_valid_spec() -> None:
    """``scripts/gpu-sweep.toml`` (scripts/gpu-check.sh, step ``sweep``) names variants, backends and parameters
    that exist — a typo would cost a GPU lease its sweep — and puts nnforge's Triton backend beside cuDNN's and
    CUDA graphs on the GPU, in both half precisions and modes, in as many settings as a lease has minutes for."""
    from nnforge.modelview import runner

    spec = spec_from_toml(Path(__file__).resolve().parents[2] / "scripts" / "gpu-sweep.toml")
    plan = runner.plan(spec)
    assert (plan.cells, plan.settings) == (72, 24)
    assert {"nnforge.triton", "eager", "cudagraphs"} <= set(spec.backends) and spec.device == ("cuda",)
    assert set(spec.dtype) == {"float16", "bfloat16"} and set(spec.mode) == {"inference", "training"}
    assert spec.timing.flush_cache


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_numbers_are_rejected(tmp_path: Path, value: float):
    """NaN slips through ``v <= 0``: a NaN budget never ends timing, and NaN in spec_json is not JSON."""
    for data, key in (({"timing": {"budget_s": value}}, "timing.budget_s"),
                      ({"isolation": {"timeout_s": value}}, "isolation.timeout_s"),
                      ({"tolerances": {"float32": [value, 1e-3]}}, "tolerances.float32")):
        with pytest.raises(SpecError, match=re.escape(key)):
            spec_from_mapping({"variants": ["lstm_manual"], **data})
    with pytest.raises(SpecError, match=r"timing\.budget_s"):  # a CLI flag (--budget nan) is an override
        merge(spec_from_mapping({"variants": ["lstm_manual"]}), {"timing": {"budget_s": value}})
    path = tmp_path / "s.toml"
    path.write_text(f'variants = ["lstm_manual"]\n[timing]\nbudget_s = {value}\n')
    with pytest.raises(SpecError, match="finite"):
        spec_from_toml(path)


def test_a_missing_plugin_file_names_the_path_it_tried(tmp_path: Path, monkeypatch):
    from nnforge.modelview.registry import PluginError, load_module

    monkeypatch.chdir(tmp_path)
    with pytest.raises(PluginError, match=re.escape(f"plugin nope.py: file not found: {tmp_path / 'nope.py'}")):
        load_module("nope.py")
