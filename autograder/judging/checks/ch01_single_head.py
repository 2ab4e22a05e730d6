"""Graded checks for exercise 01_single_head: ``softmax``, ``scaled_dot_product_attention`` and four questions.
Each attention check tests one property: test_sdpa_values the formula (scale, softmax axis, values); the others
compare the student's answer with the student's own answer on related inputs (a 3-D batch, the unmasked weights
renormalised, the rows without the masked one, float64), so a wrong scale costs test_sdpa_values alone. Not graded,
on purpose: "use your softmax" in the attention is advice (torch's softmax is allowed there); the device."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnkit import scaled_dot_product_attention as ref_attention
from attnkit import softmax as ref_softmax
from autograder.judging.checks import (CheckFailed, StudentError, Suite, Trial, args, close, expect_close, expect_pair,
                                       expect_tensor, listed, mistakes, number, requirements)
from autograder.judging.checks.common import (ATTENTION_MISTAKES, expect_attention_of, expect_distributions,
                                              expect_masked, fitted_scale, hidden_keys_changed)

SUITE = Suite("01_single_head")
_BASIC, _DIM, _STABLE = (f"test_softmax_{c}" for c in ("basic", "dim", "stable"))
_SHAPES, _VALUES, _BATCH, _MASK, _FULL, _DTYPE = _SDPA = tuple(f"test_sdpa_{c}" for c in (
    "shapes", "values", "batch_dims", "mask", "fully_masked", "dtype_stability"))
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'softmax along dim': (_DIM, 'dim', 'along the axis dim'),
    'softmax stable near 1e4': (_STABLE, 'overflow', 'subtract the maximum'),
    'softmax of an all -inf slice is zero': (_STABLE, 'entirely -inf', 'must give zeros, not nan'),
    'softmax keeps shape and dtype': (_BASIC, 'dtype', 'shape and dtype of x'),
    'attention returns a pair': (_SHAPES, 'pair', 'returning (output, weights)', _SDPA[1:]),
    'shapes with n != m and d_v != d_k': (_SHAPES, 'wrong operand', '(..., n, d_v) and (..., n, m)', _SDPA[1:]),
    'any number of leading dimensions': (_BATCH, 'leading dimension', 'leading batch dimensions'),
    'scale 1/sqrt(d_k)': (_VALUES, 'not scaled', 'softmax(q k^t / sqrt(d_k)) v'),
    'softmax over the keys': (_VALUES, 'over the keys', 'visible keys still sum to 1', (_BATCH, _MASK, _FULL)),
    'mask True means may attend': (_MASK, 'polarity', 'true means "may attend"', (_FULL,)),
    'mask before the softmax': (_MASK, 'after the softmax', 'becomes -inf before the softmax'),
    'mask broadcast, per-example mask': (_MASK, 'per-example (B, n, m) mask', 'to (..., n_queries, n_keys)'),
    'fully masked row gives zeros': (_FULL, 'zeros', 'a zero output row, never nan'),
    'float64 in, float64 out': (_DTYPE, 'float64', 'float64 in, float64 out'),
    'large scores stay finite': (_DTYPE, 'overflow', 'stable for large scores', (_FULL,)),
})
SOFTMAX, SDPA = "softmax", "scaled_dot_product_attention"
# What each part may call is its vocabulary (attnkit.vocabulary: the softmax's leaves out every name with softmax,
# softmin, logsumexp, logcumsumexp or cross_entropy in it), printed in the exercise and enforced by the judge.


# -- softmax ------------------------------------------------------------------------------------


def _softmax_mistakes(x: torch.Tensor, dim: int) -> dict[str, torch.Tensor]:
    other = 0 if dim in (-1, x.dim() - 1) else -1
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return {
        f"it normalises over dim={other} instead of dim={dim}: use the dim argument": ref_softmax(x, dim=other),
        "it normalises over the whole tensor instead of along dim": e / e.sum(),
        "it returns exp(x) without dividing by the sum": e,
    }


@SUITE.check(_BASIC, parts=[SOFTMAX])
def softmax_basic(t: Trial) -> None:
    """Softmax of a hand-computed row and of random matrices; rows sum to 1."""
    x = torch.tensor([[0.0, math.log(2.0)], [1.0, 1.0]])
    expect_close(t.call(SOFTMAX, x), torch.tensor([[1 / 3, 2 / 3], [0.5, 0.5]]), "softmax([[0, ln 2], [1, 1]])",
                 _softmax_mistakes(x, -1))
    for shape in [(3, 7), (2, 4, 5), (9,)]:
        x = t.randn(*shape, scale=3.0)
        y = expect_tensor(t.call(SOFTMAX, x), shape, f"softmax of a {shape} tensor")
        if not torch.allclose(y.sum(-1).double(), torch.ones(shape[:-1], dtype=torch.float64), atol=1e-5):
            raise CheckFailed("softmax rows do not sum to 1 along the last axis: did you normalise over the right axis?")
        expect_close(y, ref_softmax(x), f"softmax of a {shape} tensor", _softmax_mistakes(x, -1))
    x = t.randn(2, 5, dtype=torch.float64)
    y = expect_tensor(t.call(SOFTMAX, x), (2, 5), "softmax of a float64 tensor", dtype=torch.float64)
    expect_close(y, ref_softmax(x), "softmax of a float64 tensor", atol=1e-10, rtol=1e-10)


SUITE.oracle(_DIM, SOFTMAX, "The ``dim`` argument chooses the axis, for every axis of a 3-D tensor.",
             cases=[0, 1, 2, -2], draw=lambda t, dim: args(t.randn(3, 4, 5, scale=2.0), dim=dim),
             reference=lambda x, dim: ref_softmax(x, dim=dim), mistakes=_softmax_mistakes,
             what=lambda x, dim: f"softmax(x, dim={dim})")


@SUITE.check(_STABLE, parts=[SOFTMAX])
def softmax_stable(t: Trial) -> None:
    """Large scores (around 1e4, positive and negative) give finite, exact results."""
    x = torch.tensor([[1e4, 1e4 - 1.0, 1e4 - 2.0], [-1e4, -1e4 + 1.0, -1e4 + 3.0]])
    y = t.call(SOFTMAX, x)
    if isinstance(y, torch.Tensor) and not torch.isfinite(y).all():
        raise CheckFailed("softmax gives NaN or inf for scores near 1e4: exp overflows. Subtract the row maximum first "
                          "(it cancels in the ratio).")
    # float32 resolves 1e4 only to about 1e-3, so a correct answer computed another way differs by that much.
    expect_close(y, ref_softmax(x), "softmax of scores near ±1e4", atol=3e-3)
    x = t.randn(4, 6, scale=5e3)
    expect_close(t.call(SOFTMAX, x), ref_softmax(x), "softmax of random scores of size 1e4", atol=3e-3)
    # The docstring's contract: a slice with no allowed entry (every key masked) is all zero.
    x = t.randn(3, 4)
    x[1] = float("-inf")
    x[2, :2] = float("-inf")
    y = t.call(SOFTMAX, x)
    what = "softmax of a row that is entirely -inf (every key masked)"
    if isinstance(y, torch.Tensor) and tuple(y.shape) == (3, 4) and y.is_floating_point():
        if torch.isnan(y[1]).any():
            raise CheckFailed(f"{what} gives NaN: exp(-inf - max) with max = -inf is exp(nan). The docstring asks "
                              "for zeros there: replace a -inf maximum by 0 and divide only where the sum is positive")
        if close(y[1], torch.full((4,), 0.25)):
            raise CheckFailed(f"{what} gives equal weights 1/4 instead of zeros: a row with no allowed key must "
                              "be all zero (the docstring's contract)")
    expect_close(y, ref_softmax(x), what, atol=1e-5)


# -- scaled dot-product attention --------------------------------------------------------------


def _mistakes(q, k, v) -> mistakes.Pairs:
    """message -> (output, weights) of each classic mistake on these unmasked inputs."""
    return mistakes.named(mistakes.wrong_attention(q, k, v), ATTENTION_MISTAKES)


def _why_it_failed(t: Trial, lead: tuple[int, ...]) -> str:
    """Probe the student's attention to explain a failure on inputs with ``lead`` leading dims and n != m."""
    if len(lead) != 1 and _own(t, t.randn(2, 4, 5), t.randn(2, 6, 5), t.randn(2, 6, 3), what="attention",
                               probe=True) is not None:
        return (f"Inputs with {len(lead)} leading dimension(s) must work too (3-D ones do): use transpose(-2, -1) "
                "and @ (or matmul), not bmm or transpose(1, 2)")
    q, k = t.randn(2, 5, 4), t.randn(2, 5, 4)
    square = _own(t, q, k, t.randn(2, 5, 3), what="attention", probe=True)
    if square is None:
        return ""
    if close(square[1], ref_softmax(k @ q.transpose(-2, -1) / math.sqrt(4))):
        return ("The wrong operand is transposed: your scores are K Q^T, of shape (..., m, n); they must be "
                "Q K^T = query @ key.transpose(-2, -1), of shape (..., n, m), one row per query")
    return ("It works when there are as many keys as queries (n == m): something uses the query length n or a "
            "shape (..., m, n) where the keys' length m belongs")


def _own(t: Trial, q, k, v, mask=None, what: str = "", probe: bool = False) -> tuple | None:
    """The student's (output, weights) on these inputs, of the right shapes when ``what`` names the call; an error is
    explained when probing finds why, or, for a probe's own call (``probe``), None."""
    try:
        out, w = expect_pair(t.call(SDPA, *((q, k, v) if mask is None else (q, k, v, mask))), SDPA)
        if what:
            expect_tensor(w, (*q.shape[:-1], k.shape[-2]), f"the weights of {what}")
            expect_tensor(out, (*q.shape[:-1], v.shape[-1]), f"the output of {what}")
    except CheckFailed as e:
        if probe:
            return None
        hint = "" if isinstance(e, StudentError) and e.placeholder else _why_it_failed(t, tuple(q.shape[:-2]))
        raise (CheckFailed(f"{str(e).rstrip('.')}. {hint}") if hint else e) from None
    return out, w


@SUITE.check(_SHAPES, parts=[SDPA])
def sdpa_shapes(t: Trial) -> None:
    """Returns (output, weights) with shapes (B, n, d_v) and (B, n, m), for n != m and d_v != d_k."""
    for b, n, m, dk, dv in [(2, 3, 5, 4, 6), (1, 7, 2, 3, 1)]:
        q, k, v = t.randn(b, n, dk), t.randn(b, m, dk), t.randn(b, m, dv)
        _own(t, q, k, v, what=f"attention for query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}")


@SUITE.check(_VALUES, parts=[SDPA])
def sdpa_values(t: Trial) -> None:
    """Output and weights equal torch.nn.functional.scaled_dot_product_attention on random inputs."""
    for b, n, m, dk, dv in [(2, 4, 6, 8, 8), (3, 5, 3, 4, 7)]:
        q, k, v = t.randn(b, n, dk, scale=1.5), t.randn(b, m, dk, scale=1.5), t.randn(b, m, dv)
        (out, w), (_, exp_w) = _own(t, q, k, v, what="scaled_dot_product_attention"), ref_attention(q, k, v)
        if not torch.allclose(w.sum(-1).double(), torch.ones(b, n, dtype=torch.float64), atol=1e-4):
            raise CheckFailed("the weights do not sum to 1 over the keys: did you apply the softmax over the right axis (dim=-1)?")
        wrong = _mistakes(q, k, v)
        expect_close(w, exp_w, "the attention weights", mistakes.weights(wrong))
        expect_close(out, F.scaled_dot_product_attention(q, k, v), "the attention output", mistakes.outputs(wrong))


@SUITE.check(_BATCH, parts=[SDPA])
def sdpa_batch_dims(t: Trial) -> None:
    """Any number of leading dimensions, none (n, d) to two (B, H, n, d), each a batch dimension (scored with your own scale)."""
    for lead in [(), (2, 3), (2, 1, 2)]:
        q, k, v = t.randn(*lead, 4, 5), t.randn(*lead, 6, 5), t.randn(*lead, 6, 3)
        out, w = _own(t, q, k, v, what=f"attention on {len(lead) + 2}-D inputs")
        c = fitted_scale(q @ k.transpose(-2, -1), w)  # the student's scale: a wrong one costs test_sdpa_values alone
        q = q if c is None else q * (c * math.sqrt(q.shape[-1]))  # the reference's Q K^T / sqrt(d_k) at that scale
        exp_out, exp_w = ref_attention(q, k, v)
        expect_close(out, exp_out, f"the output for inputs of shape {tuple(q.shape)}", mistakes.outputs(_mistakes(q, k, v)))
        expect_close(w, exp_w, f"the weights for inputs of shape {tuple(q.shape)}")


@SUITE.check(_MASK, parts=[SDPA])
def sdpa_mask(t: Trial) -> None:
    """A boolean mask (True = may attend), (n, m) over the batch or (B, n, m) per example, hides its keys before the softmax."""
    b, n, m, d = 2, 5, 6, 4
    q, k, v = t.randn(b, n, d), t.randn(b, m, d), t.randn(b, m, d + 1)
    for mask, what in [(t.rand_mask(n, m, p=0.6), "masked attention"),
                       (t.rand_mask(b, n, m, p=0.5), "attention with a per-example (B, n, m) mask")]:
        mask[..., 0], mask[..., -1] = True, False  # every query sees key 0; no query sees key m-1
        out0, w0 = _own(t, q, k, v, what="attention without a mask")
        expect_attention_of(q, k, v, out0, w0, "attention without a mask")  # the anchor: w0 is attention of q, k
        out, w = _own(t, q, k, v, mask, what=what)
        full = mask.expand_as(w)
        expect_masked(w, w0, full, f"the weights of {what}", {
            "a per-example (B, n, m) mask must give each example its own mask": mask[:1].expand_as(w)})
        out2, _ = _own(t, q, k, hidden_keys_changed(v, full), mask, what=what)
        expect_close(out2, out, f"the output of {what} when only the value of a masked key changes (a key no query "
                     "may see must not reach the output)")


@SUITE.check(_FULL, parts=[SDPA])
def sdpa_fully_masked(t: Trial) -> None:
    """A query row with no allowed key gives zero weights and a zero output row, not NaN; the other rows are unchanged."""
    q, k, v = t.randn(1, 3, 4), t.randn(1, 5, 4), t.randn(1, 5, 2)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out, w = _own(t, q, k, v, mask)
    mistakes.expect_no_nan({"weights": w, "output": out}, "", " for a query whose keys are all masked: softmax over a "
                           "row of -inf divides 0 by 0. The contract asks for a zero row instead (for example, replace "
                           "the row's max by 0 when it is -inf and divide by the sum only where it is positive)")
    out, w = _own(t, q, k, v, mask, what="attention with one fully masked query row")
    out0, w0 = _own(t, q, k, v, what="attention on the same inputs without a mask")
    expect_attention_of(q, k, v, out0, w0, "attention on the same inputs without a mask")  # the anchor
    expect_close(w[:, 1], torch.zeros(1, 5), "the weights of the fully masked query row",
                 {ATTENTION_MISTAKES[mistakes.FINITE_FILL]: torch.full((1, 5), 0.2)})
    expect_close(out[:, 1], torch.zeros(1, 2), "the output row of the fully masked query (it should be all zero)")
    rest = torch.tensor([0, 2])
    expect_distributions(w[:, rest], "the weights of the other rows")
    out2, w2 = _own(t, q[:, rest], k, v, mask[rest], what="attention on the other two queries")
    expect_close(w[:, rest], w0[:, rest], "the weights of the other rows (they may see every key, so they must equal "
                 "your weights without a mask)")
    expect_close(w[:, rest], w2, "the weights of the other rows (a fully masked row must not change them)")
    expect_close(out[:, rest], out2, "the output of the other rows (a fully masked row must not change them)")


@SUITE.check(_DTYPE, parts=[SDPA])
def sdpa_dtype_stability(t: Trial) -> None:
    """float64 in gives float64 out; large scores (1e4 after scaling) stay finite, equal to the float64 answer."""
    q, k, v = t.randn(2, 3, 4), t.randn(2, 5, 4), t.randn(2, 5, 3)
    out32, w32 = _own(t, q, k, v, what="attention on float32 inputs")
    scale = expect_attention_of(q, k, v, out32, w32, "attention on float32 inputs")  # the anchor
    out, w = _own(t, q.double(), k.double(), v.double())
    expect_tensor(out, tuple(out32.shape), "the output for float64 inputs", dtype=torch.float64)
    expect_tensor(w, tuple(w32.shape), "the weights for float64 inputs", dtype=torch.float64)
    expect_close(out, out32, "the output for float64 inputs (it should equal the float32 answer to float32's precision)")
    q, k, v = t.randn(2, 3, 4, scale=100.0), t.randn(2, 6, 4, scale=100.0), t.randn(2, 6, 3)
    out, w = _own(t, q, k, v)
    if isinstance(w, torch.Tensor) and not torch.isfinite(w).all():
        raise CheckFailed("the weights overflow to NaN/inf for large scores (around 1e4): use a numerically stable "
                          "softmax that subtracts the row maximum")
    out64, w64 = _own(t, q.double(), k.double(), v.double(), what="attention on the same large scores in float64")
    # the anchor at scores too large to show a scale (one-hot rows): the scale of the float32 call above
    expect_attention_of(q.double(), k.double(), v.double(), out64, w64, "attention on large scores in float64",
                        atol=5e-3, scale=scale)
    expect_close(w, w64, "the weights for large scores (they should equal your float64 answer)", atol=1e-4)
    expect_close(out, out64, "the output for large scores (it should equal your float64 answer)", atol=1e-3)


# -- conceptual questions: the right values computed from the question's inputs ----------------------------
# q_score_variance, q_variance_over_dk: q and k have D_K independent entries of mean 0, variance 1. q_weight: d_k = 4,
# one query q = (2, 0, 0, 0), keys k1 = (1, 0, 0, 0), k2 = (0, 0, 0, 0). A wrong answer's message starts with it.

D_K = 64
S1, S2 = 2.0 / math.sqrt(4), 0.0  # q_weight's scaled scores of the two keys


def _weight_on_first(s1: float, s2: float) -> float:
    return math.exp(s1) / (math.exp(s1) + math.exp(s2))


SUITE.questions({
    "q_score_variance": number(float(D_K), "Var(q . k) for d_k = 64 independent entries of variance 1 (no scaling).",
                               {f"{wrong:g} {why}": wrong for wrong, why in [
        (1.0, "is the variance after dividing by sqrt(d_k); the question asks for the raw dot product q . k"),
        (math.sqrt(D_K), "= sqrt(d_k) is the standard deviation; the variance is its square"),
        (D_K ** 2, "= d_k^2 is too large: q . k is a sum of d_k independent products, each of variance 1, and the "
         "variances of independent terms add"),
        (0.0, "is the mean of q . k; its variance is the sum of the d_k products' variances")]}),
    "q_variance_over_dk": number(D_K / D_K ** 2, "Var(q . k / d_k) for d_k = 64: dividing by c divides the variance "
                                 "by c^2.", {f"{wrong:g}{why}": wrong for wrong, why in [
        (1.0, " is the variance after dividing by sqrt(d_k) (or the variance divided by d_k once); dividing q . k by "
         "d_k = 64 divides its variance by d_k^2"),
        (1 / math.sqrt(D_K), " = 1/sqrt(d_k) is the standard deviation; the variance is its square"),
        (D_K, " is the variance without any scaling"),
        (math.sqrt(D_K), f": dividing by c divides the variance by c^2 = {D_K ** 2}, not by sqrt(c)")]}),
    "q_weight": number(_weight_on_first(S1, S2), "The weight the query puts on the first key in a hand-sized example "
                       "(d_k = 4, two keys).", {**{f"{wrong:.3f} {why}": wrong for wrong, why in [
        (_weight_on_first(2.0, 0.0), "is the weight without the 1/sqrt(d_k) scaling: the scores are q . k / sqrt(4)"),
        (_weight_on_first(0.5, 0.0), "divides the score by d_k = 4; the scale is 1/sqrt(d_k) = 1/2"),
        (_weight_on_first(S2, S1), "is the weight on the second key (the all-zero one)")]},
        "1.0 normalises the scores themselves (1 / (1 + 0)); the weights are exp(score) / sum of exp(scores)": 1.0,
        "0.5 treats the two keys alike, but their scores q . k differ": 0.5}, rel=2e-3),
    "q_output_shape": listed((8, 3, 5, 32), "The output shape of attention for query (8, 3, 5, 16), key (8, 3, 7, 16), "
                             "value (8, 3, 7, 32).", {f"{wrong} {why}": wrong for wrong, why in [
        ((8, 3, 5, 16), "has the width d_k of the queries and keys; the output mixes value rows, so its width is "
         "d_v = 32"),
        ((8, 3, 7, 32), "has one row per key; the output has one row per query (n = 5)"),
        ((8, 3, 5, 7), "is the shape of the weights (one weight per query and key), not of the output"),
        ((5, 32), "drops the leading (batch, head) dimensions; they are kept")]}),
})
