"""Chapter 10's classic kernel and launch mistakes, named: one source for exercise 10's visible tests and its grader.

The grader (``autograder/judging/checks/ch10_flash_triton.py``) judges what a kernel wrote with these functions, and
the exercise's visible tests call :func:`check_kernel` and :func:`check_wrapper`, which launch the student's kernel
(or call the wrapper) the way the grader does and raise ``AssertionError`` with the same message: a strict causal
mask, no rescaling, a base-2 log-sum-exp, ``exp`` with the base-2 scale, the grid ``n // block_m``, inputs not made
contiguous, a store without a mask. The kernel is launched on padded buffers (inputs followed by NaN, outputs by a
marker), so a store without a mask lands in the padding and is named, instead of corrupting memory that a later
cell trips over.

Pure torch (float64 references); Triton is needed only to launch a kernel, which the caller passes in.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

KERNEL, WRAPPER = "flash_forward_kernel", "flash_attention_forward"
LOG2_E, LN_2 = math.log2(math.e), math.log(2.0)
UNWRITTEN = -7777.0  # what the output buffers hold before the kernel writes them (exact in float32)

RESCALE = ("the online softmax does not rescale {what} when the running max grows: multiply the running sum and "
           "the accumulator by alpha = exp2(m_i - m_new) before adding the new tile's p and p @ v")
EXP = ("the softmax comes out at scale log2(e)/sqrt(d) instead of 1/sqrt(d): qk_scale already holds log2(e), so "
       "use tl.exp2 (not tl.exp) and do not multiply by log2(e) again")
SEES = "query i sees the keys j <= i"


def same(a: Any, b: Any) -> bool:
    """Equal up to float32 rounding (atol = rtol = 1e-5), same shape, finite."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor) or tuple(a.shape) != tuple(b.shape):
        return False
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return bool(torch.isfinite(a64).all()) and bool(torch.allclose(a64, b64, atol=1e-5, rtol=1e-5))


def _close(a: Tensor, b: Tensor, tol: float) -> bool:
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return bool(torch.isfinite(a64).all()) and bool(torch.allclose(a64, b64, atol=tol, rtol=tol))


def named(actual: Tensor, mistakes: Mapping[str, Tensor], what: str) -> str | None:
    """"mistake in {what}: {message}" for the first of ``mistakes`` that ``actual`` equals, or None."""
    return next((f"mistake in {what}: {message}" for message, wrong in mistakes.items() if same(actual, wrong)), None)


# -- the reference: the tiled loop in float64, with switches for the classic mistakes ------------------------------


def emulate(q: Tensor, k: Tensor, v: Tensor, causal: bool, block_m: int, block_n: int, *, natural_exp: bool = False,
            rescale_acc: bool = True, rescale_sum: bool = True, mask_past_m: bool = True,
            tile_causal: bool = False, straddle: bool = False) -> tuple[Tensor, Tensor]:
    """(output, lse in natural log) of the kernel's loop on (B, H, n, d) inputs, in float64.

    ``natural_exp``: ``exp`` where the kernel has ``exp2`` (the base-2 scale used with the natural exponential);
    ``rescale_acc`` / ``rescale_sum``: multiply by alpha; ``mask_past_m``: keys past m get -inf (else they are
    loaded as zeros and scored 0); ``tile_causal``: causal by whole tiles only; ``straddle``: the loop of Triton's
    tutorial, key tiles before the query tile unmasked, then the query tile's keys masked (wrong when BLOCK_N >
    BLOCK_M: a tile of the first stage straddles the diagonal)."""
    B, H, n, d = q.shape
    m = k.shape[2]
    q, k, v = q.detach().cpu().double(), k.detach().cpu().double(), v.detach().cpu().double()
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
        tiles = [(s0, causal) for s0 in range(0, end, block_n)]
        if causal and straddle:
            tiles = [(s0, False) for s0 in range(0, start, block_n)] + [(s0, True) for s0 in range(start, end, block_n)]
        for s0, masked in tiles:
            keys = torch.arange(s0, s0 + block_n)
            kp_, vp_ = kp, vp
            if s0 + block_n > pad:  # a tile past the padded keys (the straddling loop): zeros
                kp_, vp_ = (torch.cat([x, torch.zeros(B, H, s0 + block_n - pad, d, dtype=torch.float64)], 2)
                            for x in (kp, vp))
            s = qi @ kp_[:, :, keys].transpose(-2, -1) * qk_scale  # (B, H, r, block_n)
            visible = (keys < m)[None, :] if mask_past_m else torch.ones(1, block_n, dtype=torch.bool)
            if masked:
                visible = visible & (keys[None, :] < start + block_m if tile_causal else keys[None, :] <= rows[:, None])
            s = s.masked_fill(~visible, -math.inf)
            m_new = torch.maximum(m_i, s.amax(-1))
            alpha = exp(m_i - m_new)
            p = exp(s - m_new[..., None])
            l_i = (l_i * alpha if rescale_sum else l_i) + p.sum(-1)
            acc = (acc * alpha[..., None] if rescale_acc else acc) + p @ vp_[:, :, keys]
            m_i = m_new
        out[:, :, rows] = acc / l_i[..., None]
        lse2[:, :, rows] = m_i + torch.log2(l_i)
    return out, lse2 * LN_2


# -- what a kernel wrote, judged (the grader's messages) -------------------------------------------------------------


def stores_past_the_end(o_buf: Tensor, lse_buf: Tensor, o_numel: int, lse_numel: int,
                        where: str = "a tl.store without a mask") -> str | None:
    """Whether the kernel wrote past the end of O or LSE (buffers filled with UNWRITTEN, longer than the tensors)."""
    if not bool((o_buf[o_numel:] == UNWRITTEN).all()):
        return (f"the kernel stores past the end of O ({where}): rows past n belong to another tensor (or to none, "
                "on a GPU: an illegal memory access). Store with mask=rows[:, None] < n")
    if not bool((lse_buf[lse_numel:] == UNWRITTEN).all()):
        return f"the kernel stores past the end of LSE ({where}): store with mask=rows < n"
    return None


def unwritten_or_nan(got: Tensor, causal: bool, what: str) -> str | None:
    """Rows the kernel never wrote (still ``UNWRITTEN``), then NaN, named: query 0 with no key (a strict causal mask),
    or NaN in the last head only of several, whose inputs go on with NaN (a load past the end)."""
    unwritten = (got == UNWRITTEN).flatten(0, 1)  # (B·H, n[, d])
    rows = unwritten.all(-1) if got.dim() == 4 else unwritten
    if bool(rows.any()):
        return (f"{what}: {int(rows.sum())} output rows were never written (they still hold what the grader filled "
                "the buffer with): the program (tl.program_id(0), tl.program_id(1)) computes query tile "
                "tl.program_id(0) of head tl.program_id(1), and stores all its rows below n")
    nan = torch.isnan(got).flatten(0, 1)
    rows = nan.any(-1) if got.dim() == 4 else nan  # (B·H, n)
    if not bool(rows.any()):
        return None
    if causal and bool(rows[:, 0].all()) and not bool(rows[:, 1:].any()):
        return f"{what} is NaN for query 0 of every head: the causal mask is strict (j < i): {SEES}, itself included"
    if len(rows) > 1 and bool(rows[-1].any()) and not bool(rows[:-1].any()):
        return (f"{what} holds NaN in the last head only, where the grader's buffers go on with NaN: the kernel reads "
                "past the end of k or v, a tl.load without a mask (a GPU reads garbage there, or stops with an "
                "illegal memory access). Load tiles with mask=keys < m and other=0.0")
    return f"{what} contains NaN in {int(rows.sum())} rows"


def output_mistakes(q: Tensor, k: Tensor, v: Tensor, causal: bool, bm: int, bn: int) -> dict[str, Tensor]:
    """The outputs of the classic kernel mistakes on these inputs and tiles, by the message that names each."""
    def e(**switches: bool) -> Tensor:
        return emulate(q, k, v, causal, bm, bn, **switches)[0]

    m = k.shape[2]
    found = {RESCALE.format(what="the sum or the accumulator"): e(rescale_acc=False, rescale_sum=False),
             RESCALE.format(what="the accumulator"): e(rescale_acc=False),
             RESCALE.format(what="the running sum"): e(rescale_sum=False), EXP: e(natural_exp=True)}
    if m % bn and not causal:
        found["keys past the end (positions >= m) are not masked: give their scores -inf (tl.where(keys < m, s, "
              "-inf)); loaded as zeros they still score 0 and take weight"] = e(mask_past_m=False)
    if causal:
        found[f"inside the diagonal tile, later keys are not masked: with CAUSAL, {SEES} (stopping the loop after "
              "the diagonal tile skips whole tiles only)"] = e(tile_causal=True)
        found[f"CAUSAL is ignored: with CAUSAL, {SEES}"] = emulate(q, k, v, False, bm, bn)[0]
        if m % bn:
            found[f"keys past the end (positions >= m) are not masked (with CAUSAL, the causal mask replaces the "
                  f"length mask?): queries after position m still see them, loaded as zeros; {SEES} and j < m, "
                  "both masks together"] = e(mask_past_m=False)
        if bn > bm:
            found[f"with BLOCK_N > BLOCK_M, the key tile that straddles the diagonal is not masked (tiles before the "
                  f"diagonal tile are not all wholly below it): {SEES}; mask every key tile that can hold a key "
                  "j > i"] = e(straddle=True)
    return found


def output_mistake(got: Tensor, q: Tensor, k: Tensor, v: Tensor, causal: bool, bm: int, bn: int,
                   what: str) -> str | None:
    """None when ``got`` is the kernel's output on these inputs; else what is wrong with it, named when it is a
    classic mistake."""
    expected = emulate(q, k, v, causal, bm, bn)[0]
    if same(got, expected):
        return None
    got, v64 = got.detach().cpu(), v.detach().cpu().double()
    dist = (got.double()[..., :, None, :] - v64[..., None, :, :]).abs().amax(-1).amin(-1)  # (B, H, n)
    if bool((dist < 1e-5).double().mean() > 0.9):  # most rows are one row of v: one-hot weights
        return (f"{what}: each output row is one row of v, as if every query put all its weight on one key: the "
                "scores are enormous, what Triton's interpreter computes for bfloat16 operands of tl.dot (their bits "
                "multiplied as integers); keep tl.dot's operands in the dtype of the inputs")
    if _close(got, expected, 3e-2):
        return (f"{what} matches softmax(q k^T / sqrt(d)) v only to about 1e-2: the products lose precision "
                "(operands cast to float16 or bfloat16, or TF32 on a GPU); keep tl.dot's operands in the dtype of the "
                "inputs, with input_precision=\"ieee\"")
    message = named(got, output_mistakes(q, k, v, causal, bm, bn), what)
    if message:
        return message
    err = (got.double() - expected).abs().max().item()
    return f"{what} does not match softmax(q k^T / sqrt(d)) v (largest difference {err:.3g})"


def lse_mistake(lse: Tensor, q: Tensor, k: Tensor, v: Tensor, bm: int, bn: int, what: str) -> str | None:
    """None when ``lse`` (B, H, n) is the natural log-sum-exp of the scaled scores (no mask); else what is wrong."""
    lse = lse.detach().cpu()
    d = q.shape[-1]
    s = q.detach().cpu().double() @ k.detach().cpu().double().transpose(-2, -1) / math.sqrt(d)
    expected, natural_exp = torch.logsumexp(s, -1), emulate(q, k, v, False, bm, bn, natural_exp=True)[1]
    if bool(torch.isinf(lse).any()):
        sign = "-inf" if bool((lse == -math.inf).any()) else "inf"
        return (f"{what} is {sign} in {int(torch.isinf(lse).sum())} rows: the log of a running sum l_i of "
                + ("0 (no key's p was added to it)" if sign == "-inf" else "inf (p or l_i overflowed: subtract the "
                   "running max before exp2)")
                + "; LSE = (m_i + log2(l_i)) * ln 2 with l_i the rescaled sum of p over every key")
    m = k.shape[2]
    impossible = (lse.double() > s.amax(-1) + math.log(m) + 1e-3) | (lse.double() < s.amax(-1) - 1e-3)
    if bool(impossible.any()) and not same(lse, expected / LN_2) and not same(lse, natural_exp) and \
            bool((lse.double() - s.amax(-1)).abs().max() > 1e3):
        return (f"{what} holds values no log-sum-exp of these scores can take (the scores are enormous): Triton's "
                "interpreter computes bfloat16 operands of tl.dot wrongly (their bits multiplied as integers); keep "
                "tl.dot's operands in the dtype of the inputs")
    if same(lse, expected):
        return None
    message = named(lse, {
        "it is a base-2 log-sum-exp, m_i + log2(l_i); store it as a natural log, (m_i + log2(l_i)) * ln 2":
            expected / LN_2,
        EXP: natural_exp,
        RESCALE.format(what="the running sum"): emulate(q, k, v, False, bm, bn, rescale_sum=False)[1],
        "it is the running max alone; the log-sum-exp adds the log of the running sum: (m_i + log2(l_i)) * ln 2":
            s.amax(-1)}, what)
    if message:
        return message
    err = (lse.double() - expected).abs().max().item()
    return f"{what} does not match the natural log-sum-exp of the scores (largest difference {err:.3g})"


# -- what a wrapper launched, judged (the grader's messages) ---------------------------------------------------------


def grid_mistake(grid: tuple[int, ...], n: int, bm: int, heads: int, what: str) -> str | None:
    """None when ``grid`` (three axes) is (cdiv(n, bm), B·H, 1); else what is wrong with it."""
    want = (-(-n // bm), heads, 1)
    if tuple(grid) == want:
        return None
    why = ("the last, partial tile of queries is not computed: the grid needs triton.cdiv(n, block_m) query tiles, "
           "not n // block_m" if tuple(grid) == (n // bm, heads, 1) else
           "its axes are swapped: axis 0 counts the query tiles (tl.program_id(0)), axis 1 the heads"
           if tuple(grid[:2]) == want[1::-1] and grid[2] == 1 else "")
    return (f"mistake in {what}: it launches the grid {tuple(grid[:2]) if grid[2] == 1 else tuple(grid)}; the stated "
            f"grid is (triton.cdiv(n, block_m), B * H) = {want[:2]}" + (f": {why}" if why else ""))


def causal_mistake(got: Any, causal: bool, what: str) -> str | None:
    if type(got) in (int, bool) and bool(got) == causal:
        return None
    return (f"mistake in {what}: it passes CAUSAL = {got!r}: causal is not passed to the kernel: launch it with "
            "CAUSAL = causal")


def scale_mistake(scale: Any, d: int, what: str) -> str | None:
    """None when ``scale`` is log2(e) / sqrt(d); else what is wrong with it."""
    want = LOG2_E / math.sqrt(d)
    if type(scale) in (int, float) and math.isclose(scale, want, rel_tol=1e-6):
        return None
    known = {1 / math.sqrt(d): "qk_scale lacks log2(e): the kernel uses exp2, so pass qk_scale = log2(e) / sqrt(d)",
             LOG2_E / d: "qk_scale divides by d: pass qk_scale = log2(e) / sqrt(d)"}
    why = next((w for s, w in known.items() if type(scale) in (int, float) and math.isclose(scale, s, rel_tol=1e-6)),
               "")
    return (f"mistake in {what}: it passes qk_scale = {scale!r}; the stated scale is log2(e) / sqrt(d) = {want:.6g}"
            + (f": {why}" if why else ""))


def not_row_after_row(name: str, what: str) -> str:
    return (f"{what}: what {KERNEL} reads at {name} is not {name.lower()} row after row: the kernel reads rows at "
            "(bh * n + i) * d, which holds only for contiguous tensors; call .contiguous() on q, k, v first")


# -- the visible tests ------------------------------------------------------------------------------------------------


def _padded(x: Tensor, fill: float) -> tuple[Tensor, Tensor]:
    """(buffer, view): ``x``'s values in a buffer twice its size, the second half ``fill``; the view is the first half."""
    buf = torch.full((2 * x.numel() + 64 * x.shape[-1],), fill, dtype=x.dtype, device=x.device)
    buf[: x.numel()] = x.contiguous().flatten()
    return buf, buf[: x.numel()].view(x.shape)


def check_kernel(kernel: Any, q: Tensor, k: Tensor, v: Tensor, causal: bool = False, block_m: int = 64,
                 block_n: int = 64, part: str = "output") -> tuple[Tensor, Tensor]:
    """Launch ``kernel`` as the grader does (grid (cdiv(n, block_m), B·H), qk_scale = log2(e)/sqrt(d)) on padded
    buffers and raise ``AssertionError`` with the grader's message when it is wrong: its ``part`` (``"output"`` or
    ``"lse"``) against the float64 reference, a store past the end, rows never written, NaN. Returns (output, lse)."""
    B, H, n, d = q.shape
    m = k.shape[2]
    _, qp = _padded(q, float("nan"))
    _, kp = _padded(k, float("nan"))
    _, vp = _padded(v, float("nan"))
    o_buf, o = _padded(torch.empty_like(q), UNWRITTEN)
    o_buf.fill_(UNWRITTEN)
    lse_buf, lse = _padded(torch.empty(B, H, n, dtype=torch.float32, device=q.device), UNWRITTEN)
    lse_buf.fill_(UNWRITTEN)
    kernel[(-(-n // block_m), B * H)](qp, kp, vp, o, lse, n, m, LOG2_E / math.sqrt(d), causal, block_m, block_n, d)
    message = stores_past_the_end(o_buf.cpu(), lse_buf.cpu(), o.numel(), lse.numel())
    what = (f"the {'output' if part == 'output' else 'LSE'} of {KERNEL} for q {(B, H, n, d)}, k and v {(B, H, m, d)}, "
            f"BLOCK_M={block_m}, BLOCK_N={block_n}" + (", CAUSAL" if causal else ""))
    got = (o if part == "output" else lse).detach().cpu()
    message = message or unwritten_or_nan(got, causal and part == "output", what)
    if message is None:
        message = output_mistake(got, q, k, v, causal, block_m, block_n, what) if part == "output" else \
            lse_mistake(got, q, k, v, block_m, block_n, what)
    if message:
        raise AssertionError(message)
    return o.clone(), lse.clone()


def _recording(kernel: Any, launches: list) -> tuple[type, Any]:
    """Make every launch of ``kernel`` (a Triton kernel, compiled or interpreted) append (grid, arguments) to
    ``launches`` before it runs; returns what to put back (its class, and that class's own ``run`` or None)."""
    cls = type(kernel)
    if not hasattr(kernel, "fn") or not callable(getattr(cls, "run", None)):
        raise AssertionError(f"{KERNEL} is a {cls.__name__}, not a Triton kernel: define it with @triton.jit")
    own, run = cls.__dict__.get("run"), cls.run

    def recorded(self: Any, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        if self is kernel and not warmup:
            options = {k: val for k, val in kwargs.items() if k not in ("num_warps", "num_stages")}
            bound = dict(inspect.signature(self.fn).bind_partial(*args, **options).arguments)
            shape = tuple(int(g) for g in (grid(bound) if callable(grid) else grid))
            launches.append((shape + (1,) * (3 - len(shape)), bound))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    cls.run = recorded
    return cls, own


def check_wrapper(wrapper: Any, kernel: Any, q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
    """Call ``wrapper(q, k, v, **kwargs)`` (the notebook's ``flash_attention_forward``) with the launches of ``kernel``
    (its ``flash_forward_kernel``) recorded, and raise ``AssertionError`` with the grader's message when the launch is
    not the stated one (one launch, grid (cdiv(n, block_m), B·H), qk_scale, CAUSAL, contiguous inputs) or the output
    is wrong. Returns (output, lse)."""
    causal, bm, bn = kwargs.get("causal", False), kwargs.get("block_m", 64), kwargs.get("block_n", 64)
    (B, H, n, d), m = q.shape, k.shape[2]
    what = f"{WRAPPER}(q {(B, H, n, d)}, k and v {(B, H, m, d)}, causal={causal}, block_m={bm}, block_n={bn})"
    launches: list = []
    cls, own = _recording(kernel, launches)
    try:
        result = wrapper(q, k, v, **kwargs)
    finally:
        if own is None:
            del cls.run
        else:
            cls.run = own
    if not launches:
        raise AssertionError(f"{what} never launched a Triton kernel: the wrapper launches {KERNEL}[grid](...) once, "
                             "and the kernel computes the attention (the wrapper computes nothing itself)")
    if len(launches) > 1:
        raise AssertionError(f"{what} launched {len(launches)} Triton kernels: launch {KERNEL} once, on the grid "
                             "(triton.cdiv(n, block_m), B * H), which covers every query tile of every head")
    grid, args = launches[0]
    message = grid_mistake(grid, n, bm, B * H, what) or causal_mistake(args.get("CAUSAL"), causal, what) or \
        scale_mistake(args.get("qk_scale"), d, what)
    for name, x in (("Q", q), ("K", k), ("V", v)):
        arg = args.get(name)
        if message is None and isinstance(arg, Tensor) and not (arg.is_contiguous() and torch.equal(arg, x)):
            message = not_row_after_row(name, what)
    if message:
        raise AssertionError(message)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise AssertionError(f"{what} should return a pair (output, lse), got a {type(result).__name__}")
    out, _ = result
    wrong = output_mistake(out.detach().cpu(), q, k, v, causal, bm, bn, f"the output of {what}")
    if wrong:
        raise AssertionError(wrong)
    return result
