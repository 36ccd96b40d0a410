"""The persistent kernels compiled for a Hopper GPU without one: every kernel a program launches (recorded while
the interpreter runs it once) is compiled for sm_90 by Triton's own ptxas in a fresh process, and must fit an
H100/H200 program's 227 KiB of shared memory. The first GPU run found a kernel asking for 272 KiB; this catches
that class of bug on a CPU machine."""

from __future__ import annotations

import numpy as np
import pytest
from lstm_cells import layer_norm_lstm
from test_triton_render import lstm

import nnforge as nf
import nnforge.nn.functional as F
from nnforge.codegen.triton import TritonBackend, interpreted
from nnforge.codegen.triton.offline import MAX_SHARED, NoPtxas, compile_offline, held_forms, record_launches
from nnforge.codegen.triton.target import Tiles

HOPPER_SHARED = MAX_SHARED[90]  # bytes of shared memory one program may use on an H100 / H200

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not (TritonBackend().available and interpreted()),
                                                    reason="records launches under Triton's interpreter")]


def _training_step(cell, seed: int, T: int, N: int, H: int, options: dict):
    """A training step of ``cell`` (the gradients of its weights for the sum of squared outputs) compiled for
    Triton with ``options``, and float16 arguments for it drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    args = [(rng.standard_normal(s) * 0.1).astype(np.float16)
            for s in ((T, N, H), (N, H), (N, H), (4 * H, H), (4 * H, H), (4 * H,))]

    def loss(*a):
        ys = cell(*a)[0]
        return (ys * ys).sum()

    return nf.compile(nf.grad(loss, argnums=(3, 4, 5)), backend="triton", options=options), args


@pytest.mark.parametrize(("cell", "rows"), [(lstm, 16), (layer_norm_lstm, 16), (lstm, 8)])
def test_a_basecaller_width_lstm_trains_in_kernels_that_fit_hopper(cell, rows):
    """H = 96 in float16, a training step of an LSTM and a layer-norm LSTM: the forward and the backward scan are
    persistent kernels (checked), and every kernel of the step compiles for sm_90 within the shared memory a
    program may use; the LSTM's kernels at 8 rows per program (the default) and at 16 without spilling registers
    to local memory (a persistent scan that spills pays for it every step; the layer-norm LSTM's scans spill at 4
    warps: docs/benchmarks.md)."""
    step, args = _training_step(cell, 96, T=1, N=16, H=96, options={"tiles": Tiles(scan_rows=rows)})
    records = record_launches(lambda: step(*args))
    scans = [r["name"] for r in records if "_scan_" in r["name"]]
    assert len(scans) == 2, [r["name"] for r in records]
    try:
        built = compile_offline(records, arch=90, loops=True)
    except NoPtxas:
        pytest.skip("Triton's CUDA backend has no ptxas here")
    shared = {name: k["shared"] for name, k in built["kernels"].items()}
    assert set(shared) == {r["name"] for r in records}
    too_big = {k: v for k, v in shared.items() if v > HOPPER_SHARED}
    assert not too_big, f"kernels over {HOPPER_SHARED} bytes of shared memory: {too_big}"
    assert all(shared[k] > 64 * 1024 for k in scans)  # the recurrent weights are on chip
    if cell is lstm:
        spills = {name: k["spill_bytes"] for name, k in built["kernels"].items() if k["spill_bytes"]}
        assert not spills, f"kernels spilling registers (bytes stored): {spills}"
        # each step's input tiles copied into shared memory ahead of the step by Triton's pipeliner
        assert all(built["kernels"][k]["loop"]["async_copies"] for k in scans), built["kernels"]


def test_a_cells_activations_use_the_special_function_unit_without_divisions():
    """Sigmoid and tanh compile to the special-function unit's approximate ``ex2`` and ``rcp`` (``nf_ex2``,
    ``nf_rcp``): no float32 division is left in an LSTM's persistent scan or in an elementwise kernel of the two
    (each ``div.full.f32`` is the same reciprocal behind four instructions of range checks, 27 % of an LSTM step's
    machine code at H = 96: docs/benchmarks.md), while a division the user wrote stays one. The interpreter runs
    the exact forms; what the GPU's forms compute is checked where a GPU runs the test matrix."""
    rng = np.random.default_rng(32)
    H, N = 32, 8
    args = [(rng.standard_normal(s) * 0.1).astype(np.float16)
            for s in ((2, N, H), (N, H), (N, H), (4 * H, H), (4 * H, H), (4 * H,))]
    x, y = (rng.standard_normal((4, 64)).astype(np.float32) for _ in range(2))
    cell = nf.compile(lambda *a: lstm(*a)[0], backend="triton")
    activations = nf.compile(lambda a: nf.sigmoid(a) * nf.tanh(a), backend="triton")
    divide = nf.compile(lambda a, b: a / b, backend="triton")
    records = record_launches(lambda: (cell(*args), activations(x), divide(x, y)))
    try:
        built = compile_offline(records, arch=90, loops=True)["kernels"]
    except NoPtxas:
        pytest.skip("Triton's CUDA backend has no ptxas here")
    scan = next(name for name in built if "_scan_" in name)
    assert built[scan]["divisions"] == 0 and built[scan]["loop"]["special"] > 0, built[scan]
    assert built["k0_sigmoid_tanh_mul"]["divisions"] == 0 and built["k0_div"]["divisions"] > 0, built


def test_a_transposed_scans_weights_reach_its_wgmma_from_shared_memory():
    """A persistent scan with ``[width, rows]`` tiles multiplies ``W @ h`` by Hopper's warpgroup MMA with the
    recurrent weights as its A operand: loaded as they are stored (float16, 0 past the edge), they stay in shared
    memory, where the MMA reads them. Widened, selected and rounded back (a value of the kernel's own), they were
    loaded from shared memory into registers every step: 64 ``LDSM`` of an H = 96 LSTM step's 627 instructions,
    now 5 shared loads in all (docs/benchmarks.md)."""
    rng = np.random.default_rng(96)
    H, N = 96, 16
    args = [(rng.standard_normal(s) * 0.1).astype(np.float16)
            for s in ((1, N, H), (N, H), (N, H), (4 * H, H), (4 * H, H), (4 * H,))]
    tiles = Tiles(scan_pieces=False, scan_transposed=True)
    step = nf.compile(lambda *a: lstm(*a)[0], backend="triton", options={"tiles": tiles})
    records = [r for r in record_launches(lambda: step(*args)) if "_scan_" in r["name"]]
    try:
        built = compile_offline(records, arch=90, loops=True)["kernels"]
    except NoPtxas:
        pytest.skip("Triton's CUDA backend has no ptxas here")
    (loop,) = [k["loop"] for k in built.values()]
    assert loop["mma"] == 64 and loop["shared_loads"] <= 8, loop


@pytest.mark.parametrize(("K", "N"), [(16, 96), (32, 96), (24, 384), (32, 512), (64, 384)])
def test_a_float32_projection_leading_its_rows_builds_without_spilling(K: int, N: int):
    """A float32 projection and the layer norm of its rows are one kernel whose product is on the FMA units.
    With K in one step of ``Tiles.gemm_k`` (32), Triton unrolled it straight through and ptxas kept 32
    registers a thread, spilling 5 KB every program; K now takes steps of 16 there (``Tiles.row_gemm_k``):
    built for sm_90, every such kernel keeps its values in registers."""
    rng = np.random.default_rng(K * 1000 + N)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((40, K), (K, N), (N,), (N,), (N,))]
    f = nf.compile(lambda x, w, b0, g, b: F.layer_norm(x @ w + b0, (N,), g, b), backend="triton")
    records = record_launches(lambda: f(*args))
    assert [r["name"] for r in records] == ["k0_gemm_add_sum_div_sub_sqrt_recip_mul"]
    try:
        built = compile_offline(records, arch=90)["kernels"]
    except NoPtxas:
        pytest.skip("Triton's CUDA backend has no ptxas here")
    (kernel,) = built.values()
    assert kernel["spill_bytes"] == 0 and kernel["registers"] > 32, kernel


KERNELS = '''
import triton
import triton.language as tl


def twice(x):  # not @triton.jit: the interpreter calls it, a GPU build cannot
    return x * 2


@triton.jit
def good(p, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(p + i, tl.load(p + i) * 2)


@triton.jit
def bad(p, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(p + i, twice(tl.load(p + i)))
'''


def test_a_kernel_only_the_interpreter_accepts_is_named_with_the_compilers_reason(tmp_path):
    """The interpreter runs a kernel calling a plain Python function; a GPU build refuses it. The build reports
    that kernel's error and still builds the others (``keep_going``, as ``scripts/gpu-build.py`` does), or
    raises naming it."""
    import importlib.util

    import torch

    path = tmp_path / "two_kernels.py"
    path.write_text(KERNELS)
    spec = importlib.util.spec_from_file_location("two_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.arange(16, dtype=torch.float32) + 1

    def run() -> None:
        module.good[(1,)](x, N=16)
        module.bad[(1,)](x, N=16)

    records = record_launches(run)
    assert torch.equal(x, (torch.arange(16, dtype=torch.float32) + 1) * 4)  # both ran under the interpreter
    try:
        built = compile_offline(records, arch=90, keep_going=True)
    except NoPtxas:
        pytest.skip("Triton's CUDA backend has no ptxas here")
    assert built["kernels"]["good"]["shared"] >= 0 and "error" not in built["kernels"]["good"]
    assert "twice" in built["kernels"]["bad"]["error"]
    with pytest.raises(RuntimeError, match=r"^bad: "):
        compile_offline(records, arch=90)


COPY = '''
import triton
import triton.language as tl


@triton.jit
def copy(p, q, n, N: tl.constexpr):
    i = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(q + i, tl.load(p + i, mask=i < n), mask=i < n)
'''


def test_a_kernel_is_built_as_the_launcher_specializes_it(tmp_path):
    """Triton's launcher compiles a kernel for what its arguments are: pointers and integers divisible by 16
    (then a thread loads 16 bytes at once), integers equal to 1 (a constant). The recorder notes that of each
    launch and the offline build follows it: the same copy on 16-byte-aligned float16 tensors and a count of
    4096 builds vector loads, on a view one element in (2 bytes off) and a count of 4095 element loads."""
    import importlib.util

    import torch

    path = tmp_path / "copy_kernel.py"
    path.write_text(COPY)
    spec = importlib.util.spec_from_file_location("copy_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gen = torch.Generator().manual_seed(16)
    x = torch.randn(4097, generator=gen).to(torch.float16)
    out = torch.empty_like(x)
    aligned = record_launches(lambda: module.copy[(4,)](x, out, 4096, N=1024))
    assert torch.equal(out[:4096], x[:4096])
    off = record_launches(lambda: module.copy[(4,)](x[1:], out[1:], 4095, N=1024))
    assert torch.equal(out[1:4096], x[1:4096])
    one = record_launches(lambda: module.copy[(1,)](x, out, 1, N=1024))
    assert aligned[0]["aligned"] == ["p", "q", "n"] and off[0]["aligned"] == []
    assert one[0]["consts"] == {"n": 1, "N": 1024} and one[0]["signature"]["n"] == "constexpr"
    try:
        built = [compile_offline(r, arch=90)["kernels"]["copy"] for r in (aligned, off, one)]
    except NoPtxas:
        pytest.skip("Triton's CUDA backend has no ptxas here")
    assert built[0]["wide_loads"] > 0 and built[1]["wide_loads"] == 0, built  # and the constant one builds


def test_a_wide_lstm_trains_in_large_gemm_tiles_that_fit_hopper():
    """H = 256 in float16, a training step as a host loop (its weights do not fit one program): with the large
    GEMM tile taken everywhere (``gemm_big_programs`` 1) every GEMM launch is 128 x 128 (the step's
    four gate accumulators 128 x 64 each) on 8 warps, and each kernel builds for sm_90 within a program's shared
    memory without spilling registers (the step's product and cell update hold four 128 x 64 float32
    accumulators: 179-234 registers at H = 1024, docs/benchmarks.md)."""
    step, args = _training_step(lstm, 256, T=2, N=128, H=256, options={"tiles": Tiles(gemm_big_programs=1)})
    records = record_launches(lambda: step(*args))
    assert not [r["name"] for r in records if "_scan_" in r["name"]]  # a host loop
    gemms = {r["name"]: (r["consts"]["BM"], r["consts"]["BN"], r["meta"]["num_warps"]) for r in records
             if "BM" in r["consts"]}
    assert len(gemms) >= 5 and set(gemms.values()) == {(128, 128, 8), (128, 64, 8)}, gemms
    try:
        built = compile_offline([r for r in records if r["name"] in gemms], arch=90, threads=2)["kernels"]
    except NoPtxas:
        pytest.skip("Triton's CUDA backend has no ptxas here")
    too_big = {k: v["shared"] for k, v in built.items() if v["shared"] > HOPPER_SHARED}
    assert not too_big, f"kernels over {HOPPER_SHARED} bytes of shared memory: {too_big}"
    spills = {name: k["spill_bytes"] for name, k in built.items() if k["spill_bytes"]}
    assert not spills, f"kernels spilling registers (bytes stored): {spills}"


def test_a_resident_training_step_builds_its_barriers_for_hopper():
    """An LSTM training step at H = 256 in float16 with each loop resident (``Target.resident_steps``): each loop
    is one kernel that builds for sm_90 within a program's shared memory without spilling, and its step loop
    keeps the barrier's atomic on the count (the barrier itself waits on a GPU only: under the interpreter one
    program runs every step). The forward's step and the backward's product with W_hh (8 tiles each) hold
    their tiles of the weights where the launch has that many programs (``H<j>``, decided at launch: under the
    interpreter's one program they do not, so the held forms are built by setting it): their step loops then copy
    nothing into shared memory (the weights stay on chip from before the first step; read every step, they were
    copied in ahead of each)."""
    import dataclasses

    from nnforge.codegen.triton import triton_target

    target = dataclasses.replace(triton_target(), resident_steps=True)
    step, args = _training_step(lstm, 257, T=2, N=64, H=256, options={"target": target})
    records = [r for r in record_launches(lambda: step(*args)) if "_resident_" in r["name"]]
    assert len(records) == 2, [r["name"] for r in records]
    records = held_forms(records)
    assert len(records) == 4, records  # the forward's step, the backward's product with W_hh: each also held
    try:
        built = compile_offline(records, arch=90, threads=2, loops=True)["kernels"]
    except NoPtxas:
        pytest.skip("Triton's CUDA backend has no ptxas here")
    for name, k in built.items():
        assert k["shared"] <= HOPPER_SHARED and not k["spill_bytes"], (name, k)
        assert k["loop"]["atomics"] >= 1, (name, k["loop"])
        assert (k["loop"]["async_copies"] == 0) == name.endswith("+held"), (name, k["loop"])
