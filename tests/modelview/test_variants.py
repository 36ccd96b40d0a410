"""Variants compute what they claim: every LSTM implementation is torch.nn.LSTM's function, minGRU's parallel scan is
its recurrence, shapes follow the layout; the registry loads plugins; nnforge implementations agree with torch."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from nnforge.modelview.registry import Registry, class_ref, load_ref, variant
from nnforge.modelview.variants import BUILTIN_VARIANTS, Request, Variant, variant_registry

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.script is what we test

LSTMS = ["lstm_manual", "lstm_combined", "lstm_premult", "lstm_stacked"]
REG = variant_registry()


def _req(name: str, layout: str, n: int = 3, t: int = 7, **params) -> Request:
    declared = {k: p.default for k, p in REG[name].params.items()}
    return Request(n, t, layout, declared | params)


@pytest.mark.parametrize("layout", ["TNC", "NTC"])
@pytest.mark.parametrize("name", LSTMS)
def test_lstm_implementations_equal_torch_lstm(name: str, layout: str):
    req = _req(name, layout, input_size=5, hidden=6)
    m = REG[name]().module(req)
    w_ih, w_hh, b = (t.detach() for t in m.lstm_weights())
    ref = torch.nn.LSTM(5, 6, batch_first=layout == "NTC", dtype=torch.float64)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(w_ih)
        ref.weight_hh_l0.copy_(w_hh)
        ref.bias_ih_l0.copy_(b)
        ref.bias_hh_l0.zero_()
    (x,) = REG[name]().inputs(req, torch.Generator().manual_seed(torch.seed() % 2**31))
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(x)[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", ["TNC", "NTC"])
def test_min_gru_parallel_scan_equals_its_recurrence(layout: str):
    req = _req("min_gru", layout, input_size=4, hidden=5, t=9)
    m = REG["min_gru"]().module(req)
    (x,) = REG["min_gru"]().inputs(req, torch.Generator().manual_seed(torch.seed() % 2**31))
    with torch.no_grad():
        y = m(x)
        k, cand = m.proj(x).chunk(2, -1)
        z = torch.sigmoid(k)
        g = torch.where(cand >= 0, cand + 0.5, torch.sigmoid(cand))
        tdim = 1 if layout == "NTC" else 0
        h = torch.zeros_like(z.select(tdim, 0))
        outs = []
        for zt, gt in zip(z.unbind(tdim), g.unbind(tdim)):
            h = (1 - zt) * h + zt * gt
            outs.append(h)
        torch.testing.assert_close(y, torch.stack(outs, tdim), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("cls", BUILTIN_VARIANTS, ids=lambda c: c.name)
@pytest.mark.parametrize("layout", ["TNC", "NTC"])
def test_every_variant_builds_runs_scripts_and_declares_costs(cls: type[Variant], layout: str):
    small = {"input_size": 4, "hidden": 4, "d_model": 8, "nhead": 2, "ff": 16, "head_out": 8, "layers": 2}
    req = _req(cls.name, layout, t=11, **{k: v for k, v in small.items() if k in cls.params})
    v = cls()
    m = v.module(req)
    inputs = v.inputs(req, torch.Generator().manual_seed(torch.seed() % 2**31))
    assert all(p.dtype == torch.float64 for p in m.parameters())
    with torch.no_grad():
        y = m(*inputs)
        torch.testing.assert_close(torch.jit.script(m)(*inputs), y)
    out_t = -(-req.seq_len // 5) if cls.name == "bonito" else req.seq_len
    assert y.shape[:2] == ((req.batch, out_t) if layout == "NTC" else (out_t, req.batch))
    assert v.flops(req) > 0 and v.min_bytes(req, 4) > 0 and v.items(req) == req.batch * req.seq_len
    assert v.min_bytes(req, 8) == 2 * v.min_bytes(req, 4)


def test_registry_plugins_refs_and_duplicates(tmp_path):
    plugin = tmp_path / "myplugin.py"
    plugin.write_text(
        "import torch\nfrom nnforge.modelview import Variant, variant\n"
        "@variant\nclass Mine(Variant):\n    name = 'mine'\n"
        "    def module(self, req):\n        return torch.nn.Identity()\n"
    )
    reg = variant_registry([str(plugin)])
    assert "mine" in reg and len(reg) == len(BUILTIN_VARIANTS) + 1
    ref = reg.ref("mine")
    assert ref.startswith(str(plugin)) and load_ref(ref) is reg["mine"]
    assert load_ref(class_ref(BUILTIN_VARIANTS[0])) is BUILTIN_VARIANTS[0]

    @variant
    class Clash(Variant):
        name = "lstm_manual"

    with pytest.raises(ValueError, match="already registered"):
        Registry("variant", BUILTIN_VARIANTS).add(Clash)
    assert variant_registry(extra=[Clash])["lstm_manual"] is Clash  # explicit extras may replace


@pytest.mark.skipif(importlib.util.find_spec("nnforge.compile") is None, reason="nnforge compiler not present")
@pytest.mark.parametrize("name", ["lstm_manual", "lstm_combined", "lstm_stacked", "torch_lstm", "torch_gru"])
def test_nnforge_implementations_agree_with_torch(name: str):
    import nnforge as nf

    if "reference" not in nf.available_backends():
        pytest.skip("nnforge reference backend unavailable")
    req = _req(name, "NTC", input_size=3, hidden=4, t=5)
    v = REG[name]()
    m = v.module(req).float()
    (x,) = (t.float() for t in v.inputs(req, torch.Generator().manual_seed(torch.seed() % 2**31)))
    impl = v.nnforge_impl(req)
    assert impl is not None
    f = nf.compile(impl.fn, backend="reference")
    got = impl.output(f(*impl.bind(m)(x)))
    with torch.no_grad():
        torch.testing.assert_close(torch.as_tensor(got), m(x), rtol=1e-4, atol=1e-5)
