"""Graded checks for exercise 03_self_attention: ``SelfAttention`` and the "design the weights" task.

``SelfAttention`` gets weights drawn here (under ``attn.``) and is compared with
``nn.MultiheadAttention`` on ``(x, x, x)``. ``design_weights`` is graded by the
attention its matrices produce on fresh orthonormal embeddings and targets.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit import softmax as ref_softmax
from autograder.checks import CheckFailed, StudentError, Suite, Trial, expect_close, expect_pair, expect_tensor
from autograder.checks.ch02_multi_head import _weights, mistakes, torch_reference

SUITE = Suite("03_self_attention")
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
    p = _weights(t, e)
    obj.load({f"attn.{k}": v for k, v in p.items()})
    return obj, p


def _run(t: Trial, obj, p, x: Tensor, h: int, mask: Tensor | None = None, what: str = ""):
    b, n, e = x.shape
    out, w = expect_pair(obj(x) if mask is None else obj(x, mask), SELF)
    expect_tensor(out, (b, n, e), f"the output of SelfAttention{what}")
    expect_tensor(w, (b, h, n, n), f"the weights of SelfAttention{what}")
    exp_out, exp_w = torch_reference(p, x, x, x, h, mask)
    wrong = mistakes(p, x, x, x, h, mask)
    expect_close(out, exp_out, f"the output of SelfAttention{what}", {msg: o for msg, (o, _) in wrong.items()})
    expect_close(w, exp_w, f"the weights of SelfAttention{what}", {msg: ww for msg, (_, ww) in wrong.items()})
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
        raise CheckFailed(f"position {int((got < 0.9).nonzero()[0])} puts only {got.min().item():.2f} of its weight "
                          f"on its target {where}; expected at least 0.9")
