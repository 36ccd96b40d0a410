"""Top-level code cut into C functions; steps whose records say they differ only in their buffers are emitted
once."""

from __future__ import annotations

import re

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c.parts import canonical, part_functions, split_parts
from nnforge.errors import NNForgeError
from nnforge.schedule import Loop
from nnforge.schedule.identical import step_keys

needs_cpu = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


def test_split_parts_drops_empty():
    body = ["a", "b", "c", "d"]
    assert split_parts(body, [1, 1, 3]) == [(0, ["a"]), (2, ["b", "c"]), (3, ["d"])]
    assert split_parts([], []) == []


def test_canonical_renames_locals_and_turns_buffers_into_parameters():
    part = ["    const float v7 = ((float*)args[3])[i5];", "    b2[i5] = v7 + b9[i5] + b2[0];"]
    text, params = canonical(part, {"b2": "float", "b9": "double"}, {"v7", "i5", "b2", "b9"})
    assert text == "    const float z0 = p0[z1];\n    p1[z1] = z0 + p2[z1] + p1[0];"
    assert params == [("float*", "((float*)args[3])"), ("float*", "b2"), ("double*", "b9")]


_BUFFERS = [("b1", "float"), ("b2", "float"), ("b3", "float"), ("b4", "float")]


def test_parts_of_one_key_share_one_function():
    a = ["    b1[0] = b2[0] + S[0];"]
    b = ["    b3[0] = b4[0] + S[0];"]
    c = ["    b3[0] = b3[0] + S[0];"]  # same buffer twice: the records give it another key
    calls, fns, _ = part_functions([("k", a), ("k", b), ("k2", c)], _BUFFERS, {"b1", "b2", "b3", "b4"})
    assert calls == ["nf_part0(S, b1, b2);", "nf_part0(S, b3, b4);", "nf_part1(S, b3);"]
    assert sum(line.startswith("__attribute__") for line in fns) == 2


def test_parts_of_one_key_must_print_alike():
    """Equal records printed as different C is a decision of the renderer the records do not show: an error."""
    a = ["    b1[0] = b2[0] + S[0];"]
    c = ["    b3[0] = b3[0] + S[0];"]
    with pytest.raises(NNForgeError, match="equal records"):
        part_functions([("k", a), ("k", c)], _BUFFERS, {"b1", "b2", "b3", "b4"})


def stack(x, *ws):
    """Three LSTM layers with the same sizes (one C function serves all three scans)."""
    for k in range(3):
        w_ih, w_hh, b = ws[3 * k: 3 * k + 3]
        h0 = nf.zeros((x.shape[1], w_hh.shape[1]))

        def cell(carry, x_t, w_ih=w_ih, w_hh=w_hh, b=b):
            h, c = carry
            i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
            c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
            h = nf.sigmoid(o) * nf.tanh(c)
            return (h, c), h

        _, x = nf.scan(cell, (h0, h0), x)
    return x


def stack_args(T=5, N=7, H=5, seed=0):
    rng = np.random.default_rng(seed)
    ws = []
    for _ in range(3):
        ws += [(rng.standard_normal((4 * H, H)) * 0.4).astype(np.float32),
               (rng.standard_normal((4 * H, H)) * 0.4).astype(np.float32),
               (rng.standard_normal(4 * H) * 0.1).astype(np.float32)]
    return [rng.standard_normal((T, N, H)).astype(np.float32), *ws]


@needs_cpu
@pytest.mark.parametrize("N", [7, 16])  # 16: the scans are split by batch rows, and still shared
def test_stack_scans_share_one_function_and_match_reference(N):
    from nnforge.codegen.c import lower, prepare

    args = stack_args(N=N)
    low = lower(prepare(nf.compile(stack).trace(*args)))
    assert all((k.parallel is not None) == (N >= 12) for k in low.program.loops())
    keys = step_keys(low.program)
    scans = [i for i, k in enumerate(low.program.block.kernels) if isinstance(k, Loop)]
    assert len(scans) == 3 and len({keys[i] for i in scans}) == 1, "the records say the three scans are alike"
    main = low.text[low.text.index("void nf_main"):]
    calls = re.findall(r"(nf_part\d+)\(", main)
    defined = re.findall(r"void (nf_part\d+)\(.*\) \{$", low.text, re.M)
    assert len(calls) == len(keys) and len(set(calls)) == len(defined) == len(set(keys))  # a function per key
    assert len({calls[i] for i in scans}) == 1, "the three scans share one function"
    assert "#pragma omp parallel" not in low.text.split("void nf_main")[0]  # orphaned constructs only
    want = nf.compile(stack, backend="reference")(*args)
    got = nf.compile(stack, backend="cpu")(*args)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    args2 = stack_args(T=9, N=4, seed=1)  # new trip count and batch through the same shared functions
    np.testing.assert_allclose(nf.compile(stack, backend="cpu")(*args2), nf.compile(stack, backend="reference")(
        *args2), rtol=2e-5, atol=2e-5)


def test_split_units_repeat_header_and_balance():
    from nnforge.codegen.c.parts import UNIT_MARK
    from nnforge.codegen.c.toolchain import split_units

    src = "H\n" + "".join(f"{UNIT_MARK}f{k}\n" + "x\n" * (k + 1) for k in range(4)) + f"{UNIT_MARK}main\n"
    assert split_units(src, 1) == [src]
    units = split_units(src, 2)
    assert len(units) == 2 and all(u.startswith("H\n") for u in units)
    body = "".join(u[2:] for u in units)
    assert sorted(body.split("\n")) == sorted(src[2:].replace(UNIT_MARK, "").split("\n"))
    assert sum("main" in u for u in units) == 1


@needs_cpu
def test_units_compiled_separately_give_the_same_program(tmp_path, monkeypatch):
    from nnforge.codegen.c import lower, prepare
    from nnforge.codegen.c.program import CProgram
    from nnforge.codegen.c.toolchain import Toolchain, find_compiler

    monkeypatch.setenv("NNFORGE_CACHE_DIR", str(tmp_path))
    args = stack_args(T=4, N=3, H=6, seed=3)
    g = prepare(nf.compile(stack).trace(*args))
    low = lower(g)
    lib, key = Toolchain(find_compiler(), jobs=3).load(low.text)
    got = CProgram(g, lib, key, low.sizes, [n.attrs["array"] for n in low.data])(args)
    want = nf.compile(stack, backend="reference")(*args)
    np.testing.assert_allclose(got[0], want, rtol=2e-5, atol=2e-5)
