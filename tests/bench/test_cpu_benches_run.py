"""The CPU bench scripts that compare nnforge with torch run to the end at tiny sizes and print the lines their
results are read from (a script broken since it was last run would be found when a measurement is wanted).
Nothing here is timed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import nnforge as nf

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


@pytest.mark.parametrize("model", [[], ["--gpt"]])
def test_transformer_cpu_bench_times_nnforge_against_torch(model: list[str]):
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "bench/transformer_cpu.py", "--steps", "12", "--batch", "2", "--width",
                           "16", "--heads", "2", "--ff", "32", "--rounds", "1", *model], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = done.stdout
    assert "float32 inference" in out and "float32 training step" in out
    assert ("GPT block (from_torch)" in out) == bool(model)
    assert out.count("torch / nnforge = ") == 2 and "failed" not in out
    errors = [float(line.split("error vs float64 ")[1].split()[0]) for line in out.splitlines()
              if "error vs float64" in line]
    assert len(errors) == 4 and max(errors) < 1e-5  # the same layer: both agree with float64


def test_ctc_cpu_bench_times_the_loss_and_its_gradient_against_torch():
    """Both calls of a tiny shape timed against torch's ``ctc_loss``, after the script's own comparison of the
    losses and the gradient with torch's (an assertion there fails the script)."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "bench/ctc_cpu.py", "--repeats", "1", "--shapes", "12,3,5,4"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.strip().startswith("(12, 3, 5, 4)")]
    assert [row[4] for row in rows] == ["loss", "loss+grad"] and all(row[-1].endswith("x") for row in rows)


def test_call_overhead_cpu_bench_times_short_calls_against_torch_and_numpy():
    """Every function's row, after the script's own check that the three sides agree."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "bench/call_overhead_cpu.py", "--rounds", "1", "--calls", "3"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = [line for line in done.stdout.splitlines() if line.rstrip().endswith("x")]
    assert [row.split(",")[0].strip() for row in rows] == ["a * b + 1", "MLP 64-64-64", "LSTM cell H=32"]
    assert "through torch autograd" in done.stdout and "torch / nnforge" in done.stdout
