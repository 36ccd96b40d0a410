"""A throwaway git repository whose commits change how much CPU work a plugin variant does (never a sleep): what
``nnforge ab`` and ``nnforge history`` are checked on (bench/modelview_ab.py; tests/modelview/test_ab_history.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

PLUGIN = '''"""CPU-bound work whose amount a commit changes."""
import torch
from torch import nn

from nnforge.modelview import Param, Request, Variant, variant

REPEAT = {repeat}


class Net(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.w = nn.Parameter(torch.randn(width, width, generator=g, dtype=torch.float64) / width**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(REPEAT):
            x = torch.tanh(x @ self.w)
        return x


@variant
class Work(Variant):
    name = "work"
    description = "REPEAT matmul + tanh layers"
    params = {{"width": Param({width})}}
    throughput_unit = "vectors/s"

    def module(self, req: Request) -> nn.Module:
        return Net(req.params["width"])

    def inputs(self, req: Request, gen: torch.Generator):
        return (torch.randn(req.seq_shape(req.params["width"]), generator=gen, dtype=torch.float64),)

    def flops(self, req: Request) -> float:
        return float(REPEAT * 2 * req.batch * req.seq_len * req.params["width"] ** 2)

    def min_bytes(self, req: Request, itemsize: int) -> float:
        return float(2 * req.batch * req.seq_len * req.params["width"] * itemsize)
'''

SPEC = '''name = "work"
variants = ["work"]
backends = ["eager"]
batch = [8]
seq_len = [{seq_len}]
plugins = ["work.py"]
measure_peaks = false
seed = 3

[timing]
{timing}
'''

# the [timing] a test's revisions are measured with: short, CPU time (the machine is shared)
TEST_TIMING = {"budget_s": 1.0, "clock": "cpu", "warmup_max_s": 0.2, "threads": 1, "round_samples": 2,
               "target_rel_ci": 0.01}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_repo(repo: Path, repeats: list[int | None], *, width: int = 48, seq_len: int = 8,
              timing: dict | None = None) -> list[str]:
    """One commit per entry: REPEAT (matmul + tanh layers of ``width``) set to that value (None: an unrelated
    change), the spec's ``[timing]`` from ``timing`` (``TEST_TIMING`` by default). Returns the commits, oldest
    first."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bench@example.com")
    git(repo, "config", "user.name", "bench")
    table = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in (timing or TEST_TIMING).items())
    (repo / "bench.toml").write_text(SPEC.format(seq_len=seq_len, timing=table))
    commits = []
    for i, r in enumerate(repeats):
        if r is None:
            (repo / "NOTES.md").write_text(f"note {i}\n")
            msg = f"commit {i}: notes only"
        else:
            (repo / "work.py").write_text(PLUGIN.format(repeat=r, width=width))
            msg = f"commit {i}: REPEAT = {r}"
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", msg)
        commits.append(git(repo, "rev-parse", "HEAD"))
    return commits
