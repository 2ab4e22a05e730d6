"""Graded checks for exercise 02_multi_head: ``split_heads``, ``merge_heads``, ``MultiHeadAttention`` and
four conceptual questions.

Stated requirements (the exercise's text and docstrings), each with the check that exercises it; a
reviewer compares this list with the notebook, ``tests/test_ch02_grading.py`` breaks each one alone:

split_heads(x, num_heads)
  - (B, n, H*Dh) -> (B, H, n, Dh): the head axis before the sequence axis .. test_split_heads
  - head h holds the contiguous features h*Dh:(h+1)*Dh (not interleaved,
    not a plain reshape of the flattened (n, E) block) ..................... test_split_heads
merge_heads(x)
  - (B, H, n, Dh) -> (B, n, H*Dh), the inverse of split_heads: the heads
    concatenated per position, in head order .............................. test_merge_heads
MultiHeadAttention(embed_dim, num_heads, bias=True)
  - nn.Linear attributes q_proj, k_proj, v_proj, out_proj, each (E, E) .... test_mha_shapes
  - bias=True gives every projection a bias, bias=False none (out_proj too) test_mha_shapes
  - raises a ValueError (that type) when embed_dim % num_heads != 0 ....... test_mha_shapes
  - forward returns (output (B, n, E), per-head weights (B, H, n, m)), not
    their average, for n != m .............................................. test_mha_shapes
  - q_proj on query, k_proj on key, v_proj on value (different tensors) ... test_mha_values
  - each head's scores scaled by 1/sqrt(Dh), one head's width ............. test_mha_values
  - out_proj applied to the merged heads .................................. test_mha_values
  - mask True means "may attend", applied before the softmax .............. test_mha_mask
  - a mask broadcastable to (B, n, m) applies to every head (unsqueeze(1)) test_mha_mask
  - a 4-D mask is (B, H, n, m): one mask per head ......................... test_mha_mask
  - a query whose keys are all masked: zero weights (the output row is
    out_proj of zeros), never NaN ......................................... test_mha_mask
Not stated, not graded: the dtype and the device (the exercise states neither).

The student's module gets weights drawn here (copied in with ``Obj.load``), so
the expected answer is computed in the judge from the same weights, by
``nn.MultiheadAttention`` and by the reference formula; the classic mistakes
are computed from those weights too and named when the answer equals one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit import merge_heads as ref_merge
from attnkit import split_heads as ref_split
from autograder.judging.checks import (CheckFailed, StudentError, Suite, Trial, expect_close, expect_number, expect_pair,
                               expect_tensor, expect_tuple, requirement)
from autograder.judging.checks.common import (INTERLEAVED_SPLIT, MASK_AXES, NO_TRANSPOSE_MERGE, NO_TRANSPOSE_SPLIT, REVERSED_HEADS,
                                      Params, expect_layer, random_weights)

SUITE = Suite("02_multi_head")
# requirement -> requirement(the check(s) enforcing it, words of the message an answer breaking it gets, the words
# of the exercise text that state it); tests/test_stated_requirements.py and test_chNN_grading.py read it
STATED_REQUIREMENTS = {
    'split: head axis before the sequence axis': requirement('test_split_heads', 'transpose',
                '(b, n, h*dh) -> (b, h, n, dh)'),
    'split: contiguous feature blocks per head': requirement('test_split_heads', 'interleaved',
                'head h holds features h*dh:(h+1)*dh'),
    'merge: inverse of split, heads in order': requirement('test_merge_heads', 'reverse order',
                'the inverse, (b, h, n, dh) -> (b, n, h*dh)'),
    'four nn.Linear(E, E) projections': requirement('test_mha_shapes', 'no out_proj',
                'q_proj, k_proj, v_proj and out_proj are each nn.linear(e, e, bias=bias)',
                also=('test_mha_values', 'test_mha_mask')),
    'bias flag': requirement('test_mha_shapes', 'still has biases',
                'with bias=false none of the four has a bias'),
    'ValueError when E % H != 0': requirement('test_mha_shapes', 'ValueError',
                'raise a valueerror when embed_dim is not divisible by num_heads'),
    'per-head weights (B, H, n, m), n != m': requirement('test_mha_shapes', 'per-head',
                'per-head weights (b, h, n, m)',
                also=('test_mha_values', 'test_mha_mask')),
    'each projection on its own input': requirement('test_mha_values', 'wrong input',
                'apply q_proj to query, k_proj to key and v_proj to value',
                also=('test_mha_mask',)),
    'scale 1/sqrt(head_dim)': requirement('test_mha_values', 'sqrt(head_dim)',
                "the scale 1/\\sqrt{d_h} of one head's width",
                also=('test_mha_mask',)),
    'out_proj on the merged heads': requirement('test_mha_values', 'out_proj is missing',
                'merge the heads and apply out_proj',
                also=('test_mha_mask',)),
    'mask True means may attend': requirement('test_mha_mask', 'polarity',
                'true means "may attend"'),
    '3-D mask applies to every head': requirement('test_mha_mask', 'unsqueeze(1)',
                'a mask broadcastable to (b, n, m) applies to every head'),
    '4-D mask per head': requirement('test_mha_mask', '(B, H, n, m) per-head mask',
                'a 4-d mask is already (b, h, n, m)'),
    'fully masked row gives zeros': requirement('test_mha_mask', 'all masked gets NaN',
                'gets zero weights in every head, never nan'),
}
SPLIT, MERGE, MHA = "split_heads", "merge_heads", "MultiHeadAttention"



# -- split / merge -------------------------------------------------------------------------------


def _split_mistakes(x: Tensor, h: int) -> dict[str, Tensor]:
    b, n, e = x.shape
    return {NO_TRANSPOSE_SPLIT: x.reshape(b, h, n, e // h),
            INTERLEAVED_SPLIT: x.reshape(b, n, e // h, h).permute(0, 3, 1, 2)}


@SUITE.check("test_split_heads", parts=[SPLIT])
def split_heads_check(t: Trial) -> None:
    """split_heads turns (B, n, H*Dh) into (B, H, n, Dh), head h holding features h*Dh:(h+1)*Dh."""
    for b, n, h, d in [(2, 3, 2, 4), (1, 5, 4, 2), (3, 4, 1, 3), (2, 1, 3, 2)]:
        x = t.randn(b, n, h * d)
        y = t.call(SPLIT, x, h)
        if isinstance(y, Tensor) and tuple(y.shape) == (b, n, h, d) and (b, n, h, d) != (b, h, n, d):
            raise CheckFailed(f"split_heads returned shape {(b, n, h, d)} = (B, n, H, Dh): move the head axis in "
                              "front of the sequence axis with transpose(1, 2)")
        expect_close(y, ref_split(x, h), f"split_heads of a {tuple(x.shape)} tensor into {h} heads", _split_mistakes(x, h))


@SUITE.check("test_merge_heads", parts=[MERGE])
def merge_heads_check(t: Trial) -> None:
    """merge_heads turns (B, H, n, Dh) back into (B, n, H*Dh) and undoes split_heads."""
    for b, h, n, d in [(2, 2, 3, 4), (1, 4, 5, 2), (3, 1, 4, 3), (2, 3, 1, 2)]:
        x = t.randn(b, h, n, d)
        y = t.call(MERGE, x)
        if isinstance(y, Tensor) and tuple(y.shape) == (b, h, n * d) and h != n:
            raise CheckFailed(f"merge_heads returned shape {(b, h, n * d)}: the result is (B, n, H*Dh), "
                              "so transpose the head and sequence axes before reshaping")
        expect_close(y, ref_merge(x), f"merge_heads of a {tuple(x.shape)} tensor",
                     {NO_TRANSPOSE_MERGE: x.reshape(b, n, h * d), **({REVERSED_HEADS: ref_merge(x.flip(1))} if h > 1 else {})})


def _module(t: Trial, e: int, h: int, bias: bool = True):
    try:
        obj = t.new(MHA, e, h) if bias else t.new(MHA, e, h, bias=False)
    except StudentError as err:
        raise CheckFailed(f"MultiHeadAttention({e}, {h}{'' if bias else ', bias=False'}) could not be created: {err}") from None
    p = random_weights(t, e, bias)
    # A bias the flag should have removed is test_mha_shapes' to charge (once): here it is zeroed, so the values
    # are judged on their own.
    extra = {k: torch.zeros_like(v) for k, v in obj.params().items() if k.endswith(".bias") and k not in p}
    obj.load(p | extra)
    return obj, p


def _run(t: Trial, obj, p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None, what: str = ""):
    args = (q, k, v) if mask is None else (q, k, v, mask)
    try:
        out, w = expect_pair(obj(*args), MHA)
    except StudentError as err:
        if mask is not None and mask.dim() == 3 and not str(err).startswith("not implemented"):
            raise CheckFailed(f"{err}{what}. Hint: {MASK_AXES}") from None
        raise
    b, n, e = q.shape
    m = k.shape[1]
    if isinstance(w, Tensor) and tuple(w.shape) == (b, n, m):
        raise CheckFailed(f"the weights have shape {(b, n, m)}: return the per-head weights (B, H, n, m) = "
                          f"{(b, h, n, m)}, not their average")
    expect_layer(out, w, p, q, k, v, h, mask, f"MultiHeadAttention{what}", "per-head weights")
    return out, w


@SUITE.check("test_mha_shapes", parts=[MHA])
def mha_shapes(t: Trial) -> None:
    """Attributes q_proj, k_proj, v_proj, out_proj of shape (E, E); output (B, n, E), weights (B, H, n, m); E % H != 0 is refused."""
    for e, h in [(8, 2), (12, 3)]:
        try:
            obj = t.new(MHA, e, h)
        except StudentError as err:
            raise CheckFailed(f"MultiHeadAttention({e}, {h}) could not be created: {err}") from None
        params = obj.params()
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            if f"{name}.weight" not in params:
                raise CheckFailed(f"MultiHeadAttention has no {name} (an nn.Linear(embed_dim, embed_dim)); its "
                                  f"parameters are: {', '.join(params) or 'none'}")
            expect_tensor(params[f"{name}.weight"], (e, e), f"{name}.weight")
            if f"{name}.bias" not in params:
                raise CheckFailed(f"{name} has no bias: with bias=True (the default) every projection has one")
        b, n, m = 2, 3, 5
        out, w = expect_pair(obj(t.randn(b, n, e), t.randn(b, m, e), t.randn(b, m, e)), MHA)
        if isinstance(w, Tensor) and tuple(w.shape) == (b, n, m):
            raise CheckFailed(f"the weights have shape {(b, n, m)}: return the per-head weights (B, H, n, m) = {(b, h, n, m)}")
        expect_tensor(out, (b, n, e), f"the output for query (2, 3, {e}) and key/value (2, 5, {e})")
        expect_tensor(w, (b, h, n, m), f"the weights for query (2, 3, {e}) and key/value (2, 5, {e}) with {h} heads")
    params = t.new(MHA, 8, 2, bias=False).params()
    if any(k.endswith("bias") for k in params):
        biased = ", ".join(sorted({k.rpartition(".")[0] for k in params if k.endswith("bias")}))
        raise CheckFailed(f"MultiHeadAttention(8, 2, bias=False) still has biases ({biased}): all four projections, "
                          "out_proj included, are nn.Linear(E, E, bias=bias)")
    for e, h in [(10, 3), (6, 4)]:
        try:
            t.new(MHA, e, h)
        except StudentError as err:
            if str(err).startswith("not implemented"):
                raise
            if not str(err).split(":")[0].endswith("ValueError"):  # "your code raised ValueError: ..."
                raise CheckFailed(f"MultiHeadAttention({e}, {h}) raised the wrong kind of error ({err}): the exercise "
                                  "asks for a ValueError when embed_dim is not divisible by num_heads (an assert "
                                  "raises AssertionError, and disappears under python -O)") from None
            continue
        raise CheckFailed(f"MultiHeadAttention({e}, {h}) should raise an error (a ValueError saying embed_dim must be "
                          f"divisible by num_heads): {e} features cannot be split evenly into {h} heads")


@SUITE.check("test_mha_values", parts=[MHA])
def mha_values(t: Trial) -> None:
    """With copied weights, output and per-head weights equal torch.nn.MultiheadAttention (n != m, 1 to 4 heads)."""
    for b, n, m, e, h in [(2, 4, 6, 8, 2), (1, 5, 3, 12, 3), (2, 3, 3, 8, 4), (1, 4, 2, 6, 1)]:
        obj, p = _module(t, e, h)
        q, k, v = t.randn(b, n, e), t.randn(b, m, e), t.randn(b, m, e)
        _run(t, obj, p, q, k, v, h, what=f" (E={e}, H={h}, n={n}, m={m})")
    obj, p = _module(t, 8, 2, bias=False)
    x, y = t.randn(2, 3, 8), t.randn(2, 4, 8)
    _run(t, obj, p, x, y, y, 2, what=" with bias=False")


@SUITE.check("test_mha_mask", parts=[MHA])
def mha_mask(t: Trial) -> None:
    """A mask (True = may attend) of shape (n, m) or (B, n, m) applies to every head; a (B, H, n, m) one to each head."""
    b, n, m, e, h = 2, 4, 5, 8, 2
    obj, p = _module(t, e, h)
    q, k, v = t.randn(b, n, e), t.randn(b, m, e), t.randn(b, m, e)
    mask = t.rand_mask(n, m, p=0.6)
    mask[:, 0] = True
    _, w = _run(t, obj, p, q, k, v, h, mask, what=" with an (n, m) mask")
    per_example = t.rand_mask(b, n, m, p=0.6)
    per_example[..., -1] = True
    _run(t, obj, p, q, k, v, h, per_example, what=" with a (B, n, m) mask")
    padding = torch.ones(b, 1, m, dtype=torch.bool)
    padding[1, 0, 3:] = False
    _run(t, obj, p, q, k, v, h, padding, what=" with a (B, 1, m) padding mask")
    per_head = t.rand_mask(b, h, n, m, p=0.5)
    per_head[..., 1] = True
    _run(t, obj, p, q, k, v, h, per_head, what=" with a (B, H, n, m) per-head mask")
    empty = torch.ones(b, 1, m, dtype=torch.bool)
    empty[1] = False  # example 1 is a sequence of length 0: none of its queries has a key to attend to
    _run(t, obj, p, q, k, v, h, empty, what=" with a (B, 1, m) mask that hides every key of example 1")


# -- conceptual questions (the inputs are in the question; the answer is a value) ----------------------


@SUITE.check("test_q_split_shape", parts=["q_split_shape"])
def q_split_shape(t: Trial) -> None:
    """The shape of split_heads(x, 8) for x of shape (4, 10, 96)."""
    b, n, e, h = 4, 10, 96, 8
    expect_tuple(t.value("q_split_shape"), (b, h, n, e // h), "q_split_shape", {
        f"{(b, n, h, e // h)} = (B, n, H, Dh) is the view before the transpose: split_heads moves the head axis "
        "in front of the sequence axis": (b, n, h, e // h),
        f"{(b, h, n, e)} gives every head all E = {e} features; the heads share them out, E / H each": (b, h, n, e),
        f"{(b, e // h, n, h)} swaps the number of heads and their width: the second argument of split_heads is "
        "the number of heads": (b, e // h, n, h),
        f"{(b * h, n, e // h)} folds the heads into the batch (as some libraries do); split_heads keeps a head "
        "axis: (B, H, n, Dh)": (b * h, n, e // h),
    })


@SUITE.check("test_q_head_scale", parts=["q_head_scale"])
def q_head_scale(t: Trial) -> None:
    """The number each head's scores are divided by, for embed_dim 512 and 8 heads."""
    e, h = 512, 8
    expect_number(t.value("q_head_scale"), math.sqrt(e // h), "q_head_scale", {
        f"sqrt(embed_dim) = sqrt({e}) uses the full width; each head's queries and keys have only "
        "head_dim = embed_dim / num_heads features": math.sqrt(e),
        f"{e // h} is head_dim itself; the scale is the square root of the width": float(e // h),
        f"{e} is embed_dim: the scale is a square root, and of one head's width": float(e),
        f"sqrt({h}) uses the number of heads; the scale depends on the width of one head": math.sqrt(h),
    }, rel=2e-3)


@SUITE.check("test_q_mha_params", parts=["q_mha_params"])
def q_mha_params(t: Trial) -> None:
    """The number of parameters of MultiHeadAttention(512, 8) with biases."""
    e, h = 512, 8
    per = e * e + e  # one nn.Linear(E, E) with its bias
    expect_number(t.value("q_mha_params"), 4 * per, "q_mha_params", {
        f"{4 * e * e} leaves out the four bias vectors (bias=True)": 4 * e * e,
        f"{3 * per} counts q_proj, k_proj and v_proj but not out_proj": 3 * per,
        f"{3 * h * per + per} gives every head its own (E, E) projections; the heads share one (E, E) "
        "projection per role, each head using E / H of its output features": 3 * h * per + per,
        f"{3 * h * e * e + e * e} gives every head its own (E, E) projections (and leaves out the biases)":
            3 * h * e * e + e * e,
        f"{4 * (e * (e // h) + e // h)} counts one head's (E, Dh) projections; the layer has H of them per role":
            4 * (e * (e // h) + e // h),
    }, rel=0, abs_tol=0.5)


@SUITE.check("test_q_weights_shape", parts=["q_weights_shape"])
def q_weights_shape(t: Trial) -> None:
    """The shape of the weights MultiHeadAttention(64, 4) returns for query (2, 5, 64) and key/value (2, 7, 64)."""
    b, n, m, e, h = 2, 5, 7, 64, 4
    expect_tuple(t.value("q_weights_shape"), (b, h, n, m), "q_weights_shape", {
        f"{(b, n, m)} is the weights averaged over the heads (what nn.MultiheadAttention returns by default); "
        "the exercise returns every head's weights": (b, n, m),
        f"{(b, h, n, e // h)} is the shape of the heads' outputs before merging, not of the weights":
            (b, h, n, e // h),
        f"{(b, h, m, n)} has one row per key; the weights have one row per query, one column per key":
            (b, h, m, n),
        f"{(b * h, n, m)} folds the heads into the batch; the weights keep a head axis": (b * h, n, m),
        f"{(b, n, e)} is the shape of the output, not of the weights": (b, n, e),
    })
