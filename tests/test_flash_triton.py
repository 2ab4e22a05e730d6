"""attnkit.flash_triton: the Triton kernel against torch's attention, its errors, and how it picks the interpreter.

Without a GPU every launch runs in Triton's interpreter (~0.05-0.5 s each at these sizes), so the cases are few
and small; the GPU test (float16, the bench's sizes) skips without CUDA.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

if importlib.util.find_spec("triton") is None:  # the course without Triton: this chapter's tests skip, no other
    pytest.skip("Triton is not installed (requirements.txt pins it)", allow_module_level=True)

from attnkit import flash_triton as ft  # noqa: E402 - after the skip


def _inputs(B, H, n, m, d, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, s, d, generator=g).to(device=device, dtype=dtype) for s in (n, m, m)]


def _device():
    return "cpu" if ft.INTERPRETED else "cuda"


def _lse(q, k, causal):
    s = q.double() @ k.double().transpose(-2, -1) / q.shape[-1] ** 0.5  # (B, H, n, m)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return torch.logsumexp(s, -1)


@pytest.mark.parametrize("B, H, n, m, d, causal, blocks", [
    (1, 2, 128, 128, 32, False, (64, 64)),  # two query tiles, two key tiles
    (1, 2, 100, 100, 16, True, (64, 64)),  # ragged: the last tile is part padding; the causal early exit
    (2, 1, 70, 50, 32, False, (64, 32)),  # n != m, blocks of different sizes
    (1, 1, 90, 130, 16, True, (32, 64)),  # causal with more keys than queries (counted from the start)
    (1, 2, 130, 90, 16, True, (16, 64)),  # causal, more queries than keys, BLOCK_N > BLOCK_M (a tile straddles)
])
def test_matches_torch_float32(B, H, n, m, d, causal, blocks):
    q, k, v = _inputs(B, H, n, m, d, device=_device())
    out, lse = ft.flash_attention_forward(q, k, v, causal, block_m=blocks[0], block_n=blocks[1])
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert lse.shape == (B, H, n) and lse.dtype == torch.float32
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert (out.double() - ref).abs().max().item() < 1e-5  # input_precision="ieee": no TF32 on a GPU either
    assert (lse.double() - _lse(q, k, causal)).abs().max().item() < 1e-5
    # the plain wrapper (default tiles: the same up to the order of the sums)
    assert (ft.flash_attention(q, k, v, causal) - out).abs().max().item() < 1e-6


def test_float16_in_float16_out():
    q, k, v = _inputs(1, 1, 64, 64, 32, dtype=torch.float16, device=_device())
    out = ft.flash_attention(q, k, v)
    assert out.dtype == torch.float16
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert (out.float() - ref).abs().max().item() < 3e-3


def test_scale_and_no_queries():
    q, k, v = _inputs(1, 1, 64, 64, 16, device=_device())
    out, _ = ft.flash_attention_forward(q, k, v, scale=0.5)
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.5)
    assert (out - ref).abs().max().item() < 1e-5
    empty, lse = ft.flash_attention_forward(q[:, :, :0], k, v)  # no queries: nothing to launch
    assert empty.shape == (1, 1, 0, 16) and lse.shape == (1, 1, 0)


@pytest.mark.parametrize("B, H, n, m, d, causal", [
    (1, 2, 128, 128, 32, False),  # two key tiles, two query tiles: dQ added by two programs
    (1, 1, 100, 100, 16, True),  # ragged, causal: a key tile starts its loop at the diagonal
    (2, 1, 70, 90, 16, False),  # n != m
])
def test_backward_matches_autograd(B, H, n, m, d, causal):
    q, k, v = (x.requires_grad_() for x in _inputs(B, H, n, m, d, device=_device()))
    grad_out = torch.randn(B, H, n, d, generator=torch.Generator().manual_seed(1)).to(q.device)
    grads = torch.autograd.grad(ft.flash_attention(q, k, v, causal), (q, k, v), grad_out)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
    want = torch.autograd.grad(ref, (q64, k64, v64), grad_out.double())
    for name, got, expected in zip("qkv", grads, want):
        assert got.dtype == torch.float32 and got.shape == expected.shape, name
        assert (got.double() - expected).abs().max().item() < 1e-5, name


def test_no_graph_without_gradients():
    q, k, v = _inputs(1, 1, 64, 64, 16, device=_device())
    assert ft.flash_attention(q, k, v).grad_fn is None
    q.requires_grad_()
    with torch.no_grad():
        assert ft.flash_attention(q, k, v).grad_fn is None
    assert ft.flash_attention(q, k, v).grad_fn is not None


def _raises(exc, words, *args, **kwargs):
    with pytest.raises(exc) as info:
        ft.flash_attention_forward(*args, **kwargs)
    assert words in str(info.value), str(info.value)


def test_bad_inputs_are_named_before_any_launch():
    q, k, v = _inputs(1, 2, 64, 64, 16)
    _raises(ValueError, "(B, H, seq, d), got (2, 64, 16)", q[0], k, v)
    _raises(TypeError, "must be a torch.Tensor, got list", q, k.tolist(), v)
    _raises(ValueError, "k and v must have the same shape", q, k, v[:, :, :10])
    _raises(ValueError, "must share B, H and d", q, k[:, :1], v[:, :1])
    _raises(TypeError, "share one dtype", q, k.double(), v)
    _raises(TypeError, "share one dtype", q.double(), k.double(), v.double())
    _raises(ValueError, "power of two of at least 16", *_inputs(1, 1, 8, 8, 24))
    _raises(ValueError, "power of two of at least 16", *_inputs(1, 1, 8, 8, 8))
    _raises(ValueError, "block_m must be a power of two", q, k, v, block_m=48)
    _raises(ValueError, "block_n must be a power of two", q, k, v, block_n=8)  # tl.dot needs 16 on a GPU
    _raises(ValueError, "m = 0", q, k[:, :, :0], v[:, :, :0])


@pytest.mark.skipif(not ft.INTERPRETED, reason="the interpreter's refusals")
def test_interpreter_refuses_bfloat16():
    _raises(TypeError, "interpreter", *_inputs(1, 1, 16, 16, 16, dtype=torch.bfloat16))


def test_cpu_tensors_for_a_compiled_kernel_are_named(monkeypatch):
    monkeypatch.setattr(ft, "INTERPRETED", False)
    _raises(ValueError, "set TRITON_INTERPRET=1", *_inputs(1, 1, 16, 16, 16))


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="without a GPU only")
def test_interpreter_chosen_without_a_gpu_and_a_set_value_respected():
    code = ("import os, attnkit.flash_triton as f; "
            "print(f.INTERPRETED, os.environ.get('TRITON_INTERPRET'))")
    assert _python(code).stdout.split() == ["True", "1"]
    assert _python(code, TRITON_INTERPRET="0").stdout.split() == ["False", "0"]


def test_attnkit_runs_without_triton():
    """Every other chapter's package works where Triton is missing; this module says what to install."""
    code = ("import sys; sys.modules['triton'] = None\n"
            "import attnkit; assert 'triton' not in sys.modules or sys.modules['triton'] is None\n"
            "try:\n    import attnkit.flash_triton\nexcept ImportError as e:\n    print(e)\n")
    out = _python(code)
    assert "pip install 'triton>=3.7.1,<3.10'" in out.stdout, out.stdout + out.stderr


def test_the_stated_requirement_is_requirements_txt_s():
    """The module's message, chapter 10's install cell and requirements.txt name one Triton requirement."""
    from tools.install_cell import requirement

    assert ft.TRITON_REQUIREMENT == requirement("triton")


def test_bench_needs_a_gpu(capsys):
    if not ft.INTERPRETED and torch.cuda.is_available():
        pytest.skip("a GPU is here: the device check runs the bench")
    with pytest.raises(RuntimeError, match="needs a GPU"):
        ft.bench()
    assert ft.main(["--bench"]) == 0
    assert "skipped: the benchmark needs a GPU" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available() or ft.INTERPRETED, reason="needs a GPU (compiled kernel)")
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_float16_matches_torch(causal):
    q, k, v = _inputs(2, 4, 1000, 1000, 64, dtype=torch.float16, device="cuda")
    out = ft.flash_attention(q, k, v, causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert (out.float() - ref.float()).abs().max().item() < 1e-2


def test_block_pointers_and_tensor_descriptors_as_chapter_10_says():
    """Chapter 10: Triton 3.9 removed tl.make_block_ptr (it raises), 3.7 and 3.8 still run it; tensor
    descriptors run on every Triton that requirements.txt admits, in the interpreter too."""
    import triton
    import triton.language as tl
    from packaging.version import Version

    if not ft.INTERPRETED:
        pytest.skip("the interpreter's behaviour; a GPU compiles (chapter 10 runs it there)")

    @triton.jit
    def copy_block_ptr(Q, O, n, BLOCK: tl.constexpr, D: tl.constexpr):
        q_ptr = tl.make_block_ptr(Q, (n, D), (D, 1), (tl.program_id(0) * BLOCK, 0), (BLOCK, D), (1, 0))
        o_ptr = tl.make_block_ptr(O, (n, D), (D, 1), (tl.program_id(0) * BLOCK, 0), (BLOCK, D), (1, 0))
        tl.store(o_ptr, tl.load(q_ptr, boundary_check=(0,)), boundary_check=(0,))

    @triton.jit
    def copy_desc(Q, O, n, BLOCK: tl.constexpr, D: tl.constexpr):
        q_desc = tl.make_tensor_descriptor(Q, [n, D], [D, 1], [BLOCK, D])
        o_desc = tl.make_tensor_descriptor(O, [n, D], [D, 1], [BLOCK, D])
        o_desc.store([tl.program_id(0) * BLOCK, 0], q_desc.load([tl.program_id(0) * BLOCK, 0]))

    q = torch.randn(100, 16)
    buffer = torch.full((q.numel() + 64 * 16,), -1.0)
    copy_desc[(2,)](q, buffer, 100, BLOCK=64, D=16)
    assert torch.equal(buffer[: q.numel()].view_as(q), q) and bool((buffer[q.numel():] == -1).all())
    o = torch.empty_like(q)
    if Version(triton.__version__).release[:2] >= (3, 9):
        with pytest.raises(Exception, match="Block pointers have been removed"):
            copy_block_ptr[(2,)](q, o, 100, BLOCK=64, D=16)
    else:
        with pytest.warns(UserWarning, match="deprecated"):
            copy_block_ptr[(2,)](q, o, 100, BLOCK=64, D=16)
        assert torch.equal(o, q)
