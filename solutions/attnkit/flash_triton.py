"""FlashAttention's forward pass as a Triton kernel (chapter 10).

Shape legend: ``B`` batch, ``H`` heads, ``n`` queries, ``m`` keys and values, ``d`` the head width
(the same for queries, keys and values), ``BLOCK_M`` queries and ``BLOCK_N`` keys per tile.

:func:`flash_attention` computes ``softmax(Q K^T / sqrt(d)) V`` like
``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)`` on ``(B, H, n, d)``
tensors, with chapter 08's online softmax written as one GPU program per tile of ``BLOCK_M`` queries
(Dao et al., 2022; Dao, 2023): the program loads its queries once, walks the keys and values one tile
at a time, and keeps per query only a running maximum, a running sum and a running weighted sum of
values, in registers. :func:`flash_attention_forward` also returns the log-sum-exp of each query's
scores, what a backward pass needs to recompute the weights without storing them.

Where it runs. Triton compiles the kernel for a GPU; without one, Triton's interpreter runs the same
source on the CPU, with numpy, one program after another (slowly: use small sizes). The interpreter
is chosen by the environment variable ``TRITON_INTERPRET=1``, which Triton reads when a kernel is
decorated with ``@triton.jit``. This module decides once, when it is imported: if the variable is
unset and torch sees no GPU, it sets ``TRITON_INTERPRET=1`` before importing Triton and defining the
kernel. A value you set yourself (``0`` or ``1``) is respected. :data:`INTERPRETED` says which path
the kernel took. Set the variable before importing anything that defines Triton kernels: a kernel
decorated before it was set stays compiled.

Numerics. The products run with ``input_precision="ieee"`` on float32 inputs, so a GPU's TF32 tensor
cores (about 1e-3 relative error) are not used silently: float32 matches torch within 1e-5 on both
paths. float16 (and bfloat16, GPU only) inputs use the tensor cores, with float32 accumulators.
The interpreter refuses bfloat16, whose ``tl.dot`` it computes wrongly (a known Triton issue).

``python -m attnkit.flash_triton --bench`` times the kernel against torch's
``scaled_dot_product_attention`` in float16 on a GPU (:func:`bench`).
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

TRITON_REQUIREMENT = "triton>=3.7.1,<3.10"
"""The Triton releases this module runs on, as requirements.txt states them: 3.7.1 is the one PyPI's torch 2.13.0
(CUDA build) pins; 3.9 removed block pointers (``tl.make_block_ptr`` raises), which the kernels here never use."""

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # no GPU: run the kernel with Triton's interpreter, on the CPU

try:
    import triton
    import triton.language as tl
except ImportError as e:  # pragma: no cover - exercised where Triton is missing
    raise ImportError(f"attnkit.flash_triton needs Triton: pip install '{TRITON_REQUIREMENT}' (Linux, Python >= 3.10); "
                      "every other part of attnkit works without it") from e

__all__ = ["INTERPRETED", "flash_forward_kernel", "flash_backward_kernel", "flash_attention", "flash_attention_forward",
           "bench", "BenchRow", "GPU_CONFIGS"]

LOG2_E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))
LN_2 = 0.6931471805599453  # ln(2): converts a base-2 log back to a natural one


@triton.jit
def flash_forward_kernel(
    Q, K, V, O, LSE,  # q, o (B·H, n, d); k, v (B·H, m, d); lse (B·H, n): contiguous
    n, m, qk_scale,  # lengths; the scores' scale times log2(e)
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """One program: BLOCK_M queries of one (batch, head) against the keys they see."""
    start_m = tl.program_id(0)  # which tile of queries
    bh = tl.program_id(1)  # which (batch, head)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    cols = tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions within a tile
    dims = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)

    # the query tile, loaded once and kept in registers; rows past n read as 0
    q_ptrs = Q + (bh * n + rows[:, None]) * HEAD_DIM + dims[None, :]
    q = tl.load(q_ptrs, mask=rows[:, None] < n, other=0.0)  # (BLOCK_M, HEAD_DIM)

    # the online softmax's state: running max (base 2), running sum, accumulator
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # (BLOCK_M,)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # (BLOCK_M,)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # (BLOCK_M, HEAD_DIM)

    # causal: no key past this tile's last query is ever loaded
    end = tl.minimum((start_m + 1) * BLOCK_M, m) if CAUSAL else m
    for start_n in range(0, end, BLOCK_N):
        keys = start_n + cols  # (BLOCK_N,)
        k_ptrs = K + (bh * m + keys[None, :]) * HEAD_DIM + dims[:, None]
        kT = tl.load(k_ptrs, mask=keys[None, :] < m, other=0.0)  # (HEAD_DIM, BLOCK_N)
        s = tl.dot(q, kT, input_precision="ieee") * qk_scale  # (BLOCK_M, BLOCK_N)
        visible = keys[None, :] < m  # (1, BLOCK_N): keys past m are padding
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])  # (BLOCK_M, BLOCK_N)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # (BLOCK_M,)
        alpha = tl.exp2(m_i - m_new)  # (BLOCK_M,) rescales what the old max summed
        p = tl.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N) unnormalised weights
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v_ptrs = V + (bh * m + keys[:, None]) * HEAD_DIM + dims[None, :]
        v = tl.load(v_ptrs, mask=keys[:, None] < m, other=0.0)  # (BLOCK_N, HEAD_DIM)
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")  # (BLOCK_M, HEAD_DIM)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    acc = acc / l_i[:, None]  # normalise once, at the end
    o_ptrs = O + (bh * n + rows[:, None]) * HEAD_DIM + dims[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=rows[:, None] < n)
    # the natural log-sum-exp of each row's scores: the backward pass needs it
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # times ln 2
    tl.store(LSE + bh * n + rows, lse, mask=rows < n)


def _decorated_for_interpreter() -> bool:
    return type(flash_forward_kernel).__name__ == "InterpretedFunction"


INTERPRETED: bool = _decorated_for_interpreter()
"""True when the kernel runs in Triton's interpreter (on the CPU), False when Triton compiles it for a GPU."""

# block sizes: the interpreter's cost is per program and per loop step, so big tiles are fastest there;
# on a GPU, 128 queries by 64 keys keeps a tile's state in registers with room for 4 warps' pipelining
DEFAULT_BLOCKS = (64, 64) if INTERPRETED else (128, 64)


def _power_of_two(x: int) -> bool:
    return isinstance(x, int) and x > 0 and x & (x - 1) == 0


def _check(q: Tensor, k: Tensor, v: Tensor, block_m: int, block_n: int) -> None:
    """A clear error for inputs the kernel cannot take, naming what was expected and what came."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, seq, d), got {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, H, m, d), got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q (B, H, n, d) and k, v (B, H, m, d) must share B, H and d: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share one dtype among float16, bfloat16 and float32, got {q.dtype}, "
                        f"{k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    d = q.shape[-1]
    if not _power_of_two(d) or d < 16:
        raise ValueError(f"the head width d must be a power of two of at least 16 (tl.arange needs a power of two, "
                         f"a GPU's tl.dot at least 16), got d = {d}")
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if not _power_of_two(b) or b < 16:
            raise ValueError(f"{name} must be a power of two of at least 16 (the GPU compiler rejects other tile "
                             f"shapes, even where the interpreter runs them), got {b!r}")
    if k.shape[2] == 0:
        raise ValueError("k and v have no positions (m = 0): every query needs at least one key")
    if INTERPRETED:
        if q.dtype == torch.bfloat16:
            raise TypeError("bfloat16 inputs are not supported by Triton's interpreter (its tl.dot computes them "
                            "wrongly): pass float32 or float16, or run on a GPU")
    elif q.device.type != "cuda":
        raise ValueError(f"the kernel was compiled for the GPU but the tensors are on {q.device}: move them to "
                         "'cuda', or set TRITON_INTERPRET=1 before importing attnkit.flash_triton to run on the CPU")


def flash_attention_forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool = False, *,
    scale: float | None = None, block_m: int | None = None, block_n: int | None = None,
    num_warps: int = 4, num_stages: int = 2,
) -> tuple[Tensor, Tensor]:
    """``(output, lse)``: attention of ``q`` (B, H, n, d) over ``k``, ``v`` (B, H, m, d)
    and the natural log-sum-exp of each query's scaled scores, (B, H, n) float32.

    ``causal``: query ``i`` sees keys ``j <= i`` (from the start, as
    ``scaled_dot_product_attention(..., is_causal=True)``). ``scale``: the scores'
    factor, ``1/sqrt(d)`` by default. ``block_m``, ``block_n``: queries and keys per
    tile, powers of two of at least 16. ``num_warps``, ``num_stages``: how a GPU runs
    a program (the interpreter ignores them).
    """
    block_m, block_n = block_m or DEFAULT_BLOCKS[0], block_n or DEFAULT_BLOCKS[1]
    _check(q, k, v, block_m, block_n)
    (B, H, n, d), m = q.shape, k.shape[2]
    # contiguous: row i of head bh starts at element (bh * n + i) * d
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)  # (B, H, n, d)
    lse = torch.empty(B, H, n, device=q.device, dtype=torch.float32)  # (B, H, n)
    if n == 0 or B * H == 0:
        return out, lse
    # exp(x) = exp2(x * log2(e)): the kernel works in base 2
    qk_scale = (1.0 / math.sqrt(d) if scale is None else float(scale)) * LOG2_E
    grid = (triton.cdiv(n, block_m), B * H)  # one program per query tile and head
    flash_forward_kernel[grid](
        q, k, v, out, lse, n, m, qk_scale, CAUSAL=bool(causal), BLOCK_M=block_m,
        BLOCK_N=block_n, HEAD_DIM=d, num_warps=num_warps, num_stages=num_stages)
    return out, lse


# -- the backward pass (a stretch of chapter 10): gradients from the saved log-sum-exp ------------------------------


@triton.jit
def flash_backward_kernel(
    Q, K, V, DO,  # q, do (B·H, n, d); k, v (B·H, m, d)
    LSE, DELTA,  # the forward's log-sum-exp, rowsum(dO * O): (B·H, n) float32
    DQ, DK, DV,  # dq float32 (B·H, n, d), added into; dk, dv (B·H, m, d)
    n, m, qk_scale, sm_scale,  # qk_scale = sm_scale * log2(e)
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """One program: a tile of BLOCK_N keys of one (batch, head) against every query that
    sees them. P is recomputed from the log-sum-exp; dK and dV stay in registers; each
    query tile's share of dQ is added to DQ atomically (several programs write it)."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    keys = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    dims = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
    kv_offsets = (bh * m + keys[:, None]) * HEAD_DIM + dims[None, :]
    k = tl.load(K + kv_offsets, mask=keys[:, None] < m, other=0.0)  # (BLOCK_N, D)
    v = tl.load(V + kv_offsets, mask=keys[:, None] < m, other=0.0)  # (BLOCK_N, D)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    # causal: queries before this key tile's first key never see it
    begin = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start_m in range(begin, n, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
        q_offsets = (bh * n + rows[:, None]) * HEAD_DIM + dims[None, :]
        q = tl.load(Q + q_offsets, mask=rows[:, None] < n, other=0.0)  # (BLOCK_M, D)
        do = tl.load(DO + q_offsets, mask=rows[:, None] < n, other=0.0)
        lse = tl.load(LSE + bh * n + rows, mask=rows < n, other=0.0)  # (BLOCK_M,)
        delta = tl.load(DELTA + bh * n + rows, mask=rows < n, other=0.0)  # (BLOCK_M,)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # (BM, BN)
        p = tl.exp2(s - lse[:, None] * 1.4426950408889634)  # the forward's weights
        valid = (rows[:, None] < n) & (keys[None, :] < m)
        if CAUSAL:
            valid = valid & (keys[None, :] <= rows[:, None])
        p = tl.where(valid, p, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision="ieee")
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])  # the softmax's backward
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision="ieee")
        dq = tl.dot(ds.to(k.dtype), k, input_precision="ieee") * sm_scale
        tl.atomic_add(DQ + q_offsets, dq, mask=rows[:, None] < n)
    dk = dk * sm_scale
    tl.store(DK + kv_offsets, dk.to(DK.dtype.element_ty), mask=keys[:, None] < m)
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty), mask=keys[:, None] < m)


class _FlashAttention(torch.autograd.Function):
    """The forward kernel, with :func:`flash_backward_kernel` as its backward."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float | None) -> Tensor:
        out, lse = flash_attention_forward(q, k, v, causal, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        (B, H, n, d), m = q.shape, k.shape[2]
        q, k, v, grad_out = q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous()
        sm_scale = 1.0 / math.sqrt(d) if ctx.scale is None else float(ctx.scale)
        delta = (grad_out.float() * out.float()).sum(-1).contiguous()  # (B, H, n): rowsum(dO * O)
        dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)  # atomics add into it
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        block_m, block_n = DEFAULT_BLOCKS
        grid = (triton.cdiv(m, block_n), B * H)
        flash_backward_kernel[grid](q, k, v, grad_out, lse, delta, dq, dk, dv, n, m, sm_scale * LOG2_E, sm_scale,
                                    CAUSAL=bool(ctx.causal), BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=d)
        return dq.to(q.dtype), dk, dv, None, None


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """``softmax(q k^T / sqrt(d)) v`` (with ``causal``: query ``i`` sees keys ``j <= i``) on (B, H, n, d)
    tensors, by the Triton kernel: the output of :func:`flash_attention_forward`, differentiable (the
    backward is :func:`flash_backward_kernel`, recomputing the weights from the saved log-sum-exp)."""
    if torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in (q, k, v)):
        return _FlashAttention.apply(q, k, v, causal, None)
    return flash_attention_forward(q, k, v, causal)[0]


# -- the benchmark: the kernel against torch's own, in float16 on a GPU -------------------------------------------


from dataclasses import dataclass  # noqa: E402 - the benchmark's own imports, kept beside it


# launch settings the benchmark tries on a GPU (block_m, block_n, num_warps, num_stages); it keeps the fastest
# for each length, as torch picks among its own kernels
GPU_CONFIGS = ((128, 64, 4, 2), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3))


@dataclass
class BenchRow:
    n: int
    causal: bool
    triton_ms: float
    torch_ms: float
    config: tuple[int, int, int, int]  # the kernel's (block_m, block_n, num_warps, num_stages)

    @property
    def ratio(self) -> float:
        """time(kernel) / time(torch's scaled_dot_product_attention): below 1, the kernel is faster."""
        return self.triton_ms / self.torch_ms


def _cuda_ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def bench(lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192), batch: int = 4, heads: int = 16, d: int = 64,
          repeats: int = 50, dtype: torch.dtype = torch.float16, printed: bool = True,
          configs: tuple[tuple[int, int, int, int], ...] = GPU_CONFIGS) -> list[BenchRow]:
    """Median milliseconds of :func:`flash_attention_forward` and of ``F.scaled_dot_product_attention`` on the
    same (batch, heads, n, d) inputs, causal and not, alternating calls so that a busy GPU slows both alike. For
    each length the kernel runs with the fastest of ``configs`` (5 calls each), checked against torch first.
    Needs a GPU (the interpreter would take hours); raises RuntimeError without one."""
    import statistics

    import torch.nn.functional as F

    if INTERPRETED or not torch.cuda.is_available():
        raise RuntimeError("the benchmark needs a GPU: the kernel runs in Triton's interpreter here "
                           f"(TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}, cuda available: "
                           f"{torch.cuda.is_available()})")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    if printed:
        print(f"flash_attention vs F.scaled_dot_product_attention, {dtype}, B={batch} H={heads} d={d}, "
              f"{torch.cuda.get_device_name()}, median of {repeats}")
        print(f"{'n':>6} {'causal':>6} {'triton ms':>10} {'torch ms':>10} {'ratio':>6}  kernel (BM, BN, warps, stages)")
    for n in lengths:
        q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
        for causal in (False, True):
            theirs = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
            want = theirs().float()

            def ours_with(c):
                return lambda: flash_attention_forward(q, k, v, causal, block_m=c[0], block_n=c[1], num_warps=c[2],
                                                       num_stages=c[3])[0]

            best, best_ms = None, math.inf
            for c in configs:
                fn = ours_with(c)
                err = (fn().float() - want).abs().max().item()  # compiles, and checks
                if err > 2e-2:
                    raise AssertionError(f"n={n} causal={causal} {c}: the kernel differs from torch by {err:.3g}")
                ms = statistics.median(_cuda_ms(fn) for _ in range(5))
                if ms < best_ms:
                    best, best_ms = c, ms
            ours = ours_with(best)
            times: dict[str, list[float]] = {"ours": [], "theirs": []}
            for fn in (ours, theirs, ours, theirs):  # warm-up
                fn()
            for i in range(repeats):
                for name, fn in ((("ours", ours), ("theirs", theirs)) if i % 2 == 0 else
                                 (("theirs", theirs), ("ours", ours))):
                    times[name].append(_cuda_ms(fn))
            row = BenchRow(n, causal, statistics.median(times["ours"]), statistics.median(times["theirs"]), best)
            rows.append(row)
            if printed:
                print(f"{n:>6} {str(causal):>6} {row.triton_ms:>10.3f} {row.torch_ms:>10.3f} {row.ratio:>6.2f}  "
                      f"{row.config}")
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="FlashAttention's forward in Triton (chapter 10)")
    parser.add_argument("--bench", action="store_true", help="time the kernel against torch's attention (GPU)")
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192", help="sequence lengths, comma-separated")
    args = parser.parse_args(argv)
    if not args.bench:
        parser.print_help()
        return 0
    try:
        bench(tuple(int(x) for x in args.lengths.split(",")))
    except RuntimeError as e:
        print(f"skipped: {e}")
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
