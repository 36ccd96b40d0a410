"""The GPU paths: the pieces that decide what a GPU row says are tested here without a GPU (pure functions, a fake
NVML); the end-to-end sweep on CUDA runs only where a GPU is present."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest
import torch

from nnforge.modelview import metrics as mt
from nnforge.modelview import open_store, sweep, worker
from nnforge.modelview.backends import Context
from nnforge.modelview.backends.external import (
    NnforgeCpu,
    NnforgeReference,
    NnforgeTriton,
    NnforgeTritonGraphs,
    OnnxRuntime,
)
from nnforge.modelview.spec import Cell
from nnforge.modelview.variants.base import Request
from nnforge.modelview.variants.lstm import LSTMManual

# -- kernel counting ------------------------------------------------------------------------------------------------


def test_profiler_device_events_are_told_apart() -> None:
    assert mt.device_activity_kind("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>", False) == (
        "kernel")
    assert mt.device_activity_kind("triton_poi_fused_add_mul_relu_0", False) == "kernel"
    assert mt.device_activity_kind("Memcpy HtoD (Pageable -> Device)", False) == "memcpy"
    assert mt.device_activity_kind("Memset (Device)", False) == "memset"
    # a record_function range drawn on the GPU timeline spans kernels: it is none itself
    assert mt.device_activity_kind("Torch-Compiled Region: 0/0", True) is None


# -- NVML -----------------------------------------------------------------------------------------------------------


class _FakeNvml(types.SimpleNamespace):
    """Just enough of pynvml: two GPUs, an energy counter that advances 50 mJ per read, an instantaneous power field
    of 300 W and a one-second-average power of 120 W (what NVML reports on recent GPUs)."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_FI_DEV_POWER_INSTANT = 186

    def __init__(self, uuids: list[str], instant: bool = True) -> None:
        super().__init__()
        self.uuids = uuids
        self.instant = instant
        self.energy_mj = 1000.0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid not in self.uuids:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return f"by-uuid:{uuid}"

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"by-index:{i}"

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> float:
        self.energy_mj += 50.0
        return self.energy_mj

    def nvmlDeviceGetFieldValues(self, h: str, ids: list[int]) -> list[Any]:
        if not self.instant:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        value = types.SimpleNamespace(dVal=0.0, uiVal=300_000, ulVal=0, ullVal=0, sllVal=0, siVal=0, usVal=0)
        return [types.SimpleNamespace(valueType=1, nvmlReturn=0, value=value)]

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 120_000

    def nvmlDeviceGetClockInfo(self, h: str, which: int) -> int:
        return 1980

    def nvmlDeviceGetTemperature(self, h: str, which: int) -> int:
        return 40

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return 0x4  # sw_power_cap


def test_nvml_handle_is_matched_by_uuid_not_index() -> None:
    nv = _FakeNvml(["GPU-aaaa", "GPU-bbbb"])
    # CUDA_VISIBLE_DEVICES=1: CUDA's device 0 is NVML's device 1
    assert mt.nvml_handle(nv, 0, "bbbb") == "by-uuid:GPU-bbbb"
    assert mt.nvml_handle(nv, 0, "GPU-bbbb") == "by-uuid:GPU-bbbb"
    assert mt.nvml_handle(nv, 0, "cccc") == "by-index:0"
    assert mt.nvml_handle(nv, 1, None) == "by-index:1"


@pytest.mark.parametrize("instant", [True, False])
def test_nvml_window_holds_one_backend_and_its_energy(monkeypatch: pytest.MonkeyPatch, instant: bool) -> None:
    nv = _FakeNvml(["GPU-x"], instant=instant)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    calls = {"a": 0, "b": 0, "sync": 0}

    def sync() -> None:
        calls["sync"] += 1

    with mt.NvmlSampler(0, period_s=0.001) as s:
        def call_a() -> None:
            calls["a"] += 1

        n_a = s.window("a", call_a, sync, min_s=0.05)
        n_b = s.window("b", lambda: calls.__setitem__("b", calls["b"] + 1), sync, min_s=0.0)
    assert n_a == calls["a"] > 1 and n_b == calls["b"] == 1  # a zero-length window still makes one call
    assert calls["sync"] == 4  # before the label opens and before it closes, per window
    a = s.summary("a", n_a)
    assert a["nvml_window_calls"] == n_a and a["nvml_window_s"] >= 0.05 and a["nvml_samples"] > 0
    assert a["nvml_window_call_s"] == pytest.approx(a["nvml_window_s"] / n_a)
    # one energy read opens the window and one closes it: 50 mJ, whatever the sampling thread did meanwhile
    assert a["energy_per_call_j"] == a["nvml_window_energy_per_call_j"] == pytest.approx(0.05 / n_a)
    assert a["power_w_mean"] == (300.0 if instant else 120.0)
    # with the timed median: power while the backend ran alone × its time per call
    timed = s.summary("a", n_a, seconds_per_call=0.002)
    assert timed["energy_per_call_j"] == pytest.approx(a["power_w_mean"] * 0.002)
    assert timed["nvml_window_energy_per_call_j"] == a["nvml_window_energy_per_call_j"]
    assert a["nvml_power"] == ("instantaneous" if instant else "nvmlDeviceGetPowerUsage")
    assert a["sm_clock_mhz_mean"] == 1980.0 and a["throttle_reasons"] == ["sw_power_cap"]


def test_nvml_field_value_is_read_through_its_type() -> None:
    value = types.SimpleNamespace(dVal=1.5, uiVal=7, ulVal=8, ullVal=9, sllVal=-1, siVal=-2, usVal=3)
    assert mt.nvml_field_number(types.SimpleNamespace(valueType=0, value=value)) == 1.5
    assert mt.nvml_field_number(types.SimpleNamespace(valueType=1, value=value)) == 7.0
    assert mt.nvml_field_number(types.SimpleNamespace(valueType=3, value=value)) == 9.0


# -- the worker's GPU choices ---------------------------------------------------------------------------------------


def test_a_failing_counter_is_recorded_and_the_others_still_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the timing each backend's counters are read by calling it again; one that raises says so under its
    key (the cell stays ok), the others are still taken, and the NVML window gets the timed median."""
    calls: list[str] = []

    class Sampler:
        def window(self, name: str, fn: Any, sync: Any) -> int:
            fn()
            sync()
            return 7

        def summary(self, name: str, calls_in_window: int, median_s: float) -> dict[str, Any]:
            return {"nvml_window_calls": calls_in_window, "median_seen": median_s, "label": name}

    def fn() -> None:
        calls.append("call")

    def failing_profile(_fn: Any) -> dict[str, Any]:
        raise RuntimeError("no CUPTI")

    monkeypatch.setattr(mt, "gpu_kernel_profile", failing_profile)
    m = worker._counters("eager", fn, 0.004, None, True, Sampler(), lambda: calls.append("sync"))
    assert m == {"kernel_profile": "failed: RuntimeError: no CUPTI", "nvml_window_calls": 7, "median_seen": 0.004,
                 "label": "eager"}
    assert calls == ["call", "sync"]
    perf = types.SimpleNamespace(available=False, reason="perf_event_paranoid is 3")
    assert worker._counters("eager", fn, 0.004, perf, False, None, lambda: None) == {
        "perf": "unavailable: perf_event_paranoid is 3"}


def test_cuda_peak_is_the_backends_own() -> None:
    assert worker.cuda_peak_bytes(50 << 20, 20 << 20) == 30 << 20
    assert worker.cuda_peak_bytes(10, 20) == 0


def test_float32_cells_do_not_compute_in_tf32() -> None:
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        worker.float32_is_float32()
        assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("cuda_version", [None, "13.0"])
def test_address_space_limit_only_without_a_cuda_build(monkeypatch: pytest.MonkeyPatch, cuda_version: str | None
                                                       ) -> None:
    import resource

    limits: list[Any] = []
    monkeypatch.setattr(torch.version, "cuda", cuda_version)
    monkeypatch.setattr(resource, "setrlimit", lambda which, lim: limits.append(lim))
    worker._limit_memory(2048, "cpu")
    worker._limit_memory(2048, "cuda")
    assert limits == ([] if cuda_version else [(2048 << 20, 2048 << 20)])


# -- backends on a CUDA cell ----------------------------------------------------------------------------------------


def _cuda_context(dtype: torch.dtype = torch.float32) -> Context:
    """A CUDA cell's context; nothing is moved to the device, so it builds on any machine."""
    params = {"hidden": 4, "input_size": 4}
    cell = Cell("lstm_manual", "x", 2, 3, "TNC", str(dtype).removeprefix("torch."), "inference", "cuda",
                tuple(sorted(params.items())))
    req = Request(2, 3, "TNC", params)
    v = LSTMManual()
    return Context(cell, v, req, v.module(req), (torch.randn(3, 2, 4),), torch.device("cuda"), dtype, 1)


def test_nnforge_host_backends_skip_cuda_cells_with_the_reason() -> None:
    ctx = _cuda_context()
    for b in (NnforgeReference(), NnforgeCpu()):
        reason = b.skip_reason(ctx)
        assert reason is not None and "not on cuda" in reason, reason
    with pytest.MonkeyPatch.context() as mp:  # the test suite runs Triton under its interpreter
        mp.setenv("TRITON_INTERPRET", "1")
        reason = NnforgeTriton().skip_reason(ctx)
    assert reason is not None and "interpreter" in reason, reason


def test_onnxruntime_on_cuda_skips_what_its_binding_cannot_type(monkeypatch: pytest.MonkeyPatch) -> None:
    ort = pytest.importorskip("onnxruntime")
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert OnnxRuntime().skip_reason(_cuda_context(torch.float16)) is None
    reason = OnnxRuntime().skip_reason(_cuda_context(torch.bfloat16))
    assert reason is not None and "bfloat16" in reason


# -- the report's GPU figure ----------------------------------------------------------------------------------------


def _gpu_cell(backend: str, dtype: str, clock: float) -> Any:
    from nnforge.modelview.report.data import CellRow

    setting = f"torch_lstm|N=16|T=32|TNC|{dtype}|inference|cuda|{{}}"
    return CellRow(
        row_id=0, cell_key=f"{setting}|{backend}", variant="torch_lstm", backend=backend, batch=16, seq_len=32,
        layout="TNC", dtype=dtype, mode="inference", device="cuda", params={}, status="ok", error=None,
        compile_s=0.0, first_call_s=1e-3, median_s=1e-3, ci_low_s=1e-3, ci_high_s=1e-3, throughput=512e3,
        throughput_unit="vectors/s", flops=1.0, bytes=1.0, achieved_flops=1e3, achieved_bytes_per_s=1e3,
        peak_mem_bytes=1, max_abs_err=0.0, started=0.0, finished=1.0, setting_key=setting,
        metrics={"sm_clock_mhz_mean": clock, "power_w_mean": 300.0, "energy_per_call_j": 0.3},
    )


def test_gpu_figure_keeps_dtypes_apart() -> None:
    pytest.importorskip("plotly")  # the report's figures module needs it; a GPU machine may have only the sweep's deps
    from nnforge.modelview.report.figures_perf import gpu, gpu_bar_label

    cells = [_gpu_cell("eager", "float32", 1980.0), _gpu_cell("eager", "float16", 1755.0)]
    assert gpu_bar_label(cells[0], 1) == "torch_lstm N=16 T=32"
    fig = gpu(cells).plot
    assert fig is not None
    clock = next(t for t in fig["data"] if t["name"] == "eager")  # the first panel: SM clock
    assert len(set(clock["x"])) == 2 and sorted(clock["y"]) == [1755.0, 1980.0]
    assert all("float16" in x or "float32" in x for x in clock["x"])


# -- end to end, on a GPU -------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_sweep_times_with_events_and_records_gpu_metrics(db: str, fast: dict) -> None:
    res = sweep(variants=["lstm_manual", "torch_lstm"], backends=["eager", "cudagraphs", "nnforge.cpu"], batch=[2],
                seq_len=[3], mode=["inference", "training"], device=["cuda"], params={"hidden": 8, "input_size": 8},
                db=db, progress=False, table=False, **fast)
    with open_store(db) as s:
        rows = s.rows(res.run_id)
        env = json.loads(s.run(res.run_id)["env_json"])
    assert env["gpu_model"] and env["cuda"] and env["cudnn"] and env["gpu_memory_bytes"] > 0
    assert env["torch_config"]["cudnn_allow_tf32"] is False
    assert len(rows) == 12
    for r in rows:
        if r["backend"] == "nnforge.cpu":
            assert r["status"] == "skipped" and "not on cuda" in r["error"]
            continue
        assert r["status"] == "ok", (r["variant"], r["backend"], r["mode"], r["error"])
        m = json.loads(r["metrics_json"])
        assert m["clock"] == "cuda_events" and r["median_s"] > 0
        assert m["kernels_per_call"] >= 1 and m["kernel_time_per_call_s"] > 0
        assert r["peak_mem_bytes"] > 0 and m["peak_mem_kind"] == "cuda_max_memory_allocated_over_before"
        if "nvml" not in m:  # NVML present: one window per backend
            assert m["sm_clock_mhz_mean"] > 0 and m["nvml_window_calls"] >= 1 and m["nvml_samples"] >= 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nnforge_triton_cells_run_and_pass_the_numerical_check(db: str, fast: dict) -> None:
    """nnforge's Triton kernels as a sweep backend on the GPU: every cell ok — inference and a training step
    (outputs and weight gradients checked against float64 eager autograd) — plain and replayed as CUDA graphs,
    with CUDA-event timing and the generated program as the cell's artifact. Two settings (each a worker process
    of 20 s or so on an H200: 8 of them outlasted a 2-minute limit)."""
    res = sweep(variants=["torch_gru"], backends=["eager", "nnforge.triton", "nnforge.triton+graphs"],
                batch=[4], seq_len=[6], mode=["inference", "training"], dtype=["float16"],
                device=["cuda"], params={"hidden": 16, "input_size": 8}, db=db, progress=False, table=False, **fast)
    with open_store(db) as s:
        rows = s.rows(res.run_id)
    assert len(rows) == 3 * 2
    for r in rows:
        assert r["status"] == "ok", (r["variant"], r["backend"], r["mode"], r["dtype"], r["error"])
        m = json.loads(r["metrics_json"])
        assert m["clock"] == "cuda_events" and r["median_s"] > 0 and m["kernels_per_call"] >= 1
        if r["backend"].startswith("nnforge"):
            assert r["artifact"] and r["max_abs_err"] is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_oom_cell_is_a_row_and_the_sweep_goes_on_on_the_same_device(db: str, fast: dict, faulty: str) -> None:
    res = sweep(variants=["test_tanh"], backends=["test_device_oom", "eager"], batch=[2, 4], seq_len=[3],
                device=["cuda"], plugins=[faulty], db=db, progress=False, table=False, **fast)
    with open_store(db) as s:
        rows = s.rows(res.run_id)
    by = {(r["backend"], r["batch"]): r for r in rows}
    for batch in (2, 4):
        assert by[("test_device_oom", batch)]["status"] == "oom", by[("test_device_oom", batch)]["error"]
        ok = by[("eager", batch)]
        assert ok["status"] == "ok" and json.loads(ok["metrics_json"])["clock"] == "cuda_events"
        m = json.loads(ok["metrics_json"])
        if m.get("energy_per_call_j"):
            items = ok["throughput"] * ok["median_s"]  # per call
            assert m["energy_per_item_j"] == pytest.approx(m["energy_per_call_j"] / items)


def test_energy_per_item_divides_the_energy_per_call_by_the_cells_items() -> None:
    from nnforge.modelview.worker import energy_per_item

    assert energy_per_item({"energy_per_call_j": 0.3}, 96.0) == {"energy_per_item_j": pytest.approx(0.3 / 96)}
    assert energy_per_item({"energy_per_call_j": None}, 96.0) == {}
    assert energy_per_item({"nvml": "no samples"}, 96.0) == {}
    assert energy_per_item({"energy_per_call_j": 0.3}, 0.0) == {}


def test_the_graphs_form_of_nnforge_triton_compiles_with_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``nnforge.triton+graphs`` is ``nnforge.triton`` with ``options={"cuda_graphs": True}`` handed to nf.compile
    (and recorded in the row's info), so a GPU sweep times both forms side by side."""
    import nnforge

    seen: list[tuple[str, object]] = []
    real = nnforge.compile

    def spy(fn=None, *, backend="reference", options=None):
        seen.append((backend, options))
        return real(fn, backend="reference")

    monkeypatch.setattr(nnforge, "compile", spy)
    ctx = _cuda_context()
    for b, options in ((NnforgeTriton(), {}), (NnforgeTritonGraphs(), {"cuda_graphs": True})):
        seen.clear()
        prepared = b.prepare(ctx)
        assert seen and all(s == ("triton", options) for s in seen if s[0] == "triton"), seen
        assert prepared.info.get("nnforge_options", {}) == options
