"""Graded checks for exercise 02_multi_head (its requirements: ``STATED_REQUIREMENTS``; not stated, not graded: the
dtype and the device). The copied-weights twin: the expected answer and the classic mistakes are computed here from
the weights loaded into the student's module. test_mha_mask tests the mask alone: against the student's own unmasked
weights renormalised."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit import merge_heads as ref_merge
from attnkit import split_heads as ref_split
from autograder.judging.checks import (CheckFailed, StudentError, Suite, Trial, build, expect_close, expect_pair,
                                       expect_tensor, listed, mistakes, number, requirements, twin)
from autograder.judging.checks.common import (INTERLEAVED_SPLIT, MASK_AXES, NAN_ROWS, NO_TRANSPOSE_MERGE,
                                              NO_TRANSPOSE_SPLIT, REVERSED_HEADS, expect_layer, expect_layer_of, expect_masked,
                                              hidden_keys_changed, random_weights)

SUITE = Suite("02_multi_head")
_SPLIT, _MERGE = "test_split_heads", "test_merge_heads"
_SHAPES, _VALUES, _MASK = (f"test_mha_{c}" for c in ("shapes", "values", "mask"))
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'split: head axis before the sequence axis': (_SPLIT, 'transpose', '(b, n, h*dh) -> (b, h, n, dh)'),
    'split: contiguous feature blocks per head': (_SPLIT, 'interleaved', 'head h holds features h*dh:(h+1)*dh'),
    'merge: inverse of split, heads in order': (_MERGE, 'reverse order', 'the inverse, (b, h, n, dh) -> (b, n, h*dh)'),
    'four nn.Linear(E, E) projections': (_SHAPES, 'no out_proj', 'each nn.linear(e, e, bias=bias)', (_VALUES, _MASK)),
    'bias flag': (_SHAPES, 'still has biases', 'with bias=false none of the four has a bias'),
    'ValueError when E % H != 0': (_SHAPES, 'ValueError', 'raise a valueerror when embed_dim'),
    'per-head weights (B, H, n, m), n != m': (_SHAPES, 'per-head', 'per-head weights (b, h, n, m)', (_VALUES, _MASK)),
    'each projection on its own input': (_VALUES, 'wrong input', 'q_proj to query, k_proj to key'),
    'scale 1/sqrt(head_dim)': (_VALUES, 'sqrt(head_dim)', "1/\\sqrt{d_h} of one head's width"),
    'out_proj on the merged heads': (_VALUES, 'out_proj is missing', 'heads and apply out_proj'),
    'mask True means may attend': (_MASK, 'polarity', 'true means "may attend"'),
    '3-D mask applies to every head': (_MASK, 'unsqueeze(1)', '(b, n, m) applies to every head'),
    '4-D mask per head': (_MASK, '(B, H, n, m) per-head mask', 'mask is already (b, h, n, m)'),
    'fully masked row gives zeros': (_MASK, 'all masked gets NaN', 'zero weights in every head'),
})
SPLIT, MERGE, MHA = "split_heads", "merge_heads", "MultiHeadAttention"


SUITE.oracle(_SPLIT, SPLIT, "split_heads turns (B, n, H*Dh) into (B, H, n, Dh), head h holding features "
             "h*Dh:(h+1)*Dh.", cases=[(2, 3, 2, 4), (1, 5, 4, 2), (3, 4, 1, 3), (2, 1, 3, 2)],
             draw=lambda t, b, n, h, d: (t.randn(b, n, h * d), h), reference=ref_split,
             what=lambda x, h: f"split_heads of a {tuple(x.shape)} tensor into {h} heads",
             mistakes=lambda x, h: {"split_heads returned (B, n, H, Dh): move the head axis in front of the sequence "
                                    "axis with transpose(1, 2)": x.unflatten(-1, (h, -1)),
                                    NO_TRANSPOSE_SPLIT: x.reshape(x.shape[0], h, x.shape[1], -1),
                                    INTERLEAVED_SPLIT: x.unflatten(-1, (-1, h)).permute(0, 3, 1, 2)})
SUITE.oracle(_MERGE, MERGE, "merge_heads turns (B, H, n, Dh) back into (B, n, H*Dh) and undoes "
             "split_heads.", cases=[(2, 2, 3, 4), (1, 4, 5, 2), (3, 1, 4, 3), (2, 3, 1, 2)],
             draw=lambda t, *shape: (t.randn(*shape),), reference=ref_merge,
             what=lambda x: f"merge_heads of a {tuple(x.shape)} tensor",
             mistakes=lambda x: {"merge_heads returned (B, H, n*Dh): the result is (B, n, H*Dh), so transpose the head "
                                 "and sequence axes before reshaping": x.flatten(-2),
                                 NO_TRANSPOSE_MERGE: x.reshape(x.shape[0], x.shape[2], -1),
                                 **({REVERSED_HEADS: ref_merge(x.flip(1))} if x.shape[1] > 1 else {})})


def _module(t: Trial, e: int, h: int, bias: bool = True):
    """The copied-weights twin; a bias the flag should have removed is test_mha_shapes' to charge (once): here it
    is zeroed, so the values are judged on their own."""
    p = random_weights(t, e, bias)
    return twin(t, MHA, e, h, **({} if bias else {"bias": False}), reference=p)[0], p


def _shaped(obj, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None, what: str = ""):
    """The student's (output, weights) on these inputs: a pair, without NaN, of shapes (B, n, E) and (B, H, n, m)."""
    try:
        out, w = expect_pair(obj(*((q, k, v) if mask is None else (q, k, v, mask))), MHA)
    except StudentError as err:
        if mask is not None and mask.dim() == 3 and not err.placeholder:
            raise CheckFailed(f"{err}{what}. Hint: {MASK_AXES}") from None
        raise
    (b, n, e), m = q.shape, k.shape[1]
    if isinstance(w, Tensor) and tuple(w.shape) == (b, n, m):
        raise CheckFailed(f"the weights have shape {(b, n, m)}: return the per-head weights (B, H, n, m) = "
                          f"{(b, h, n, m)}, not their average")
    if mask is not None:
        mistakes.expect_no_nan({"per-head weights": w, "output": out}, f" of MultiHeadAttention{what}", f": {NAN_ROWS}")
    return expect_tensor(out, (b, n, e), f"the output of MultiHeadAttention{what}"), \
        expect_tensor(w, (b, h, n, m), f"the per-head weights of MultiHeadAttention{what}")


@SUITE.check(_SHAPES, parts=[MHA])
def mha_shapes(t: Trial) -> None:
    """q_proj, k_proj, v_proj, out_proj of shape (E, E); output (B, n, E), weights (B, H, n, m); E % H != 0 refused."""
    for e, h in [(8, 2), (12, 3)]:
        obj = build(t, MHA, e, h)
        params = obj.params()
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            if f"{name}.weight" not in params:
                raise CheckFailed(f"MultiHeadAttention has no {name} (an nn.Linear(embed_dim, embed_dim)); its "
                                  f"parameters are: {', '.join(params) or 'none'}")
            expect_tensor(params[f"{name}.weight"], (e, e), f"{name}.weight")
            if f"{name}.bias" not in params:
                raise CheckFailed(f"{name} has no bias: with bias=True (the default) every projection has one")
        _shaped(obj, t.randn(2, 3, e), t.randn(2, 5, e), t.randn(2, 5, e), h,
                what=f" with {h} heads for query (2, 3, {e}) and key/value (2, 5, {e})")
    params = t.new(MHA, 8, 2, bias=False).params()
    if biased := ", ".join(sorted({k.rpartition(".")[0] for k in params if k.endswith("bias")})):
        raise CheckFailed(f"MultiHeadAttention(8, 2, bias=False) still has biases ({biased}): all four projections, "
                          "out_proj included, are nn.Linear(E, E, bias=bias)")
    for e, h in [(10, 3), (6, 4)]:
        try:
            t.new(MHA, e, h)
        except StudentError as err:
            if err.placeholder:
                raise
            if not str(err).split(":")[0].endswith("ValueError"):  # "your code raised ValueError: ..."
                raise CheckFailed(f"MultiHeadAttention({e}, {h}) raised the wrong kind of error ({err}): the exercise "
                                  "asks for a ValueError when embed_dim is not divisible by num_heads (an assert "
                                  "raises AssertionError, and disappears under python -O)") from None
            continue
        raise CheckFailed(f"MultiHeadAttention({e}, {h}) should raise an error (a ValueError saying embed_dim must be "
                          f"divisible by num_heads): {e} features cannot be split evenly into {h} heads")


@SUITE.check(_VALUES, parts=[MHA])
def mha_values(t: Trial) -> None:
    """With copied weights, output and per-head weights equal torch.nn.MultiheadAttention (n != m, 1 to 4 heads)."""
    for b, n, m, e, h, bias in [(2, 4, 6, 8, 2, True), (1, 5, 3, 12, 3, True), (2, 3, 3, 8, 4, True),
                                (1, 4, 2, 6, 1, True), (2, 3, 4, 8, 2, False)]:
        obj, p = _module(t, e, h, bias)
        q, k = t.randn(b, n, e), t.randn(b, m, e)
        v = t.randn(b, m, e) if bias else k  # without biases: key and value are one tensor
        what = f" (E={e}, H={h}, n={n}, m={m})" if bias else " with bias=False"
        out, w = _shaped(obj, q, k, v, h, what=what)
        expect_layer(out, w, p, q, k, v, h, None, f"MultiHeadAttention{what}", "per-head weights")


@SUITE.check(_MASK, parts=[MHA])
def mha_mask(t: Trial) -> None:
    """A mask (True = may attend) of shape (n, m) or (B, n, m) applies to every head, a (B, H, n, m) one to each."""
    b, n, m, e, h = 2, 4, 5, 8, 2
    obj, p = _module(t, e, h)
    q, k, v = t.randn(b, n, e), t.randn(b, m, e), t.randn(b, m, e)
    padding, per_head = torch.ones(b, 1, m, dtype=torch.bool), t.rand_mask(b, h, n, m, p=0.5)
    empty = torch.ones(b, 1, m, dtype=torch.bool)
    padding[1, 0, 3:] = False
    per_head[..., 1] = True
    empty[1] = False  # example 1 is a sequence of length 0: none of its queries has a key to attend to
    out0, w0 = _shaped(obj, q, k, v, h, what=" without a mask")
    expect_layer_of(out0, w0, p, q, k, v, h, "MultiHeadAttention without a mask")  # the anchor of the relative checks
    for mask, what in [(t.rand_mask(n, m, p=0.6), " with an (n, m) mask"),
                       (t.rand_mask(b, n, m, p=0.6), " with a (B, n, m) mask"),
                       (padding, " with a (B, 1, m) padding mask"), (per_head, " with a (B, H, n, m) per-head mask"),
                       (empty, " with a (B, 1, m) mask that hides every key of example 1")]:
        if mask.dim() == 2 or mask.shape[1] > 1 and mask.dim() == 3:
            mask[..., 0], mask[..., -1] = True, False
        out, w = _shaped(obj, q, k, v, h, mask, what)
        full = (mask.unsqueeze(1) if mask.dim() == 3 else mask).expand_as(w)
        wrong = {MASK_AXES: mask.unsqueeze(0).expand_as(w)} if mask.dim() == 3 and mask.shape[0] == h else {}
        expect_masked(w, w0, full, f"the per-head weights of MultiHeadAttention{what}", wrong)
        if (changed := hidden_keys_changed(v, full)) is not None:
            expect_close(_shaped(obj, q, k, changed, h, mask, what)[0], out, f"the output of MultiHeadAttention{what} "
                         "when only the values of masked keys change (a key no query may see must not reach it)")


# -- conceptual questions (the inputs are in the question; the answer is a value) ----------------------
B, N, M, E, H = 4, 10, 7, 512, 8  # q_split_shape: x (4, 10, 96) into 8 heads; q_head_scale, q_mha_params: (512, 8)
PER = E * E + E  # one nn.Linear(E, E) with its bias
SPLIT_E, WB, WN, WE, WH = 96, 2, 5, 64, 4  # q_weights_shape: MHA(64, 4) on query (2, 5, 64), key (2, 7, 64)

SUITE.questions({
    "q_split_shape": listed((B, H, N, SPLIT_E // H), "The shape of split_heads(x, 8) for x of shape (4, 10, 96).", {
        f"{(B, N, H, SPLIT_E // H)} = (B, n, H, Dh) is the view before the transpose: split_heads moves the head "
        "axis in front of the sequence axis": (B, N, H, SPLIT_E // H),
        f"{(B, H, N, SPLIT_E)} gives every head all E = {SPLIT_E} features; the heads share them out, E / H each":
            (B, H, N, SPLIT_E),
        f"{(B, SPLIT_E // H, N, H)} swaps the number of heads and their width: the second argument of split_heads is "
        "the number of heads": (B, SPLIT_E // H, N, H),
        f"{(B * H, N, SPLIT_E // H)} folds the heads into the batch (as some libraries do); split_heads keeps a head "
        "axis: (B, H, n, Dh)": (B * H, N, SPLIT_E // H)}),
    "q_head_scale": number(math.sqrt(E // H), "The number each head's scores are divided by, for embed_dim 512 and 8 "
                           "heads.", {
        f"sqrt(embed_dim) = sqrt({E}) uses the full width; each head's queries and keys have only "
        "head_dim = embed_dim / num_heads features": math.sqrt(E),
        f"{E // H} is head_dim itself; the scale is the square root of the width": float(E // H),
        f"{E} is embed_dim: the scale is a square root, and of one head's width": float(E),
        f"sqrt({H}) uses the number of heads; the scale depends on the width of one head": math.sqrt(H)}, rel=2e-3),
    "q_mha_params": number(4 * PER, "The number of parameters of MultiHeadAttention(512, 8) with biases.", {
        f"{4 * E * E} leaves out the four bias vectors (bias=True)": 4 * E * E,
        f"{3 * PER} counts q_proj, k_proj and v_proj but not out_proj": 3 * PER,
        f"{3 * H * PER + PER} gives every head its own (E, E) projections; the heads share one (E, E) "
        "projection per role, each head using E / H of its output features": 3 * H * PER + PER,
        f"{3 * H * E * E + E * E} gives every head its own (E, E) projections (and leaves out the biases)":
            3 * H * E * E + E * E,
        f"{4 * (E * (E // H) + E // H)} counts one head's (E, Dh) projections; the layer has H of them per role":
            4 * (E * (E // H) + E // H)}, rel=0, abs_tol=0.5),
    "q_weights_shape": listed((WB, WH, WN, M), "The shape of the weights MultiHeadAttention(64, 4) returns for query "
                              "(2, 5, 64) and key/value (2, 7, 64).", {
        f"{(WB, WN, M)} is the weights averaged over the heads (what nn.MultiheadAttention returns by default); "
        "the exercise returns every head's weights": (WB, WN, M),
        f"{(WB, WH, WN, WE // WH)} is the shape of the heads' outputs before merging, not of the weights":
            (WB, WH, WN, WE // WH),
        f"{(WB, WH, M, WN)} has one row per key; the weights have one row per query, one column per key":
            (WB, WH, M, WN),
        f"{(WB * WH, WN, M)} folds the heads into the batch; the weights keep a head axis": (WB * WH, WN, M),
        f"{(WB, WN, WE)} is the shape of the output, not of the weights": (WB, WN, WE)}),
})
