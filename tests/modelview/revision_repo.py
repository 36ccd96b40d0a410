"""A throwaway git repository whose commits change how much CPU work a plugin variant does (never a sleep)."""

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
    params = {{"width": Param(48)}}
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
seq_len = [8]
plugins = ["work.py"]
measure_peaks = false
seed = 3

[timing]
budget_s = {budget}
clock = "cpu"
warmup_max_s = 0.2
threads = 1
round_samples = 2
target_rel_ci = 0.01
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_repo(repo: Path, repeats: list[int | None], budget: float = 1.0) -> list[str]:
    """One commit per entry: REPEAT set to that value (None: an unrelated change). Returns the commits, oldest first."""
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bench@example.com")
    git(repo, "config", "user.name", "bench")
    (repo / "bench.toml").write_text(SPEC.format(budget=budget))
    commits = []
    for i, r in enumerate(repeats):
        if r is None:
            (repo / "NOTES.md").write_text(f"note {i}\\n")
            msg = f"commit {i}: notes only"
        else:
            (repo / "work.py").write_text(PLUGIN.format(repeat=r))
            msg = f"commit {i}: REPEAT = {r}"
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", msg)
        commits.append(git(repo, "rev-parse", "HEAD"))
    return commits
