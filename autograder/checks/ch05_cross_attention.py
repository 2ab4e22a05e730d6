"""Graded checks for exercise 05_cross_attention: ``CrossAttention`` built on a given ``MultiHeadAttention``."""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit import CrossAttention as RefCrossAttention
from autograder.checks import CheckFailed, Obj, StudentError, Suite, Trial, expect_close, expect_pair, expect_tensor

SUITE = Suite("05_cross_attention")
CROSS = "CrossAttention"
PARAM_NAMES = {f"attn.{p}.{t}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for t in ("weight", "bias")}
N_EQUALS_M = ("something uses x's length n where the context length m belongs (a reshape, an expand or a mask "
              "built with x.shape[1]); the two sequences may have different lengths")
WRONG_AXIS = ("the context mask lies on the wrong axis: padding hides keys, so a (B, m) mask becomes (B, 1, m) "
              "(context_mask[:, None, :]), not (B, m, 1), which would hide queries")


def _module(t: Trial, e: int, h: int) -> tuple[Obj, RefCrossAttention]:
    """The student's module and the reference holding the same weights."""
    try:
        obj = t.new(CROSS, e, h)
    except StudentError as err:
        raise CheckFailed(f"CrossAttention({e}, {h}) could not be created: {err}") from None
    params = obj.params()
    if set(params) != PARAM_NAMES:
        raise CheckFailed("CrossAttention should hold exactly one MultiHeadAttention(embed_dim, num_heads) as self.attn "
                          f"(parameters attn.q_proj.weight, ...); its parameters are: {', '.join(params) or 'none'}")
    fresh = {k: t.randn(*v.shape, scale=0.5) for k, v in params.items()}
    obj.load(fresh)
    ref = RefCrossAttention(e, h)
    ref.load_state_dict(fresh)
    return obj, ref


def _mistakes(ref: RefCrossAttention, x: Tensor, ctx: Tensor, keep: Tensor | None) -> dict[str, tuple[Tensor, Tensor]]:
    """(output, weights) of the classic wrong answers that can be computed for these shapes."""
    a = ref.attn
    mask = None if keep is None else keep[:, None, :]
    out: dict[str, tuple[Tensor, Tensor]] = {}
    if x.shape[1] == ctx.shape[1]:
        out["the keys are taken from x: keys and values must both come from the context "
            "(attn(x, context, context))"] = a(x, x, ctx, mask)
        out["the values are taken from x: keys and values must both come from the context"] = a(x, ctx, x, mask)
        out["the queries come from the context and the keys from x: the queries come from x, "
            "attn(query=x, key=context, value=context)"] = a(ctx, x, x, mask)
        if keep is not None:
            out[WRONG_AXIS] = a(x, ctx, ctx, keep[:, :, None])
    out["the context is ignored: this is self-attention of x. The keys and values come from the context"] = a(x, x, x)
    if keep is not None:
        out["the context mask is ignored: padded context tokens (False) must get zero weight"] = a(x, ctx, ctx)
        out["the context mask polarity is inverted: True marks real tokens, which may be attended to"] = a(
            x, ctx, ctx, ~mask)
    return out


def _expect_shapes(out, w, b: int, n: int, m: int, e: int, h: int, what: str) -> None:
    if n != m and isinstance(out, Tensor) and tuple(out.shape) == (b, m, e):
        raise CheckFailed(f"the output{what} has one row per context token, shape {(b, m, e)}: the queries come from x, "
                          f"so the output has one row per position of x, {(b, n, e)}")
    if n != m and isinstance(w, Tensor) and tuple(w.shape) == (b, h, n, n):
        raise CheckFailed(f"the weights{what} have shape {(b, h, n, n)}, one column per position of x: the keys come "
                          f"from x, but keys and values must come from the context, giving {(b, h, n, m)}")
    expect_tensor(out, (b, n, e), f"the output{what}")
    expect_tensor(w, (b, h, n, m), f"the weights{what}")


def _compare(t: Trial, obj: Obj, ref: RefCrossAttention, x: Tensor, ctx: Tensor, keep: Tensor | None = None) -> None:
    b, n, e = x.shape
    m, h = ctx.shape[1], ref.attn.num_heads
    what = f" for x {tuple(x.shape)} and context {tuple(ctx.shape)}" + ("" if keep is None else " with a context mask")
    args = (x, ctx) if keep is None else (x, ctx, keep)
    out, w = expect_pair(obj(*args), CROSS)
    _expect_shapes(out, w, b, n, m, e, h, what)
    with torch.no_grad():
        exp_out, exp_w = ref(x, ctx, keep)
        wrong = _mistakes(ref, x, ctx, keep)
    expect_close(out, exp_out, f"the output{what}", {msg: o for msg, (o, _) in wrong.items()})
    expect_close(w, exp_w, f"the weights{what}", {msg: ww for msg, (_, ww) in wrong.items()})


def _with_unequal_lengths(t: Trial, fn, hint: str = N_EQUALS_M) -> None:
    """Run ``fn``; an error that only happens when n != m says so."""
    try:
        fn()
    except StudentError as err:
        if str(err).startswith("not implemented"):
            raise
        raise CheckFailed(f"{str(err).rstrip('.')}, when x and context have different lengths: {hint}") from None


def _keep(t: Trial, b: int, m: int) -> Tensor:
    keep = t.rand_mask(b, m, p=0.6)
    keep[:, 0] = True  # every example has at least one real context token
    keep[0, -1] = False  # and at least one padded one
    return keep


@SUITE.check("test_cross_attention_shapes", parts=[CROSS])
def cross_attention_shapes(t: Trial) -> None:
    """Output (B, n, E) and weights (B, H, n, m) for n == m, n < m and n > m; the module holds self.attn."""
    obj, _ = _module(t, 8, 2)
    out, w = expect_pair(obj(t.randn(2, 4, 8), t.randn(2, 4, 8)), CROSS)
    expect_tensor(out, (2, 4, 8), "the output for x and context of shape (2, 4, 8)")
    for n, m in [(3, 6), (7, 2)]:
        def run(n=n, m=m):
            out, w = expect_pair(obj(t.randn(2, n, 8), t.randn(2, m, 8)), CROSS)
            _expect_shapes(out, w, 2, n, m, 8, 2, f" for x (2, {n}, 8) and context (2, {m}, 8)")
        _with_unequal_lengths(t, run, "the keys and values must come from the context (and the queries from x); "
                              + N_EQUALS_M)


@SUITE.check("test_cross_attention_values", parts=[CROSS])
def cross_attention_values(t: Trial) -> None:
    """With copied weights, equals attention with queries from x and keys and values from the context."""
    obj, ref = _module(t, 8, 2)
    _compare(t, obj, ref, t.randn(2, 5, 8), t.randn(2, 5, 8))  # n == m: every mix-up is computable and named
    for b, n, m, e, h in [(2, 3, 6, 8, 2), (1, 6, 2, 12, 3), (3, 1, 4, 8, 4)]:
        obj, ref = _module(t, e, h)
        x, ctx = t.randn(b, n, e), t.randn(b, m, e)
        _with_unequal_lengths(t, lambda: _compare(t, obj, ref, x, ctx),
                              "keys and values must both come from the context; " + N_EQUALS_M)


@SUITE.check("test_cross_attention_mask", parts=[CROSS])
def cross_attention_mask(t: Trial) -> None:
    """A (B, m) context mask hides padded context tokens from every query (n == m and n != m)."""
    obj, ref = _module(t, 8, 2)
    x, ctx = t.randn(3, 5, 8), t.randn(3, 5, 8)
    _compare(t, obj, ref, x, ctx, _keep(t, 3, 5))
    for b, n, m in [(2, 3, 6), (3, 7, 4)]:
        x, ctx, keep = t.randn(b, n, 8), t.randn(b, m, 8), _keep(t, b, m)
        _with_unequal_lengths(t, lambda: _compare(t, obj, ref, x, ctx, keep), WRONG_AXIS + "; or " + N_EQUALS_M)


@SUITE.check("test_cross_attention_properties", parts=[CROSS])
def cross_attention_properties(t: Trial) -> None:
    """Reordering the context changes nothing; output row i depends on x row i only (no mask: the mask has its own check)."""
    obj, _ = _module(t, 8, 4)
    x, ctx = t.randn(2, 4, 8), t.randn(2, 6, 8)
    result: list = []
    _with_unequal_lengths(t, lambda: result.append(expect_pair(obj(x, ctx), CROSS)),
                          "keys and values must both come from the context; " + N_EQUALS_M)
    out, w = result[0]
    _expect_shapes(out, w, 2, 4, 6, 8, 4, " for x (2, 4, 8) and context (2, 6, 8)")
    perm = torch.randperm(6, generator=t.gen)
    out_p, _ = expect_pair(obj(x, ctx[:, perm]), CROSS)
    expect_close(out_p, out, "the output after reordering the context tokens: the "
                 "context is a set of key-value pairs, so its order must not matter")
    x2 = x.clone()
    x2[:, 0] += t.randn(2, 8)
    out2, _ = expect_pair(obj(x2, ctx), CROSS)
    expect_tensor(out2, (2, 4, 8), "the output")
    expect_close(out2[:, 1:], out[:, 1:], "output rows 1.. after changing only row 0 of x: each row of x may only be "
                 "a query (if x also gives the keys or values, every output row depends on every row of x)")
