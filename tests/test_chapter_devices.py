"""Chapters on a GPU, checked on a machine without one (issue 26).

Two kinds of mistakes pass every CPU run and fail a reader on Colab's GPU runtime:

* a tensor made on the wrong device: a constant made without ``device=`` (on the CPU) meets
  the chapter's tensors on the GPU (chapter 06's shift matrix, ``P64[7:] @ M.T``);
* an assertion only a CPU satisfies: the chapter takes another branch on a GPU, and what it
  asserts there is false (chapter 08 asserted its CPU byte count under
  ``torch.cuda.max_memory_allocated``, which also counts what the GPU's libraries allocate
  once, cuBLAS's workspace at the first matrix product).

``tests/standin_device.py`` runs a chapter with a stand-in ``cuda`` device: CPU tensors that
say they are on ``cuda`` and refuse what CUDA refuses, and ``torch.cuda``'s memory statistics
modelled on the caching allocator (see its docstring). The fast tests below check that the
stand-in catches each kind and lets correct code through; the slow ones run chapters 01-08 on
it (each is a second execution of the chapter, at about its CPU cost).

What the stand-in cannot see: numbers that differ on a GPU (TF32 matrix products, other
reduction orders, cuDNN/cuBLAS kernels, CUDA's random streams: every value and tolerance here
is the CPU's); kernels that exist on one device only (a fused or Triton kernel, bfloat16
support); timings and what prose says about them (the chapters compute those sentences from
their own measurements instead); GPU memory beyond the model's two rules (workspace at first
use, 512-byte rounding): fragmentation, cuDNN/cuBLASLt workspaces, out-of-memory; the CUDA
branch of ``attnkit`` code that tests ``is_cuda`` from C++; asynchronous errors; and anything
a chapter does on a device other than ``cuda`` (``mps``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "standin_device.py"
CHAPTERS = [f"book/{p.stem}" for p in sorted((ROOT / "book").glob("0[1-8]_*.ipynb"))]

_SETUP = """
import attnkit, torch
from attnkit.efficient import peak_memory
device = attnkit.default_device()
"""

# name: (code run on the stand-in, the exception it must raise, or None: it must pass)
CASES = {
    "a CPU matrix meets a device tensor (chapter 06's shift matrix)": (
        "P = attnkit.sinusoidal_positional_encoding(10, 8, device=device)\n"
        "M = attnkit.position_shift_matrix(7, 8)\n"
        "P[7:] @ M.T", "DeviceMismatch"),
    "a module left on the CPU": (
        "torch.nn.Linear(3, 3)(torch.randn(2, 3, device=device))", "DeviceMismatch"),
    "a CPU tensor in torch.cat": (
        "torch.cat([torch.zeros(2, device=device), torch.zeros(2)])", "DeviceMismatch"),
    "a CPU tensor indexed by a device tensor": (
        "torch.arange(5)[torch.tensor([1, 2], device=device)]", "DeviceMismatch"),
    "a device tensor handed to NumPy (matplotlib does this)": (
        "import numpy as np\nnp.asarray(torch.randn(3, device=device))", "TypeError"),
    "a CPU generator sampling on the device": (
        "torch.randn(3, device=device, generator=torch.Generator())", "DeviceMismatch"),
    "the CPU tensor count asserted on the GPU allocator (chapter 08)": (
        "q = torch.randn(1, 1, 256, 64, device=device)\n"
        "b = peak_memory(lambda q: attnkit.softmax(q @ q.transpose(-2, -1)), q)\n"
        "assert b < 4 * 256 * 256 * 4, b", "AssertionError"),
    "correct code passes": (
        "assert device.type == 'cuda' and torch.zeros(1, device=device).is_cuda\n"
        "lin = torch.nn.Linear(3, 3).to(device)\n"
        "x = torch.randn(4, 3, device=device)\n"
        "opt = torch.optim.Adam(lin.parameters())\n"
        "lin(x).sum().backward(); opt.step()\n"
        "y = x * torch.tensor(2.0) + x[torch.tensor([0, 1])].sum()  # CPU scalar, CPU index\n"
        "M = attnkit.position_shift_matrix(7, 8, device=device)\n"
        "P = attnkit.sinusoidal_positional_encoding(10, 8, device=device)\n"
        "torch.testing.assert_close(P[:3] @ M, P[7:])\n"
        "g = torch.Generator(device=device); g.manual_seed(0)\n"
        "torch.multinomial(torch.ones(3, device=device), 2, generator=g)\n"
        "x.cpu().numpy(); float(x.sum()); x.tolist(); print(x)\n"
        "q = torch.randn(1, 1, 256, 64, device=device)\n"
        "f = lambda q: attnkit.softmax(q @ q.transpose(-2, -1))\n"
        "peak_memory(f, q)  # the first product allocates the workspace\n"
        "assert peak_memory(f, q) < 4 * 256 * 256 * 4\n"
        "try:\n"
        "    torch.testing.assert_close(x, x.cpu())\n"
        "    raise RuntimeError('devices compared equal')\n"
        "except AssertionError:\n"
        "    pass\n", None),
}

_RUNNER = """
import json, sys, traceback
sys.path.insert(0, {tests!r})
import standin_device
standin_device.install()
results = {{}}
for name, code in json.loads(sys.stdin.read()).items():
    try:
        exec({setup!r} + code, {{"__name__": "__main__"}})
        results[name] = None
    except Exception as exc:
        results[name] = [type(exc).__name__, str(exc)[:300]]
print("RESULTS" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def case_results() -> dict:
    """Every case run on the stand-in, in one process (the stand-in patches torch for good)."""
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER.format(tests=str(STANDIN.parent), setup=_SETUP)],
        input=json.dumps({name: code for name, (code, _) in CASES.items()}),
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULTS")), None)
    assert line, f"the stand-in runner failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return json.loads(line.removeprefix("RESULTS"))


@pytest.mark.parametrize("name", CASES)
def test_standin_catches_what_a_gpu_refuses(case_results, name):
    """Each mistake raises on the stand-in what it raises on CUDA; correct code runs."""
    expected, got = CASES[name][1], case_results[name]
    if expected is None:
        assert got is None, f"{name}: correct code raised on the stand-in: {got}"
    else:
        assert got is not None, f"{name}: the stand-in let it through"
        assert got[0] == expected, f"{name}: expected {expected}, got {got}"


@pytest.mark.slow
@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_runs_on_a_standin_gpu(docname):
    """The chapter, every code cell in order, on the stand-in CUDA device: nothing raises."""
    proc = subprocess.run([sys.executable, str(STANDIN), str(ROOT / f"{docname}.ipynb")],
                          capture_output=True, text=True, cwd=ROOT, timeout=1200)
    failed = [x for x in proc.stderr.splitlines() if x.startswith("STANDIN-FAILED")]
    assert proc.returncode == 0, (
        f"{docname} fails on a GPU (stand-in device, tests/standin_device.py):\n"
        + ("\n".join(failed) or proc.stderr[-3000:]))
