"""Graded checks for exercise 03_self_attention: ``SelfAttention``, the "design the weights" task and
four conceptual questions.

Stated requirements (the exercise's text and docstrings), each with the check that exercises it; a
reviewer compares this list with the notebook, ``tests/test_ch03_grading.py`` breaks each one alone:

SelfAttention(embed_dim, num_heads)
  - holds its MultiHeadAttention in the attribute ``attn`` ................ test_self_attention_shapes
  - forward(x) returns (output (B, n, E), weights (B, H, n, n)) ........... test_self_attention_shapes
  - x is the queries, the keys and the values: equals attn(x, x, x) ....... test_self_attention_values
  - the MultiHeadAttention is created once, in __init__ ................... test_self_attention_values
  - the mask (True = may attend) is passed on unchanged: (n, n), (B, n, n) test_self_attention_mask
  - a query whose keys are all masked gets zero weights, never NaN (the
    given attention's contract, so it holds through SelfAttention) ........ test_self_attention_mask
  - reordering the positions reorders the outputs (permutation
    equivariance, the visible test's promise) ............................. test_self_attention_permutation
design_weights(x, targets)
  - returns a pair (W_q, W_k), each (d, d_k) with the same d_k ............ test_design_weights
  - position i puts at least 0.9 of its weight on targets[i] .............. test_design_weights
  - several positions may share a target .................................. test_design_weights
Not stated, not graded: the dtype and the device.

``SelfAttention`` gets weights drawn here (under ``attn.``) and is compared with
``nn.MultiheadAttention`` on ``(x, x, x)``. ``design_weights`` is graded by the
attention its matrices produce on fresh orthonormal embeddings and targets.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit import softmax as ref_softmax
from autograder.judging.checks import (CheckFailed, StudentError, Suite, Trial, expect_close, expect_number, expect_pair,
                               expect_tensor, expect_tuple, requirement)
from autograder.judging.checks.common import expect_layer, random_weights, reference
from autograder.judging.checks.questions import row_set

SUITE = Suite("03_self_attention")
# requirement -> requirement(the check(s) enforcing it, words of the message an answer breaking it gets, the words
# of the exercise text that state it); tests/test_stated_requirements.py and test_chNN_grading.py read it
STATED_REQUIREMENTS = {
    'attribute attn': requirement('test_self_attention_shapes', 'attn',
                'in __init__, as self.attn',
                also=('test_self_attention_values', 'test_self_attention_mask', 'test_self_attention_permutation')),
    'returns (output, weights) of the right shapes': requirement('test_self_attention_shapes', 'pair',
                'returning (output, weights) with shapes (b, n, e) and (b, h, n, n)',
                also=('test_self_attention_values', 'test_self_attention_mask', 'test_self_attention_permutation')),
    'x is query, key and value': requirement('test_self_attention_values', 'residual connection',
                'plays all three roles: the queries, the keys and the values',
                also=('test_self_attention_mask',)),
    'attn created once in __init__': requirement('test_self_attention_values', 'in __init__',
                'create the multiheadattention once, in __init__',
                also=('test_self_attention_mask', 'test_self_attention_permutation')),
    'mask passed on': requirement('test_self_attention_mask', 'mask is ignored',
                'pass the mask (true = may attend) on unchanged'),
    'fully masked row gives zeros': requirement('test_self_attention_mask', 'attends to every key instead',
                'do not switch its keys back on'),
    'permutation equivariance': requirement('test_self_attention_permutation', 'permutation equivariant',
                "add no positional encoding and nothing else that depends on a position's index",
                also=('test_self_attention_values', 'test_self_attention_mask')),
    'design: a pair of (d, d_k) matrices': requirement('test_design_weights', 'pair',
                'returns (w_q, w_k)'),
    'design: at least 0.9 on the target': requirement('test_design_weights', 'scale',
                'at least 0.9 of its weight on position targets[i]'),
    'design: shared targets': requirement('test_design_weights', 'share a target',
                'several positions may share a target'),
}
RESIDUAL = ("a residual connection is added (x + attention): SelfAttention returns the attention output alone, "
            "attn(x, x, x); the residual belongs to the transformer block (chapter 07)")
UNMASKED_ROWS = ("a query whose keys are all masked attends to every key instead (its row of the mask was switched "
                 "back on to avoid NaN): the contract asks for zero weights there, not a normal attention row")
SELF, DESIGN = "SelfAttention", "design_weights"
PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")


# -- SelfAttention ---------------------------------------------------------------------------------


def _layer(t: Trial, e: int, h: int):
    try:
        obj = t.new(SELF, e, h)
    except StudentError as err:
        raise CheckFailed(f"SelfAttention({e}, {h}) could not be created: {err}") from None
    names = set(obj.params())
    missing = [f"attn.{p}.weight" for p in PROJ if f"attn.{p}.weight" not in names]
    if missing:
        raise CheckFailed(f"SelfAttention needs its MultiHeadAttention in an attribute named attn (parameters "
                          f"attn.q_proj.weight, ...); it has: {', '.join(sorted(names)) or 'no parameters'}")
    p = random_weights(t, e)
    obj.load({f"attn.{k}": v for k, v in p.items()})
    return obj, p


def _run(t: Trial, obj, p, x: Tensor, h: int, mask: Tensor | None = None, what: str = ""):
    out, w = expect_pair(obj(x) if mask is None else obj(x, mask), SELF)
    also = {}
    if mask is not None and not bool(mask.any(-1).all()):
        also[UNMASKED_ROWS] = reference(p, x, x, x, h, mask | ~mask.any(-1, keepdim=True))
    right_out, right_w = reference(p, x, x, x, h, mask)
    also[RESIDUAL] = (right_out + x.double(), right_w)
    expect_layer(out, w, p, x, x, x, h, mask, f"SelfAttention{what}", also=also)
    return out, w


@SUITE.check("test_self_attention_shapes", parts=[SELF])
def self_attention_shapes(t: Trial) -> None:
    """An attribute attn (MultiHeadAttention); forward(x) returns ((B, n, E), (B, H, n, n))."""
    for b, n, e, h in [(2, 5, 8, 2), (1, 3, 12, 4)]:
        obj, _ = _layer(t, e, h)
        out, w = expect_pair(obj(t.randn(b, n, e)), SELF)
        expect_tensor(out, (b, n, e), f"the output for x of shape {(b, n, e)}")
        expect_tensor(w, (b, h, n, n), f"the weights for x of shape {(b, n, e)} with {h} heads")


@SUITE.check("test_self_attention_values", parts=[SELF])
def self_attention_values(t: Trial) -> None:
    """With copied weights, equals torch.nn.MultiheadAttention applied to (x, x, x); the same input gives the same output."""
    for b, n, e, h in [(2, 5, 8, 2), (1, 4, 12, 3), (3, 1, 4, 1)]:
        obj, p = _layer(t, e, h)
        x = t.randn(b, n, e)
        first, _ = expect_pair(obj(x), SELF)
        again, _ = expect_pair(obj(x), SELF)
        if isinstance(first, Tensor) and isinstance(again, Tensor) and first.shape == again.shape \
                and not torch.allclose(first, again):
            raise CheckFailed("the output changes between two calls on the same input: create the "
                              "MultiHeadAttention once in __init__ (as self.attn), not in forward")
        _run(t, obj, p, x, h, what=f" (E={e}, H={h}, n={n})")


@SUITE.check("test_self_attention_mask", parts=[SELF])
def self_attention_mask(t: Trial) -> None:
    """The mask (True = may attend) is passed on: (n, n) and (B, n, n) masks hide the same keys in every head."""
    b, n, e, h = 2, 5, 8, 2
    obj, p = _layer(t, e, h)
    x = t.randn(b, n, e)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    _run(t, obj, p, x, h, causal, what=" with an (n, n) mask")
    per_example = t.rand_mask(b, n, n, p=0.6)
    per_example[..., 0] = True
    _run(t, obj, p, x, h, per_example, what=" with a (B, n, n) mask")
    padding = torch.ones(b, 1, n, dtype=torch.bool)
    padding[1] = False  # example 1 is empty: no query of it has a key to attend to
    _run(t, obj, p, x, h, causal & padding, what=" with a causal & padding mask where example 1 is empty")


@SUITE.check("test_self_attention_permutation", parts=[SELF])
def self_attention_permutation(t: Trial) -> None:
    """Reordering the positions of x reorders the outputs (and the weights' rows and columns) the same way."""
    b, n, e, h = 2, 6, 8, 2
    obj, _ = _layer(t, e, h)
    x = t.randn(b, n, e)
    perm = torch.randperm(n, generator=t.gen)
    out, w = expect_pair(obj(x), SELF)
    out_p, w_p = expect_pair(obj(x[:, perm]), SELF)
    expect_tensor(out, (b, n, e), "the output of SelfAttention")
    expect_tensor(w, (b, h, n, n), "the weights of SelfAttention")
    expect_close(out_p, out[:, perm], "the output for reordered positions (it should be the output reordered: "
                 "self-attention without positions is permutation equivariant)")
    expect_close(w_p, w[:, :, perm][:, :, :, perm], "the weights for reordered positions")


# -- design the weights ----------------------------------------------------------------------------


def orthonormal_rows(t: Trial, n: int, d: int) -> Tensor:
    """``(n, d)`` with orthonormal rows (n <= d), random."""
    a = torch.randn(d, n, generator=t.gen, dtype=torch.float64)
    qmat, r = torch.linalg.qr(a)  # (d, n)
    return (qmat * torch.sign(torch.diagonal(r))).T.contiguous().float()  # (n, d)


def attention_of(x: Tensor, w_q: Tensor, w_k: Tensor) -> Tensor:
    """Weights ``softmax((x W_q)(x W_k)^T / sqrt(d))`` of single-head self-attention, in float64."""
    x64 = x.double()
    q, k = x64 @ w_q.double(), x64 @ w_k.double()  # (n, d_k)
    return ref_softmax(q @ k.T / math.sqrt(q.shape[-1]))  # (n, n)


@SUITE.check("test_design_weights", parts=[DESIGN])
def design_weights_check(t: Trial) -> None:
    """The designed W_q, W_k make position i put at least 0.9 of its weight on targets[i], for fresh embeddings and targets."""
    cases = [(4, 4, [1, 2, 3, 0]), (5, 8, None), (6, 6, None), (6, 10, [2, 2, 2, 5, 5, 0])]
    for n, d, targets in cases:
        x = orthonormal_rows(t, n, d)
        tg = torch.tensor(targets) if targets is not None else torch.randint(0, n, (n,), generator=t.gen)
        result = t.call(DESIGN, x, tg)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise CheckFailed(f"design_weights should return a pair (W_q, W_k), got {type(result).__name__}")
        w_q = expect_tensor(result[0], None, "W_q")
        w_k = expect_tensor(result[1], None, "W_k")
        if w_q.dim() != 2 or w_k.dim() != 2 or w_q.shape[0] != d or w_k.shape[0] != d or w_q.shape[1] != w_k.shape[1]:
            raise CheckFailed(f"W_q and W_k must be matrices of shape (d, d_k) with the same d_k; for d={d} got "
                              f"{tuple(w_q.shape)} and {tuple(w_k.shape)}")
        w = attention_of(x, w_q, w_k)  # (n, n)
        got = w[torch.arange(n), tg]  # (n,) the weight each position puts on its target
        if bool((got >= 0.9).all()):
            continue
        where = f"with n={n}, d={d}, targets={tg.tolist()}"
        top = w.argmax(-1)
        if bool((top == torch.arange(n)).all()) and not bool((tg == torch.arange(n)).all()):
            raise CheckFailed(f"every position attends to itself {where}: the scores must favour key targets[i] "
                              "for query i, so build the target choice into W_q (or W_k)")
        inverse_ok = all(bool((top[tg[i]] == i)) for i in range(n))
        if inverse_ok and not bool((top == tg).all()):
            raise CheckFailed(f"the pattern is transposed {where}: query i (row i) must attend to key targets[i] "
                              "(column targets[i]), but position targets[i] attends to i instead")
        if bool((top == tg).all()):
            raise CheckFailed(f"each position's largest weight is on its target, but only {got.min().item():.2f} of it "
                              f"{where}: scale W_q or W_k up so the target's score beats the others by a wide margin "
                              "(the scores are divided by sqrt(d_k))")
        shared = len(set(tg.tolist())) < n
        raise CheckFailed(f"position {int((got < 0.9).nonzero()[0])} puts only {got.min().item():.2f} of its weight "
                          f"on its target {where}; expected at least 0.9" + (
                              ". Here several positions share a target, which the text allows: a construction that "
                              "inverts the targets (argsort, a permutation matrix's transpose) assumes each target "
                              "is used once" if shared else ""))


# -- conceptual questions (the inputs are in the question; the answer is a value) ----------------------


@SUITE.check("test_q_changed_rows", parts=["q_changed_rows"])
def q_changed_rows(t: Trial) -> None:
    """Which output rows of self-attention (no positions, no mask) change when inputs 0 and 2 swap."""
    expect_tuple(row_set(t.value("q_changed_rows")), (0, 2), "q_changed_rows", {
        "() says the output does not change at all: self-attention is equivariant, not invariant: each output "
        "row follows its own input row, so the rows whose inputs moved move too": (),
        "(0, 1, 2, 3) says every row changes, but output i depends on x_i and on the *set* of all inputs, and "
        "swapping two inputs leaves that set unchanged": (0, 1, 2, 3),
        "(1, 3) lists the rows that stay the same; the question asks for the rows that change": (1, 3),
        "(0,) forgets that the swap moves two inputs": (0,),
        "(2,) forgets that the swap moves two inputs": (2,),
    })


@SUITE.check("test_q_weights_memory", parts=["q_weights_memory"])
def q_weights_memory(t: Trial) -> None:
    """MiB of float32 attention weights (B, H, n, n) for B = 1, H = 16, n = 4096."""
    b, h, n, byte = 1, 16, 4096, 4
    mib = 2 ** 20
    expect_number(t.value("q_weights_memory"), b * h * n * n * byte / mib, "q_weights_memory", {
        f"{h * n * n / mib:g} counts the entries (in Mi); a float32 takes 4 bytes": h * n * n / mib,
        f"{n * n * byte / mib:g} MiB is one head; there are {h} heads, each with its own n x n weights":
            n * n * byte / mib,
        f"{b * h * n * n * byte / 1e6:g} is in MB (10^6 bytes); the question asks for MiB (2^20 bytes)":
            b * h * n * n * byte / 1e6,
        f"{h * n * byte / mib:g} grows linearly with n; the weights hold one number per (query, key) pair, "
        "n x n per head": h * n * byte / mib,
        f"{b * h * n * n * 8 / mib:g} uses 8 bytes per entry; float32 takes 4": b * h * n * n * 8 / mib,
    })


@SUITE.check("test_q_scores_flops", parts=["q_scores_flops"])
def q_scores_flops(t: Trial) -> None:
    """FLOPs of Q K^T for one head, n = 1024 and d = 64, a multiply-add counted as 2."""
    n, d = 1024, 64
    expect_number(t.value("q_scores_flops"), 2 * n * n * d, "q_scores_flops", {
        f"{n * n * d} counts multiply-adds; the question counts each as 2 FLOPs": n * n * d,
        f"{2 * n * d * d} is the cost of a projection (n x d)(d x d); the scores are (n x d)(d x n)":
            2 * n * d * d,
        f"{n * n} is the number of scores; each is a dot product of length d": n * n,
        f"{2 * n * d} is the cost of one query's row of scores; there are n = {n} queries": 2 * n * d,
    }, rel=0, abs_tol=0.5)


# q_margin: a query scores s on its target key and 0 on the n - 1 = 3 others (after scaling).
@SUITE.check("test_q_margin", parts=["q_margin"])
def q_margin(t: Trial) -> None:
    """The smallest score margin that puts weight 0.9 on one key out of four (the others scoring 0)."""
    others, target = 3, 0.9
    expect_number(t.value("q_margin"), math.log(target / (1 - target) * others), "q_margin", {
        f"ln(0.9 / 0.1) = {math.log(9):.3f} is the margin against one other key; here three other keys share "
        "the remaining weight": math.log(9),
        "0.9 is the weight itself; the margin s is a score, with e^s / (e^s + 3) = 0.9": 0.9,
        f"ln(0.9) = {math.log(0.9):.3f} forgets the denominator of the softmax": math.log(0.9),
        f"{9 * others:g} is e^s; the margin is its logarithm": 9.0 * others,
        f"ln(0.9 * 4) = {math.log(3.6):.3f}: solve e^s / (e^s + 3) = 0.9 for s": math.log(3.6),
    }, rel=2e-3)
