"""Checks of exercise 10_flash_triton, run in Triton's interpreter on the CPU (n <= 130, tiles of 32 or 64, two
launches a check at most; the judge never imports Triton). The kernel's checks launch it on the stated grid themselves
(a wrong wrapper costs no kernel check): inputs in buffers that go on with NaN (a load without a mask reads them),
outputs in buffers of a marker (a row never written keeps it, a store past the end changes the tail). The wrapper is
judged against that launch of the student's own kernel (a wrong kernel costs no wrapper check). The references come
from a float64 emulation of the tiled loop whose switches make the classic mistakes. What a GPU refuses but the
interpreter runs is tested by its effect: tile sizes (a ValueError), masks (the NaN), bfloat16 in tl.dot (one-hot rows).
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import Tensor

from autograder.judging.checks import (PLACEHOLDER, CheckFailed, Obj, StudentError, Suite, Trial, close,
                                       expect_value_error, fail_if_named, number, requirements)

SUITE = Suite("10_flash_triton")
KERNEL, WRAPPER = "flash_forward_kernel", "flash_attention_forward"
LOG2_E, LN_2 = math.log2(math.e), math.log(2.0)
KERNEL_CHECKS = _TILES, _RAGGED, _CAUSAL, _LSE = ("test_kernel_tiles", "test_kernel_ragged", "test_kernel_causal",
                                                  "test_kernel_lse")
_LAUNCH, _SHAPES, _STRIDES = "test_wrapper_launch", "test_wrapper_shapes", "test_wrapper_strides"
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'the running max rescales the sum and the accumulator': (_TILES, 'rescale', 'rescales the sum and the accumulator',
        (_RAGGED, _CAUSAL)),
    'exp2 with log2(e) folded into the scale': (_TILES, 'log2(e)', 'log2(e) folded into the scale', KERNEL_CHECKS[1:]),
    'masked loads': (_RAGGED, 'without a mask', 'a mask on every tl.load and tl.store'),
    'masked stores': (_RAGGED, 'past the end of o', 'a mask on every tl.load and tl.store'),
    'keys past m are not attended': (_RAGGED, 'positions >= m', 'keys past the end (positions >= m)'),
    'causal: query i sees keys j <= i': (_CAUSAL, 'j <= i', 'query i sees the keys j <= i'),
    'the log-sum-exp is a natural log': (_LSE, 'natural log', 'as a natural logarithm'),
    'no bfloat16 in tl.dot': (_TILES, 'bfloat16', "keep tl.dot's operands in the dtype", KERNEL_CHECKS[1:]),
    'program ids: query tile, then head': (_TILES, 'program_id(0)', 'tl.program_id(0) of head tl.program_id(1)',
        (_RAGGED, _CAUSAL)),
    'the wrapper returns (output, lse)': (_SHAPES, '(output, lse)', 'returns (output, lse)', (_LAUNCH, _STRIDES)),
    'tile sizes are powers of two of at least 16': ('test_wrapper_blocks', 'power of two',
        'is not a power of two of at least 16'),
    'qk_scale = log2(e) / sqrt(d)': (_LAUNCH, 'log2(e)', 'qk_scale = log2_e / math.sqrt(d)'),
    'the grid covers the last partial tile': (_LAUNCH, 'triton.cdiv', 'the grid (triton.cdiv(n, block_m), b * h)'),
    'causal is passed to the kernel': (_LAUNCH, 'causal', 'causal as causal'),
    'q, k, v made contiguous': (_STRIDES, 'contiguous', 'makes q, k, v contiguous'),
})

# The exercise asks for the kernel and the launch: torch's own attention (banned everywhere), softmax and matrix
# products earn nothing in either part (the scan reads the names, the guard refuses the operators while a part runs).
_BANNED = {name: f"torch's {name}" for name in (
    "softmax", "log_softmax", "Softmax", "LogSoftmax", "softmin", "logsumexp", "matmul", "bmm", "addmm", "einsum",
    "tensordot")}
SUITE.forbidden = {KERNEL: dict(_BANNED), WRAPPER: dict(_BANNED)}
_same = partial(close, atol=1e-5, rtol=1e-5)  # equal up to float32 rounding


# -- the judge's launch of the student's kernel, built in the student's process from this source ---------------------

UNWRITTEN = -7777.0  # what the output buffers hold before the kernel writes them (exact in float32)
LAUNCH = f'''
import torch


class Launch:
    """Inputs (B, H, len, d) in buffers that go on with ``tail`` NaN (a load past the end reads NaN), outputs in
    buffers of {UNWRITTEN} with the same tail (a row never written keeps it, a store past the end changes the tail);
    called with ``(kernel[grid], qk_scale, causal, block_m, block_n)``, it runs the kernel on them and returns copies
    of the whole output buffers, tails included."""

    def __init__(self, q, k, v, tail):
        self.q, self.k, self.v = (torch.cat([x.flatten(), torch.full((tail,), float("nan"), dtype=x.dtype)])
                                  [: x.numel()].view(x.shape) for x in (q, k, v))
        self.o_buf = torch.full((q.numel() + tail,), {UNWRITTEN}, dtype=q.dtype)
        self.lse_buf = torch.full((q[..., 0].numel() + tail,), {UNWRITTEN}, dtype=torch.float32)

    def __call__(self, launcher, qk_scale, causal, block_m, block_n):
        (B, H, n, d), m = self.q.shape, self.k.shape[2]
        o, lse = self.o_buf[: self.q.numel()].view(B, H, n, d), self.lse_buf[: B * H * n].view(B, H, n)
        launcher(self.q, self.k, self.v, o, lse, n, m, qk_scale, causal, block_m, block_n, d)
        return self.o_buf.clone(), self.lse_buf.clone()


def strided(x):
    """x (B, n, H, d) seen as (B, H, n, d): a view whose rows are not contiguous."""
    return x.transpose(1, 2)
'''


def _launch(t: Trial, q: Tensor, k: Tensor, v: Tensor, causal: bool, bm: int, bn: int, qk_scale: float | None = None,
            tails: bool = False) -> tuple[Tensor, Tensor]:
    """The student's kernel launched by the judge on the stated grid: (output, lse); with ``tails``, a store past the
    end of either fails the check."""
    B, H, n, d = q.shape
    try:
        launcher = Obj(t, t.backend.call(KERNEL, [(-(-n // bm), B * H)], {}, t.bans, attr="__getitem__", keep=True))
    except StudentError as e:
        if "NotImplementedError" in str(e) or e.placeholder:
            raise
        raise CheckFailed(f"{KERNEL}[grid] could not be formed ({e}): define {KERNEL} with @triton.jit") from None
    scale = LOG2_E / math.sqrt(d) if qk_scale is None else qk_scale
    try:
        o_buf, lse_buf = t.trusted(LAUNCH, "Launch", q, k, v, 64 * d)(launcher, scale, causal, bm, bn)
    except StudentError as e:  # the interpreter wraps what the kernel raised
        if "InterpreterError: NotImplementedError()" in str(e):
            raise StudentError(PLACEHOLDER) from None
        raise
    if not (isinstance(o_buf, Tensor) and isinstance(lse_buf, Tensor)):
        raise CheckFailed("the kernel's outputs could not be read back")
    if tails and not bool((o_buf[q.numel():] == UNWRITTEN).all()):
        raise CheckFailed("the kernel stores past the end of O (a tl.store without a mask): rows of the last tile past "
                          "n belong to another tensor (or to none, on a GPU: an illegal memory access). Store with "
                          "mask=rows[:, None] < n")
    if tails and not bool((lse_buf[B * H * n:] == UNWRITTEN).all()):
        raise CheckFailed("the kernel stores past the end of LSE (a tl.store without a mask): store with mask=rows < n")
    return o_buf[: q.numel()].view(q.shape), lse_buf[: B * H * n].view(B, H, n)


# -- the reference: the tiled loop in float64, with switches for the classic mistakes ------------------------------


def emulate(q: Tensor, k: Tensor, v: Tensor, causal: bool, block_m: int, block_n: int, *, natural_exp: bool = False,
            rescale_acc: bool = True, rescale_sum: bool = True, mask_past_m: bool = True,
            tile_causal: bool = False) -> tuple[Tensor, Tensor]:
    """(output, lse in natural log) of the kernel's loop on (B, H, n, d) inputs, in float64.

    ``natural_exp``: ``exp`` where the kernel has ``exp2`` (the base-2 scale used with the natural exponential);
    ``rescale_acc`` / ``rescale_sum``: multiply by alpha; ``mask_past_m``: keys past m get -inf (else they are
    loaded as zeros and scored 0); ``tile_causal``: causal by whole tiles only."""
    B, H, n, d = q.shape
    m = k.shape[2]
    q, k, v = q.double(), k.double(), v.double()
    qk_scale = LOG2_E / math.sqrt(d)
    exp = torch.exp if natural_exp else torch.exp2
    out = torch.empty(B, H, n, d, dtype=torch.float64)
    lse2 = torch.empty(B, H, n, dtype=torch.float64)
    pad = -(-m // block_n) * block_n
    kp = torch.zeros(B, H, pad, d, dtype=torch.float64)
    vp = torch.zeros(B, H, pad, d, dtype=torch.float64)
    kp[:, :, :m], vp[:, :, :m] = k, v
    for start in range(0, n, block_m):
        rows = torch.arange(start, min(start + block_m, n))
        qi = q[:, :, rows]  # (B, H, r, d)
        m_i = torch.full((B, H, len(rows)), -math.inf, dtype=torch.float64)
        l_i = torch.zeros(B, H, len(rows), dtype=torch.float64)
        acc = torch.zeros(B, H, len(rows), d, dtype=torch.float64)
        end = min(start + block_m, m) if causal else m
        for s0 in range(0, end, block_n):
            keys = torch.arange(s0, s0 + block_n)
            s = qi @ kp[:, :, keys].transpose(-2, -1) * qk_scale  # (B, H, r, block_n)
            visible = (keys < m)[None, :] if mask_past_m else torch.ones(1, block_n, dtype=torch.bool)
            if causal:
                visible = visible & (keys[None, :] < start + block_m if tile_causal else keys[None, :] <= rows[:, None])
            s = s.masked_fill(~visible, -math.inf)
            m_new = torch.maximum(m_i, s.amax(-1))
            alpha = exp(m_i - m_new)
            p = exp(s - m_new[..., None])
            l_i = (l_i * alpha if rescale_sum else l_i) + p.sum(-1)
            acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ vp[:, :, keys]
            m_i = m_new
        out[:, :, rows] = acc / l_i[..., None]
        lse2[:, :, rows] = m_i + torch.log2(l_i)
    return out, lse2 * LN_2


RESCALE = ("the online softmax does not rescale {what} when the running max grows: multiply the running sum and "
           "the accumulator by alpha = exp2(m_i - m_new) before adding the new tile's p and p @ v")
EXP = ("the softmax comes out at scale log2(e)/sqrt(d) instead of 1/sqrt(d): qk_scale already holds log2(e), so "
       "use tl.exp2 (not tl.exp) and do not multiply by log2(e) again")
SEES = "query i sees the keys j <= i"


def _written_and_finite(got: Tensor, causal: bool, what: str) -> None:
    """Rows the kernel never wrote (still the grader's ``UNWRITTEN``), then NaN, named: query 0 with no key (a strict
    causal mask), or NaN in the last head only, whose inputs go on with NaN (a load past the end)."""
    unwritten = (got == UNWRITTEN).flatten(0, 1)  # (B·H, n[, d])
    rows = unwritten.all(-1) if got.dim() == 4 else unwritten
    if bool(rows.any()):
        raise CheckFailed(f"{what}: {int(rows.sum())} output rows were never written (they still hold what the grader "
                          "filled the buffer with): the program (tl.program_id(0), tl.program_id(1)) computes query "
                          "tile tl.program_id(0) of head tl.program_id(1), and stores all its rows below n")
    nan = torch.isnan(got).flatten(0, 1)
    rows = nan.any(-1) if got.dim() == 4 else nan  # (B·H, n)
    if not bool(rows.any()):
        return
    if causal and bool(rows[:, 0].all()) and not bool(rows[:, 1:].any()):
        raise CheckFailed(f"{what} is NaN for query 0 of every head: the causal mask is strict (j < i): {SEES}, "
                          "itself included")
    if not bool(rows[:-1].any()):
        raise CheckFailed(f"{what} holds NaN in the last head only, where the grader's buffers go on with NaN: the "
                          "kernel reads past the end of k or v, a tl.load without a mask (a GPU reads garbage there, "
                          "or stops with an illegal memory access). Load tiles with mask=keys < m and other=0.0")
    raise CheckFailed(f"{what} contains NaN in {int(rows.sum())} rows")


def _kernel_cases(t: Trial, causal: bool, cases: list[tuple[int, ...]]) -> None:
    """The kernel's output on each case (B, H, n, m, d, BLOCK_M, BLOCK_N) against the emulation, classic mistakes
    named."""
    for B, H, n, m, d, bm, bn in cases:
        q, k, v = t.randn(B, H, n, d), t.randn(B, H, m, d), t.randn(B, H, m, d)
        got, _ = _launch(t, q, k, v, causal, bm, bn, tails=True)
        what = (f"the output of {KERNEL} for q {(B, H, n, d)}, k and v {(B, H, m, d)}, BLOCK_M={bm}, BLOCK_N={bn}"
                + (", CAUSAL" if causal else ""))
        _written_and_finite(got, causal, what)
        e = partial(emulate, q, k, v, causal, bm, bn)
        expected = e()[0]
        if _same(got, expected):
            continue
        dist = (got.double()[..., :, None, :] - v.double()[..., None, :, :]).abs().amax(-1).amin(-1)  # (B, H, n)
        if bool((dist < 1e-5).double().mean() > 0.9):  # most rows are one row of v: one-hot weights
            raise CheckFailed(f"{what}: each output row is one row of v, as if every query put all its weight on one "
                              "key: the scores are enormous, what Triton's interpreter computes for bfloat16 operands "
                              "of tl.dot (their bits multiplied as integers); keep tl.dot's operands in the dtype of "
                              "the inputs")
        if close(got, expected, 3e-2, 3e-2):
            raise CheckFailed(f"{what} matches softmax(q k^T / sqrt(d)) v only to about 1e-2: the products lose "
                              "precision (operands cast to float16 or bfloat16, or TF32 on a GPU); keep tl.dot's "
                              "operands in the dtype of the inputs, with input_precision=\"ieee\"")
        named = {RESCALE.format(what="the sum or the accumulator"): e(rescale_acc=False, rescale_sum=False)[0],
                 RESCALE.format(what="the accumulator"): e(rescale_acc=False)[0],
                 RESCALE.format(what="the running sum"): e(rescale_sum=False)[0], EXP: e(natural_exp=True)[0]}
        if m % bn:
            named["keys past the end (positions >= m) are not masked: give their scores -inf (tl.where(keys < m, s, "
                  "-inf)); loaded as zeros they still score 0 and take weight"] = e(mask_past_m=False)[0]
        if causal:
            named[f"inside the diagonal tile, later keys are not masked: with CAUSAL, {SEES} (stopping the loop after "
                  "the diagonal tile skips whole tiles only)"] = e(tile_causal=True)[0]
            named[f"CAUSAL is ignored: with CAUSAL, {SEES}"] = emulate(q, k, v, False, bm, bn)[0]
        fail_if_named(got, named, what, _same)
        err = (got.double() - expected).abs().max().item()
        raise CheckFailed(f"{what} does not match softmax(q k^T / sqrt(d)) v (largest difference {err:.3g})")


for _gid, _causal, _cases, _doc in (
        (_TILES, False, [(1, 3, 128, 128, 32, 64, 64), (1, 1, 64, 128, 16, 64, 32)],
         "The kernel, launched on the stated grid: several query and key tiles equal softmax(q k^T / sqrt(d)) v."),
        (_RAGGED, False, [(1, 2, 100, 80, 16, 64, 64), (2, 1, 50, 130, 32, 64, 64)],
         "Lengths that are not a multiple of the tiles: masked loads and stores, keys past m never attended."),
        (_CAUSAL, True, [(1, 2, 128, 128, 16, 64, 64), (1, 1, 128, 128, 16, 64, 32)],
         "With CAUSAL, query i sees the keys j <= i (tiles of 64 queries by 64 and by 32 keys).")):
    SUITE.add(_gid, [KERNEL], partial(_kernel_cases, causal=_causal, cases=_cases), _doc)


@SUITE.check(_LSE, parts=[KERNEL])
def kernel_lse(t: Trial) -> None:
    """LSE holds the natural log-sum-exp of each query's scaled scores."""
    q, k, v = t.randn(1, 2, 128, 16), t.randn(1, 2, 128, 16), t.randn(1, 2, 128, 16)
    _, lse = _launch(t, q, k, v, False, 64, 64, tails=True)
    what = f"the LSE of {KERNEL} for q, k, v {tuple(q.shape)}"
    _written_and_finite(lse, False, what)
    s = q.double() @ k.double().transpose(-2, -1) / math.sqrt(16)
    expected, natural_exp = torch.logsumexp(s, -1), emulate(q, k, v, False, 64, 64, natural_exp=True)[1]
    impossible = (lse.double() > s.amax(-1) + math.log(128) + 1e-3) | (lse.double() < s.amax(-1) - 1e-3)
    if bool(impossible.any()) and not _same(lse, expected / LN_2) and not _same(lse, natural_exp):
        raise CheckFailed(f"{what} holds values no log-sum-exp of these scores can take (the scores are enormous): "
                          "Triton's interpreter computes bfloat16 operands of tl.dot wrongly (their bits multiplied "
                          "as integers); keep tl.dot's operands in the dtype of the inputs")
    if _same(lse, expected):
        return
    fail_if_named(lse, {
        "it is a base-2 log-sum-exp, m_i + log2(l_i); store it as a natural log, (m_i + log2(l_i)) * ln 2":
            expected / LN_2,
        EXP: natural_exp,
        RESCALE.format(what="the running sum"): emulate(q, k, v, False, 64, 64, rescale_sum=False)[1],
        "it is the running max alone; the log-sum-exp adds the log of the running sum: (m_i + log2(l_i)) * ln 2":
            s.amax(-1)}, what, _same)
    err = (lse.double() - expected).abs().max().item()
    raise CheckFailed(f"{what} does not match the natural log-sum-exp of the scores (largest difference {err:.3g})")


# -- the wrapper ----------------------------------------------------------------------------------------------------


def _pair(value, what: str) -> tuple[Tensor, Tensor]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        got = type(value).__name__ + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else "")
        raise CheckFailed(f"{what} should return a pair (output, lse), got a {got}")
    out, lse = value
    if not isinstance(out, Tensor) or not isinstance(lse, Tensor):
        raise CheckFailed(f"{what} should return two tensors (output, lse), got {type(out).__name__}, "
                          f"{type(lse).__name__}")
    return out, lse


@SUITE.check(_SHAPES, parts=[WRAPPER])
def wrapper_shapes(t: Trial) -> None:
    """Returns (output, lse): (B, H, n, d) in the inputs' dtype and (B, H, n) float32, for n != m."""
    q, k, v = t.randn(2, 2, 64, 16), t.randn(2, 2, 96, 16), t.randn(2, 2, 96, 16)
    out, lse = _pair(t.call(WRAPPER, q, k, v), f"{WRAPPER}(q, k, v)")
    for name, x, shape in (("output", out, (2, 2, 64, 16)), ("lse", lse, (2, 2, 64))):
        if tuple(x.shape) != shape or x.dtype != torch.float32:
            raise CheckFailed(f"the {name} of {WRAPPER} for q (2, 2, 64, 16), k and v (2, 2, 96, 16) has shape "
                              f"{tuple(x.shape)} and dtype {x.dtype}; expected {shape}, torch.float32")


@SUITE.check(_LAUNCH, parts=[WRAPPER])
def wrapper_launch(t: Trial) -> None:
    """The wrapper launches the kernel as stated: grid (cdiv(n, block_m), B * H), qk_scale, CAUSAL, the tiles."""
    for B, H, n, m, d, causal, bm, bn in [(1, 2, 100, 100, 16, True, 64, 32), (2, 1, 70, 90, 32, False, 64, 64)]:
        q, k, v = t.randn(B, H, n, d), t.randn(B, H, m, d), t.randn(B, H, m, d)
        what = f"{WRAPPER}(q {(B, H, n, d)}, k and v {(B, H, m, d)}, causal={causal}, block_m={bm}, block_n={bn})"
        out, lse = _pair(t.call(WRAPPER, q, k, v, causal=causal, block_m=bm, block_n=bn), what)
        own, own_lse = _launch(t, q, k, v, causal, bm, bn)
        if _same(out, own) and _same(lse, own_lse):
            continue
        full = n // bm * bm
        if n % bm and tuple(out.shape) == tuple(own.shape) and _same(out[:, :, :full], own[:, :, :full]):
            raise CheckFailed(f"mistake in {what}: the last, partial tile of queries (rows {full} to {n - 1}) is not "
                              f"computed: the grid needs triton.cdiv(n, block_m) query tiles, not n // block_m")
        wrong = [("qk_scale lacks log2(e): the kernel uses exp2, so pass qk_scale = log2(e) / sqrt(d)", causal,
                  1 / math.sqrt(d)), ("qk_scale divides by d: pass qk_scale = log2(e) / sqrt(d)", causal, LOG2_E / d)]
        wrong += [("causal is not passed to the kernel: launch it with CAUSAL = causal", False, None)] * causal
        fail_if_named(out, ((why, _launch(t, q, k, v, c, bm, bn, qk_scale=s)[0]) for why, c, s in wrong), what, _same)
        raise CheckFailed(f"{what} does not equal your kernel launched on the grid (triton.cdiv(n, block_m), B * H) "
                          "with qk_scale = log2(e) / sqrt(d) and CAUSAL = causal")


@SUITE.check(_STRIDES, parts=[WRAPPER])
def wrapper_strides(t: Trial) -> None:
    """Inputs whose rows are not contiguous (a transposed view) give what the same inputs give made contiguous."""
    x = [t.randn(1, 64, 2, 16) for _ in range(3)]  # (B, n, H, d)
    views = [t.trusted(LAUNCH, "strided", xi) for xi in x]  # (B, H, n, d) views, rows not contiguous
    what = f"{WRAPPER} on q, k, v of shape (1, 2, 64, 16) whose rows are not contiguous (x.transpose(1, 2))"
    out, _ = _pair(t.call(WRAPPER, *views), what)
    same, _ = _pair(t.call(WRAPPER, *(xi.transpose(1, 2).contiguous() for xi in x)), f"{WRAPPER}(q, k, v)")
    if not _same(out, same):
        raise CheckFailed(f"{what} differs from its result on the same inputs made contiguous: the kernel reads rows "
                          "at (bh * n + i) * d, which holds only for contiguous tensors; call .contiguous() on q, k, "
                          "v first")


@SUITE.check("test_wrapper_blocks", parts=[WRAPPER])
def wrapper_blocks(t: Trial) -> None:
    """ValueError when block_m, block_n or d is not a power of two of at least 16 (what the GPU compiler needs)."""
    q = t.randn(1, 1, 32, 16)
    hint = ("Check the sizes before launching: tl.arange needs a power of two and a GPU's tl.dot at least 16, "
            "even where the interpreter runs other sizes")
    for kwargs, why in (({"block_m": 48}, "block_m = 48 is not a power of two"),
                        ({"block_n": 8}, "block_n = 8 is a power of two below 16")):
        expect_value_error(lambda: t.call(WRAPPER, q, q, q, **kwargs), f"{WRAPPER}(..., {why})", hint)
    x = t.randn(1, 1, 32, 24)
    expect_value_error(lambda: t.call(WRAPPER, x, x, x), f"{WRAPPER} on inputs of width d = 24 (not a power of two)",
                       hint)


# -- conceptual questions (the inputs are in the question; the answer is a value) ---------------------------------

SUITE.questions({
    "q_programs": number(4 * 8 * math.ceil(1000 / 128), "Q1: programs in the grid for B=4, H=8, n=1000, BLOCK_M=128",
                         {f"{wrong} {why}": wrong for wrong, why in [
        (4 * 8 * (1000 // 128), "= B·H·(n // BLOCK_M) leaves out the last, partial tile of 1000 - 7·128 = 104 "
                                "queries: the grid has cdiv(n, BLOCK_M) tiles"),
        (32, "= B·H is one program per (batch, head); each also splits its queries into tiles of BLOCK_M"),
        (8, "is the number of query tiles of one (batch, head); the grid has one such row per (batch, head)")]}),
    "q_state_floats": number(128 + 128 + 128 * 64, "Q2: float32 numbers in one program's online-softmax state",
                             {f"{wrong} {why}": wrong for wrong, why in [
        (128 * 64, "counts the accumulator alone; the running max and the running sum hold one number per query too"),
        (128 * 64 + 128, "counts one of the two per-query vectors; there are two, the running max and sum"),
        (2 * 128 * 64 + 256, "counts the query tile too, an input loaded once, not the state it updates")]}),
    "q_qk_scale": number(LOG2_E / 8, "Q3: qk_scale for d = 64", {
        "0.125 = 1/sqrt(64) leaves out log2(e): exp2(s/8) is 2^(s/8), not e^(s/8)": 0.125,
        f"{LN_2 / 8:.4f} uses ln 2; exp(x) = exp2(x · log2(e)), so the factor is log2(e) ≈ 1.4427": LN_2 / 8,
        f"{LOG2_E / 64:.4f} divides by d; the scale is 1/sqrt(d)": LOG2_E / 64,
    }),
    "q_alpha": number(0.25, "Q4: the rescaling factor alpha when the running max goes from 3 to 5 (base 2)", {
        f"{math.exp(-2):.4f} = e^(3-5): the kernel's scores are in base-2 units, so alpha = exp2(m_i - m_new)":
            math.exp(-2),
        "4 is the inverse: the old sum was computed under a smaller max, so it shrinks, by 2^(3-5)": 4.0,
        "1 would keep the old sum as it is; it was computed under the old max and must be rescaled": 1.0,
    }),
    "q_tile_bytes": number(2 * 64 * 128 * 2, "Q5: bytes of one K tile and one V tile, 64 x 128 in float16", {
        "16384 is one tile; each step loads a tile of K and a tile of V": 64 * 128 * 2,
        "65536 counts 4 bytes per number; float16 takes 2": 2 * 64 * 128 * 4,
        "8192 counts numbers of one tile, not bytes of both": 64 * 128,
    }),
})
