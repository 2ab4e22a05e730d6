"""Checks of exercise 03_self_attention. ``SelfAttention`` gets weights drawn here (under ``attn.``) and is compared
with ``nn.MultiheadAttention`` on ``(x, x, x)``, its mask with its own unmasked weights renormalised; ``design_weights``
by the attention its matrices make on fresh orthonormal rows and targets. Not stated, not graded: dtype, device."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit import softmax as ref_softmax
from autograder.judging.checks import (CheckFailed, Suite, Trial, expect_close, expect_pair, expect_tensor, listed,
                                       mistakes, number, requirements, row_set, twin)
from autograder.judging.checks.common import (NAN_ROWS, expect_layer, expect_layer_of, expect_masked, random_weights,
                                              reference)

SUITE = Suite("03_self_attention")
_SHAPES, _VALUES, _MASK, _PERM = ("test_self_attention_shapes", "test_self_attention_values",
                                  "test_self_attention_mask", "test_self_attention_permutation")
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'attribute attn': (_SHAPES, 'attn', 'in __init__, as self.attn', (_VALUES, _MASK, _PERM)),
    'returns (output, weights) of the right shapes': (_SHAPES, 'pair', 'shapes (b, n, e) and (b, h, n, n)',
        (_VALUES, _MASK, _PERM)),
    'x is query, key and value': (_VALUES, 'residual connection', 'plays all three roles'),
    'attn created once in __init__': (_VALUES, 'in __init__', 'create the multiheadattention once', (_MASK, _PERM)),
    'mask passed on': (_MASK, 'mask is ignored', 'pass the mask (true = may attend) on unchanged'),
    'fully masked row gives zeros': (_MASK, 'attends to every key instead', 'do not switch its keys back on'),
    'permutation equivariance': (_PERM, 'permutation equivariant', "depends on a position's index", (_VALUES, _MASK)),
    'design: a pair of (d, d_k) matrices': ('test_design_weights', 'pair', 'returns (w_q, w_k)'),
    'design: at least 0.9 on the target': ('test_design_weights', 'scale', 'at least 0.9 of its weight'),
    'design: shared targets': ('test_design_weights', 'share a target', 'several positions may share a target'),
})
RESIDUAL = ("a residual connection is added (x + attention): SelfAttention returns the attention output alone, "
            "attn(x, x, x); the residual belongs to the transformer block (chapter 07)")
UNMASKED_ROWS = ("a query whose keys are all masked attends to every key instead (its row of the mask was switched "
                 "back on to avoid NaN): the contract asks for zero weights there, not a normal attention row")
SELF, DESIGN = "SelfAttention", "design_weights"


# -- SelfAttention ---------------------------------------------------------------------------------


def _layer(t: Trial, e: int, h: int):
    p = random_weights(t, e)
    return twin(t, SELF, e, h, reference=p, names=lambda k: f"attn.{k}", hint=" (SelfAttention needs its "
                "MultiHeadAttention in an attribute named attn)")[0], p


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
        out, w = expect_pair(obj(x), SELF)
        if isinstance(first, Tensor) and isinstance(out, Tensor) and first.shape == out.shape \
                and not torch.allclose(first, out):
            raise CheckFailed("the output changes between two calls on the same input: create the "
                              "MultiHeadAttention once in __init__ (as self.attn), not in forward")
        right_out, right_w = reference(p, x, x, x, h)
        expect_layer(out, w, p, x, x, x, h, None, f"SelfAttention (E={e}, H={h}, n={n})",
                     also={RESIDUAL: (right_out + x.double(), right_w)})


def _anchor(out: Tensor, w: Tensor, p: dict, x: Tensor, h: int, what: str) -> None:
    """The anchor of the checks that compare SelfAttention with itself (issue 34): its answer is attention of x (at
    its own scale), or a classic mistake the value check names (the residual included)."""
    right_out, right_w = reference(p, x, x, x, h)
    expect_layer_of(out, w, p, x, x, x, h, what, also={RESIDUAL: (right_out + x.double(), right_w)})


@SUITE.check("test_self_attention_mask", parts=[SELF])
def self_attention_mask(t: Trial) -> None:
    """The mask (True = may attend) is passed on: (n, n) and (B, n, n) masks hide the same keys in every head."""
    b, n, e, h = 2, 5, 8, 2
    obj, p = _layer(t, e, h)
    x = t.randn(b, n, e)
    causal, per_example = torch.ones(n, n, dtype=torch.bool).tril(), t.rand_mask(b, n, n, p=0.6)
    per_example[..., 0] = True
    padding = (torch.arange(b) != 1).reshape(b, 1, 1)  # example 1 is empty: no query of it has a key to attend to
    out0, w0 = expect_pair(obj(x), SELF)
    w0 = expect_tensor(w0, (b, h, n, n), "the weights of SelfAttention without a mask")
    _anchor(out0, w0, p, x, h, "SelfAttention without a mask")
    for mask, what in [(causal, " with an (n, n) mask"), (per_example, " with a (B, n, n) mask"),
                       (causal & padding, " with a causal & padding mask where example 1 is empty")]:
        out, w = expect_pair(obj(x, mask), SELF)
        mistakes.expect_no_nan({"weights": w, "output": out}, f" of SelfAttention{what}", f": {NAN_ROWS}")
        expect_tensor(out, (b, n, e), f"the output of SelfAttention{what}")
        full = (mask.unsqueeze(1) if mask.dim() == 3 else mask).expand(b, h, n, n)
        expect_masked(expect_tensor(w, (b, h, n, n), f"the weights of SelfAttention{what}"), w0, full,
                      f"the weights of SelfAttention{what}", {UNMASKED_ROWS: full | ~full.any(-1, keepdim=True)})


@SUITE.check("test_self_attention_permutation", parts=[SELF])
def self_attention_permutation(t: Trial) -> None:
    """Reordering the positions of x reorders the outputs (and the weights' rows and columns) the same way."""
    b, n, e, h = 2, 6, 8, 2
    obj, p = _layer(t, e, h)
    x = t.randn(b, n, e)
    perm = torch.randperm(n, generator=t.gen)
    out, w = expect_pair(obj(x), SELF)
    out_p, w_p = expect_pair(obj(x[:, perm]), SELF)
    expect_tensor(out, (b, n, e), "the output of SelfAttention")
    expect_tensor(w, (b, h, n, n), "the weights of SelfAttention")
    expect_close(out_p, out[:, perm], "the output for reordered positions (it should be the output reordered: "
                 "self-attention without positions is permutation equivariant)")
    expect_close(w_p, w[:, :, perm][:, :, :, perm], "the weights for reordered positions")
    _anchor(out, w, p, x, h, "SelfAttention")  # after the property, so that a position-dependent answer is named


# -- design the weights ----------------------------------------------------------------------------


@SUITE.check("test_design_weights", parts=[DESIGN])
def design_weights_check(t: Trial) -> None:
    """The designed W_q, W_k make position i put at least 0.9 of its weight on targets[i], for fresh embeddings and targets."""
    cases = [(4, 4, [1, 2, 3, 0]), (5, 8, None), (6, 6, None), (6, 10, [2, 2, 2, 5, 5, 0])]
    for n, d, targets in cases:
        qmat, r = torch.linalg.qr(torch.randn(d, n, generator=t.gen, dtype=torch.float64))  # (d, n)
        x = (qmat * torch.sign(torch.diagonal(r))).T.contiguous().float()  # (n, d) with orthonormal rows, random
        tg = torch.tensor(targets) if targets is not None else torch.randint(0, n, (n,), generator=t.gen)
        result = t.call(DESIGN, x, tg)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise CheckFailed(f"design_weights should return a pair (W_q, W_k), got {type(result).__name__}")
        w_q, w_k = expect_tensor(result[0], None, "W_q"), expect_tensor(result[1], None, "W_k")
        if w_q.dim() != 2 or w_k.dim() != 2 or w_q.shape[0] != d or w_k.shape[0] != d or w_q.shape[1] != w_k.shape[1]:
            raise CheckFailed(f"W_q and W_k must be matrices of shape (d, d_k) with the same d_k; for d={d} got "
                              f"{tuple(w_q.shape)} and {tuple(w_k.shape)}")
        q, k = x.double() @ w_q.double(), x.double() @ w_k.double()  # (n, d_k)
        w = ref_softmax(q @ k.T / math.sqrt(q.shape[-1]))  # (n, n): the head's weights, in float64
        got = w[torch.arange(n), tg]  # (n,) the weight each position puts on its target
        if bool((got >= 0.9).all()):
            continue
        where = f"with n={n}, d={d}, targets={tg.tolist()}"
        top = w.argmax(-1)
        if bool((top == torch.arange(n)).all()) and not bool((tg == torch.arange(n)).all()):
            raise CheckFailed(f"every position attends to itself {where}: the scores must favour key targets[i] "
                              "for query i, so build the target choice into W_q (or W_k)")
        if all(bool(top[tg[i]] == i) for i in range(n)) and not bool((top == tg).all()):
            raise CheckFailed(f"the pattern is transposed {where}: query i (row i) must attend to key targets[i] "
                              "(column targets[i]), but position targets[i] attends to i instead")
        if bool((top == tg).all()):
            raise CheckFailed(f"each position's largest weight is on its target, but only {got.min().item():.2f} of it "
                              f"{where}: scale W_q or W_k up so the target's score beats the others by a wide margin "
                              "(the scores are divided by sqrt(d_k))")
        raise CheckFailed(f"position {int((got < 0.9).nonzero()[0])} puts only {got.min().item():.2f} of its weight "
                          f"on its target {where}; expected at least 0.9" + (
                              ". Here several positions share a target, which the text allows: a construction that "
                              "inverts the targets (argsort, a permutation matrix's transpose) assumes each target "
                              "is used once" if len(set(tg.tolist())) < n else ""))


# -- conceptual questions (the inputs are in the question; the answer is a value) ----------------------
# q_weights_memory: float32 weights (B, H, n, n), B = 1, H = 16, n = 4096, in MiB; q_scores_flops: Q K^T for one head,
# n = 1024, d = 64, a multiply-add counted as 2; q_margin: a query scores s on its target key and 0 on 3 others.
MB, MH, MN, MIB = 1, 16, 4096, 2 ** 20
FN, FD = 1024, 64
OTHERS, TARGET = 3, 0.9

SUITE.questions({
    "q_changed_rows": listed((0, 2), "Which output rows of self-attention (no positions, no mask) change when inputs "
                             "0 and 2 swap.", {
        "() says the output does not change at all: self-attention is equivariant, not invariant: each output "
        "row follows its own input row, so the rows whose inputs moved move too": (),
        "(0, 1, 2, 3) says every row changes, but output i depends on x_i and on the *set* of all inputs, and "
        "swapping two inputs leaves that set unchanged": (0, 1, 2, 3),
        "(1, 3) lists the rows that stay the same; the question asks for the rows that change": (1, 3),
        **{f"{(row,)} forgets that the swap moves two inputs": (row,) for row in (0, 2)}}, prepare=row_set),
    "q_weights_memory": number(MB * MH * MN * MN * 4 / MIB, "MiB of float32 attention weights (B, H, n, n) for B = 1, "
                               "H = 16, n = 4096.", {f"{wrong:g} {why}": wrong for wrong, why in [
        (MH * MN * MN / MIB, "counts the entries (in Mi); a float32 takes 4 bytes"),
        (MN * MN * 4 / MIB, f"MiB is one head; there are {MH} heads, each with its own n x n weights"),
        (MB * MH * MN * MN * 4 / 1e6, "is in MB (10^6 bytes); the question asks for MiB (2^20 bytes)"),
        (MH * MN * 4 / MIB, "grows linearly with n; the weights hold one number per (query, key) pair, n x n per head"),
        (MB * MH * MN * MN * 8 / MIB, "uses 8 bytes per entry; float32 takes 4")]}),
    "q_scores_flops": number(2 * FN * FN * FD, "FLOPs of Q K^T for one head, n = 1024 and d = 64, a multiply-add "
                             "counted as 2.", {f"{wrong} {why}": wrong for wrong, why in [
        (FN * FN * FD, "counts multiply-adds; the question counts each as 2 FLOPs"),
        (2 * FN * FD * FD, "is the cost of a projection (n x d)(d x d); the scores are (n x d)(d x n)"),
        (FN * FN, "is the number of scores; each is a dot product of length d"),
        (2 * FN * FD, f"is the cost of one query's row of scores; there are n = {FN} queries")]}, rel=0, abs_tol=0.5),
    "q_margin": number(math.log(TARGET / (1 - TARGET) * OTHERS), "The smallest score margin that puts weight 0.9 on "
                       "one key out of four (the others scoring 0).", {
        f"ln(0.9 / 0.1) = {math.log(9):.3f} is the margin against one other key; here three other keys share "
        "the remaining weight": math.log(9),
        "0.9 is the weight itself; the margin s is a score, with e^s / (e^s + 3) = 0.9": 0.9,
        f"ln(0.9) = {math.log(0.9):.3f} forgets the denominator of the softmax": math.log(0.9),
        f"{9 * OTHERS:g} is e^s; the margin is its logarithm": 9.0 * OTHERS,
        f"ln(0.9 * 4) = {math.log(3.6):.3f}: solve e^s / (e^s + 3) = 0.9 for s": math.log(3.6)}, rel=2e-3),
})
