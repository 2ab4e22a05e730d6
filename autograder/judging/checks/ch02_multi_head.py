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
  - bias=True gives every projection a bias, bias=False none .............. test_mha_shapes
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
from collections.abc import Callable

import torch
from torch import Tensor

from attnkit import MultiHeadAttention as RefMHA
from attnkit import merge_heads as ref_merge
from attnkit import softmax as ref_softmax
from attnkit import split_heads as ref_split
from attnkit.torch_twins import to_torch_multihead
from autograder.judging.checks import (CheckFailed, StudentError, Suite, Trial, expect_close, expect_number, expect_pair,
                               expect_tensor, expect_tuple, mistakes)
from autograder.judging.checks.ch01_single_head import UNIFORM_ROWS

SUITE = Suite("02_multi_head")
# requirement -> the check that exercises it (the list above, in the order of the notebook)
STATED_REQUIREMENTS = {
    "split: head axis before the sequence axis": "test_split_heads",
    "split: contiguous feature blocks per head": "test_split_heads",
    "merge: inverse of split, heads in order": "test_merge_heads",
    "four nn.Linear(E, E) projections": "test_mha_shapes",
    "bias flag": "test_mha_shapes",
    "ValueError when E % H != 0": "test_mha_shapes",
    "per-head weights (B, H, n, m), n != m": "test_mha_shapes",
    "each projection on its own input": "test_mha_values",
    "scale 1/sqrt(head_dim)": "test_mha_values",
    "out_proj on the merged heads": "test_mha_values",
    "mask True means may attend": "test_mha_mask",
    "3-D mask applies to every head": "test_mha_mask",
    "4-D mask per head": "test_mha_mask",
    "fully masked row gives zeros": "test_mha_mask",
}
SPLIT, MERGE, MHA = "split_heads", "merge_heads", "MultiHeadAttention"

NO_TRANSPOSE_SPLIT = ("it reshapes to (B, H, n, Dh) without the transpose, which mixes positions into heads: "
                      "view as (B, n, H, Dh) first, then transpose(1, 2)")
INTERLEAVED_SPLIT = ("the heads are interleaved (head h gets features h, h + H, ...): view the last axis as "
                     "(H, Dh), not (Dh, H), so head h gets the contiguous block h*Dh:(h+1)*Dh")
NO_TRANSPOSE_MERGE = ("it reshapes (B, H, n, Dh) to (B, n, H*Dh) without the transpose, which mixes positions "
                      "into features: transpose(1, 2) back to (B, n, H, Dh) first, then reshape")
REVERSED_HEADS = ("the heads are concatenated in reverse order (head H-1 first): merge head h into features "
                  "h*Dh:(h+1)*Dh, in head order, with transpose(1, 2) then reshape")
NAN_ROWS = ("a query whose keys are all masked gets NaN: the softmax of a row of -inf is 0/0. The contract "
            "asks for zero weights there (so that row's output is out_proj of zeros): use the given "
            "scaled_dot_product_attention, or turn the NaN rows of your softmax into 0")
MASK_AXES = ("a (B, n, m) mask lines up with the wrong axes of the (B, H, n, m) scores: add a head axis with "
             "mask.unsqueeze(1) so the same mask applies to every head")


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


# -- MultiHeadAttention ---------------------------------------------------------------------------

Params = dict[str, Tensor]


def random_weights(t: Trial, e: int, bias: bool = True) -> Params:
    """Weights for a MultiHeadAttention(e, H), drawn from the trial (also loaded by chapters 03 and 04)."""
    p = {}
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        p[f"{name}.weight"] = t.randn(e, e, scale=1.0 / math.sqrt(e))
        if bias:
            p[f"{name}.bias"] = t.randn(e, scale=0.5)
    return p


def reference_module(p: Params, h: int) -> RefMHA:
    """attnkit's MultiHeadAttention holding the weights ``p``, in float64."""
    ref = RefMHA(p["q_proj.weight"].shape[0], h, bias="q_proj.bias" in p).double()
    ref.load_state_dict({k: v.double() for k, v in p.items()})
    return ref


def _lin(p: Params, name: str, x: Tensor) -> Tensor:
    y = x.double() @ p[f"{name}.weight"].double().T
    return y + p[f"{name}.bias"].double() if f"{name}.bias" in p else y


def _full(mask: Tensor, b: int, h: int, n: int, m: int) -> Tensor:
    """``mask`` broadcast to (B, H, n, m), a 3-D one applying to every head."""
    return (mask.unsqueeze(1) if mask.dim() == 3 else mask).expand(b, h, n, m)


def _heads(p: Params, qp: Tensor, kp: Tensor, vp: Tensor, h: int, mask: Tensor | None = None, *,
           scale: float | None = None, out_proj: bool = True,
           split: Callable[[Tensor, int], Tensor] = ref_split,
           merge: Callable[[Tensor], Tensor] = ref_merge) -> tuple[Tensor, Tensor]:
    """Multi-head attention from projected inputs, with switches that reproduce the layer's classic mistakes."""
    q, k, v = split(qp, h), split(kp, h), split(vp, h)  # (B, H, n|m, Dh)
    s = q @ k.transpose(-2, -1) / math.sqrt(scale or q.shape[-1])  # (B, H, n, m)
    if mask is not None:
        s = s.masked_fill(~(mask.unsqueeze(1) if mask.dim() == 3 else mask), float("-inf"))
    w = ref_softmax(s)
    o = merge(w @ v)  # (B, n, E)
    return (_lin(p, "out_proj", o) if out_proj else o), w


def reference(p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return _heads(p, _lin(p, "q_proj", q), _lin(p, "k_proj", k), _lin(p, "v_proj", v), h, mask)


def torch_reference(p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """torch.nn.MultiheadAttention with the same weights (its bool mask means 'may NOT attend')."""
    kw = {}
    if mask is not None:
        full = _full(mask, q.shape[0], h, q.shape[1], k.shape[1]).reshape(-1, q.shape[1], k.shape[1])
        kw["attn_mask"] = ~full  # ours: True = may attend; torch's: True = may not
    with torch.no_grad():
        out, w = to_torch_multihead(reference_module(p, h))(q.double(), k.double(), v.double(),
                                                            average_attn_weights=False, **kw)
    return out, w


def expected(p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The right (output, weights): torch's module, or the formula where some query has no allowed key
    (torch gives NaN there; the contract asks for zero weights, so that row's output is out_proj(0))."""
    if mask is not None and not bool(_full(mask, q.shape[0], h, q.shape[1], k.shape[1]).any(-1).all()):
        return reference(p, q, k, v, h, mask)
    return torch_reference(p, q, k, v, h, mask)


def head_mistakes(p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None) -> mistakes.Pairs:
    """message -> (output, weights) of the layer when every head makes one of attention's classic mistakes
    (unscaled scores, the mask ignored, inverted, applied after the softmax, filled with a finite number)."""
    e = q.shape[-1]
    heads = mistakes.wrong_attention(ref_split(_lin(p, "q_proj", q), h), ref_split(_lin(p, "k_proj", k), h),
                                     ref_split(_lin(p, "v_proj", v), h),
                                     None if mask is None else (mask.unsqueeze(1) if mask.dim() == 3 else mask))
    messages = {
        mistakes.MASK_IGNORED: "the mask is ignored: pass it to the attention of every head (True = may attend)",
        mistakes.MASK_INVERTED: "the mask polarity is inverted: True means 'may attend', so fill the scores where the "
                                "mask is False",
        mistakes.MASK_AFTER: "the mask is applied after the softmax: mask the scores with -inf before the softmax",
        mistakes.FINITE_FILL: UNIFORM_ROWS,
        **({mistakes.NOT_SCALED: f"the scores are not scaled: divide each head's Q K^T by sqrt(head_dim) = "
                                 f"sqrt({e // h})"} if e > h else {}),
    }
    return {msg: (_lin(p, "out_proj", ref_merge(o)), w) for msg, (o, w) in mistakes.named(heads, messages).items()}


def mha_mistakes(p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None) -> mistakes.Pairs:
    """message -> (output, weights) a classic mistake would produce on these inputs and weights."""
    e = q.shape[-1]
    Q, K, V = _lin(p, "q_proj", q), _lin(p, "k_proj", k), _lin(p, "v_proj", v)
    out: mistakes.Pairs = {}

    def bad_split(x: Tensor, heads: int) -> Tensor:
        return x.reshape(x.shape[0], heads, x.shape[1], x.shape[2] // heads)

    def interleaved(x: Tensor, heads: int) -> Tensor:
        return x.reshape(x.shape[0], x.shape[1], x.shape[2] // heads, heads).permute(0, 3, 1, 2)

    def bad_merge(x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])

    if h > 1:
        out[f"the scores are divided by sqrt(embed_dim) = sqrt({e}); each head is a {e // h}-wide attention, so "
            f"divide by sqrt(head_dim) = sqrt({e // h})"] = _heads(p, Q, K, V, h, mask, scale=e)
    out["the output projection out_proj is missing: apply it to the concatenated heads"] = _heads(
        p, Q, K, V, h, mask, out_proj=False)
    out |= head_mistakes(p, q, k, v, h, mask)
    if h > 1:
        out["splitting the heads: " + NO_TRANSPOSE_SPLIT] = _heads(p, Q, K, V, h, mask, split=bad_split)
        out["splitting the heads: " + INTERLEAVED_SPLIT] = _heads(p, Q, K, V, h, mask, split=interleaved)
        out["merging the heads: " + NO_TRANSPOSE_MERGE] = _heads(p, Q, K, V, h, mask, merge=bad_merge)
        out["merging the heads: " + REVERSED_HEADS] = _heads(p, Q, K, V, h, mask, merge=lambda x: ref_merge(x.flip(1)))
        out["the heads are split and merged with reshape but no transpose, which mixes positions into heads: "
            "view as (B, n, H, Dh), then transpose(1, 2)"] = _heads(p, Q, K, V, h, mask, split=bad_split, merge=bad_merge)
    wrong = "a projection is applied to the wrong input: "
    out[wrong + "k_proj and v_proj are swapped (keys must go through k_proj, values through v_proj)"] = _heads(
        p, Q, _lin(p, "v_proj", k), _lin(p, "k_proj", v), h, mask)
    out[wrong + "the key and value tensors are swapped (k_proj(value), v_proj(key)); keys are k_proj(key), "
        "values v_proj(value)"] = _heads(p, Q, _lin(p, "k_proj", v), _lin(p, "v_proj", k), h, mask)
    out[wrong + "the keys are projected with q_proj; use k_proj"] = _heads(p, Q, _lin(p, "q_proj", k), V, h, mask)
    out[wrong + "the values are projected with k_proj; use v_proj"] = _heads(p, Q, K, _lin(p, "k_proj", v), h, mask)
    out[wrong + "the values go through k_proj(key) instead of v_proj(value)"] = _heads(p, Q, K, K, h, mask)
    out[wrong + "the keys come from the value tensor (k_proj(value)); keys are k_proj(key)"] = _heads(
        p, Q, _lin(p, "k_proj", v), V, h, mask)
    out[wrong + "the values come from the key tensor (v_proj(key)); values are v_proj(value)"] = _heads(
        p, Q, K, _lin(p, "v_proj", k), h, mask)
    if q.shape == k.shape:
        out[wrong + "the keys come from the query tensor (k_proj(query)); keys are k_proj(key)"] = _heads(
            p, Q, _lin(p, "k_proj", q), V, h, mask)
        out[wrong + "the values come from the query tensor; values are v_proj(value)"] = _heads(
            p, Q, K, _lin(p, "v_proj", q), h, mask)
    if mask is not None and mask.dim() == 3 and mask.shape[0] == h:
        out[MASK_AXES] = _heads(p, Q, K, V, h, mask.unsqueeze(0))  # example b's mask lands on head b
    return out


def _module(t: Trial, e: int, h: int, bias: bool = True):
    try:
        obj = t.new(MHA, e, h) if bias else t.new(MHA, e, h, bias=False)
    except StudentError as err:
        raise CheckFailed(f"MultiHeadAttention({e}, {h}{'' if bias else ', bias=False'}) could not be created: {err}") from None
    p = random_weights(t, e, bias)
    obj.load(p)
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


def expect_layer(out, w, p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None, layer: str,
                 weights_name: str = "weights", also: mistakes.Pairs | None = None) -> None:
    """A layer's ``(out, w)`` must be MultiHeadAttention's with weights ``p`` on (q, k, v, mask): no NaN, shapes
    (B, n, E) and (B, H, n, m), then the values, naming the layer's classic mistakes and those in ``also``."""
    (b, n, e), m = q.shape, k.shape[1]
    if mask is not None:
        mistakes.expect_no_nan({weights_name: w, "output": out}, f" of {layer}", f": {NAN_ROWS}")
    expect_tensor(out, (b, n, e), f"the output of {layer}")
    expect_tensor(w, (b, h, n, m), f"the {weights_name} of {layer}")
    exp_out, exp_w = expected(p, q, k, v, h, mask)
    wrong = mha_mistakes(p, q, k, v, h, mask) | (also or {})
    expect_close(out, exp_out, f"the output of {layer}", mistakes.outputs(wrong))
    expect_close(w, exp_w, f"the {weights_name} of {layer}", mistakes.weights(wrong))


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
        raise CheckFailed("MultiHeadAttention(8, 2, bias=False) still has biases: pass bias=bias to every nn.Linear")
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
