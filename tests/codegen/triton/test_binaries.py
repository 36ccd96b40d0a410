"""Built Triton kernels carried from one machine's cache to another's (``codegen/triton/binaries.py``), checked
without a GPU: a kernel built for sm_90 by Triton's own compiler (as its first launch on an H100 would build it)
is collected from a stand-in for its JIT function's device caches, restored into an empty cache, and found there
by the next build of the same kernel, which then runs none of Triton's compile stages. On a GPU,
``test_save_load.py`` checks that a loaded program's first call builds nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from nnforge.codegen.triton import TritonBackend

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not TritonBackend().available, reason="needs Triton")]

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def scale(p, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(p + i, tl.load(p + i, mask=i < n) * 3.0, mask=i < n)
'''

SCRIPT = textwrap.dedent('''
    import importlib.util, os, sys, types
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import compiler as nvc
    from nnforge.codegen.triton.binaries import collect, restore

    first, second, path = sys.argv[1:4]
    spec = importlib.util.spec_from_file_location("kernels", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    target = GPUTarget("cuda", 90, 32)
    backend = triton.compiler.make_backend(target)

    def build():
        src = triton.compiler.ASTSource(fn=m.scale, constexprs={(2,): 128},
                                        signature={"p": "*fp32", "n": "i32", "B": "constexpr"})
        return triton.compile(src, target=target, options=backend.parse_options({}).__dict__)

    os.environ["TRITON_CACHE_DIR"] = first
    built = build()

    class Finished:  # an asynchronous compile that has finished holds the kernel
        kernel = built

    class JitStandIn:  # a JITFunction's per-device entries: (kernel cache, ...)
        device_caches = {0: ({"a": built, "b": Finished(), "c": object()}, None, None)}

    module = types.ModuleType("generated")
    module.scale, module.size = JitStandIn(), 3
    groups = collect(module)
    assert list(groups) == [built.hash], list(groups)
    assert any(name.endswith(".cubin") for name in groups[built.hash]), sorted(groups[built.hash])

    def refuse(*args, **kwargs):
        raise RuntimeError("compiled")

    nvc.CUDABackend.make_ttir = staticmethod(refuse)
    os.environ["TRITON_CACHE_DIR"] = second  # another machine's empty cache
    try:
        build()
    except Exception as e:
        assert "compiled" in str(e), e
    else:
        raise SystemExit("built with the compile stages refused")
    print("restored", restore(groups), restore(groups))
    again = build()
    assert again.hash == built.hash and again.asm["cubin"] == built.asm["cubin"]
    print("found")
''')


def test_a_kernel_built_here_is_found_in_another_cache_without_compiling(tmp_path):
    path = tmp_path / "kernels.py"
    path.write_text(KERNEL)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "a"), str(tmp_path / "b"), str(path)],
                          env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "ptxas" in done.stderr and "not found" in done.stderr.lower():
        pytest.skip("Triton's CUDA backend has no ptxas here")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["restored", "1", "0", "found"]
