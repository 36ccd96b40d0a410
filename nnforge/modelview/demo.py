"""The demo sweep behind ``make demo``: the thesis question on this machine's CPU.

Three LSTM implementations × eager / TorchScript / torch.compile / ONNX Runtime (when installed) / nnforge's
generated C (when a C compiler works) × two batch sizes, sized to finish in about three minutes on two cores
including torch.compile's compilation.
"""

from __future__ import annotations

import importlib.util

from rich.console import Console

from .runner import sweep


def demo_spec() -> dict:
    backends = ["eager", "jit.script", "compile"]
    if importlib.util.find_spec("onnxruntime") is not None:
        backends.append("onnxruntime")
    import nnforge

    if "cpu" in nnforge.available_backends():
        backends.append("nnforge.cpu")
    return {
        "name": "demo",
        "variants": ["lstm_manual", "lstm_premult", "torch_lstm"],
        "backends": backends,
        "batch": [16, 64],
        "seq_len": [24],
        "layout": ["TNC"],
        "dtype": ["float32"],
        "params": {"input_size": 128, "hidden": 128},
        # One thread: on a small shared machine a second OpenMP thread stalls whenever another process takes a core
        # (CIs of hundreds of percent were seen on the 2-core development machines); one thread keeps the
        # comparison readable. Sweep with --threads to study scaling.
        "timing": {"budget_s": 1.0, "warmup_max_s": 0.5, "target_rel_ci": 0.01, "threads": 1},
        "isolation": {"timeout_s": 300.0},
    }


def run_demo(db_path: str = "modelview.db", console: Console | None = None) -> str:
    """Run the demo sweep into ``db_path``, print progress and the closing table; return the run id."""
    console = console or Console()
    result = sweep(demo_spec(), db=db_path, console=console)
    console.print(
        f"\nrun [cyan]{result.run_id}[/] stored in {db_path}: {result.counts}. "
        f"Compare two runs with: nnforge compare RUN_A RUN_B --db {db_path}",
        highlight=False,
        soft_wrap=True,
    )
    return result.run_id


if __name__ == "__main__":
    run_demo()
