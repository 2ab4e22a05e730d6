"""Graded checks for exercise 05_cross_attention: ``CrossAttention`` over a given ``MultiHeadAttention``,
``source_padding_mask`` (per-example lengths -> a (B, m) mask), the decoder's cross-attention sublayer and four
questions. The mask checks compare with the student's own unmasked weights renormalised (``common.expect_masked``),
so a wrong source of keys or a missing residual costs the value checks alone. Not graded: source_padding_mask's
device (the judge runs the code on the CPU; the visible test checks it on a GPU).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnkit import CrossAttention as RefCrossAttention
from autograder.judging.checks import (CheckFailed, Obj, Suite, Trial, choice, draw_weights, expect_close, expect_pair,
                                       expect_tensor, expect_value_error, explained, fail_if_named, listed, mistakes,
                                       number, requirements, twin)
from autograder.judging.checks.common import expect_layer_of, expect_masked, hidden_keys_changed

SUITE = Suite("05_cross_attention")
_SHAPES, _VALUES, _MASK, _PROPS = (f"test_cross_attention_{c}" for c in ("shapes", "values", "mask", "properties"))
_SOURCE, _ERRORS = "test_source_padding_mask", "test_source_padding_mask_errors"
_SUBLAYER, _PADDING = "test_decoder_cross_attention", "test_decoder_cross_attention_padding"
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'CrossAttention holds self.attn': (_SHAPES, 'self.attn', 'one attribute attn', (_VALUES, _MASK, _PROPS)),
    'n and m unrelated': (_MASK, 'different lengths', 'assume that x and context have the same length'),
    'keys and values from the context': (_VALUES, 'taken from x', 'second sequence context', (_SHAPES, _MASK, _PROPS)),
    'context_mask on the keys axis': (_MASK, 'wrong axis', 'along the keys axis'),
    'context_mask True = real token': (_MASK, 'polarity', 'true marks the real context tokens'),
    'fully padded context: zero weights, no NaN': (_MASK, 'all padding', 'must be zeros, not nan'),
    'source mask: True at the first lengths[b]': (_SOURCE, 'j <= length', 'positions 0 .. lengths[b] - 1', (_ERRORS,)),
    'source mask: True marks real tokens': (_SOURCE, 'true marks padding', 'and false after (the padding)', (_ERRORS,)),
    'source mask: length 0 is all False': (_SOURCE, 'length 0', 'a length of 0 (an empty source)', (_ERRORS,)),
    'source mask: shape (B, m)': (_SOURCE, '(B, m)', 'mask that crossattention takes', (_ERRORS,)),
    'source mask: bool dtype': (_SOURCE, 'bool', 'returns the bool (b, m) mask'),
    'source mask: ValueError for bad lengths': (_ERRORS, 'should raise a ValueError', 'above m cannot describe'),
    'source mask: ValueError, not another exception': (_ERRORS, 'IndexError', 'raise a valueerror that says so'),
    'sublayer: norm and cross attributes': (_SUBLAYER, 'self.norm', 'holds self.norm = nn.layernorm', (_PADDING,)),
    'sublayer: the residual': (_SUBLAYER, 'residual is missing', 'adds the result back'),
    'sublayer: only x is normalised': (_SUBLAYER, 'memory is normalised', 'only x is normalised here'),
    'sublayer: pre-norm': (_SUBLAYER, 'post-norm', 'in a pre-norm decoder block'),
    'sublayer: memory_lengths hide padding': (_PADDING, 'memory_lengths is ignored', 'memory positions are real'),
    'sublayer: empty source, no NaN': (_PADDING, 'all padding', 'an empty source gets zero weights'),
})
CROSS, SOURCE_MASK, DECODER = "CrossAttention", "source_padding_mask", "DecoderCrossAttention"
N_EQUALS_M = ("something uses x's length n where the context length m belongs (a reshape, an expand or a mask "
              "built with x.shape[1]); the two sequences may have different lengths")
WRONG_AXIS = ("the context mask lies on the wrong axis: padding hides keys, so a (B, m) mask becomes (B, 1, m) "
              "(context_mask[:, None, :]), not (B, m, 1), which would hide queries")
FULLY_PADDED = ("an example whose context is all padding (context_mask all False) must give zero weights and no NaN: "
                "a softmax over a row of -inf is 0/0; replace those NaN by zeros (torch.nan_to_num, or where)")


def _module(t: Trial, e: int, h: int) -> tuple[Obj, RefCrossAttention]:
    """The student's module and the reference holding the same weights."""
    ref = RefCrossAttention(e, h)
    return twin(t, CROSS, e, h, reference=ref, exact=True, hint=": CrossAttention should hold exactly one "
                "MultiHeadAttention(embed_dim, num_heads) as self.attn (parameters attn.q_proj.weight, ...)")[0], ref


def _mistakes(ref: RefCrossAttention, x: Tensor, ctx: Tensor) -> mistakes.Pairs:
    """(output, weights) of the classic wrong answers that can be computed for these shapes."""
    a = ref.attn
    wrong = {"the keys are taken from x: keys and values must both come from the context (attn(x, context, context))":
             a(x, x, ctx),
             "the values are taken from x: keys and values must both come from the context": a(x, ctx, x),
             "the queries come from the context and the keys from x: the queries come from x, "
             "attn(query=x, key=context, value=context)": a(ctx, x, x)} if x.shape[1] == ctx.shape[1] else {}
    return wrong | {
        "the context is ignored: this is self-attention of x. The keys and values come from the context": a(x, x, x)}


def _answer(obj: Obj, part: str, x: Tensor, ctx: Tensor, h: int, what: str, *mask: Tensor, nan: str = "") -> tuple:
    """``part``'s (output, weights) for (x, ctx[, mask]), of shapes (B, n, E) and (B, H, n, m) (with ``nan``: first
    no NaN, else that message), naming the shapes that mix up n and m."""
    (b, n, e), m = x.shape, ctx.shape[1]
    out, w = expect_pair(obj(x, ctx, *mask), part)
    if nan:
        mistakes.expect_no_nan({"output": out, "weights": w}, what, nan)
    if n != m and isinstance(out, Tensor) and tuple(out.shape) == (b, m, e):
        raise CheckFailed(f"the output{what} has one row per context token, shape {(b, m, e)}: the queries come from x, "
                          f"so the output has one row per position of x, {(b, n, e)}")
    if n != m and isinstance(w, Tensor) and tuple(w.shape) == (b, h, n, n):
        raise CheckFailed(f"the weights{what} have shape {(b, h, n, n)}, one column per position of x: the keys come "
                          f"from x, but keys and values must come from the context, giving {(b, h, n, m)}")
    expect_tensor(out, (b, n, e), f"the output{what}")
    expect_tensor(w, (b, h, n, m), f"the weights{what}")
    return out, w


def _compare(obj: Obj, ref: RefCrossAttention, x: Tensor, ctx: Tensor) -> None:
    what = f" for x {tuple(x.shape)} and context {tuple(ctx.shape)}"
    out, w = _answer(obj, CROSS, x, ctx, ref.attn.num_heads, what)
    with torch.no_grad():
        (exp_out, exp_w), wrong = ref(x, ctx), _mistakes(ref, x, ctx)
    expect_close(out, exp_out, f"the output{what}", mistakes.outputs(wrong))
    expect_close(w, exp_w, f"the weights{what}", mistakes.weights(wrong))


def _with_unequal_lengths(fn: Callable, hint: str = "keys and values must both come from the context; " + N_EQUALS_M):
    """``fn()``; an error that only happens when n != m says so."""
    with explained(lambda err: f"{str(err).rstrip('.')}, when x and context have different lengths: {hint}"):
        return fn()


@SUITE.check(_SHAPES, parts=[CROSS])
def cross_attention_shapes(t: Trial) -> None:
    """Output (B, n, E) and weights (B, H, n, m) for n == m, n < m and n > m; the module holds self.attn."""
    obj, _ = _module(t, 8, 2)
    out, w = expect_pair(obj(t.randn(2, 4, 8), t.randn(2, 4, 8)), CROSS)
    expect_tensor(out, (2, 4, 8), "the output for x and context of shape (2, 4, 8)")
    for n, m in [(3, 6), (7, 2)]:
        _with_unequal_lengths(lambda: _answer(obj, CROSS, t.randn(2, n, 8), t.randn(2, m, 8), 2,
                                              f" for x (2, {n}, 8) and context (2, {m}, 8)"),
                              "the keys and values must come from the context (and the queries from x); "
                              + N_EQUALS_M)


@SUITE.check(_VALUES, parts=[CROSS])
def cross_attention_values(t: Trial) -> None:
    """With copied weights, equals attention with queries from x and keys and values from the context."""
    obj, ref = _module(t, 8, 2)
    _compare(obj, ref, t.randn(2, 5, 8), t.randn(2, 5, 8))  # n == m: every mix-up is computable and named
    for b, n, m, e, h in [(2, 3, 6, 8, 2), (1, 6, 2, 12, 3), (3, 1, 4, 8, 4)]:
        obj, ref = _module(t, e, h)
        x, ctx = t.randn(b, n, e), t.randn(b, m, e)
        _with_unequal_lengths(lambda: _compare(obj, ref, x, ctx))


def _expect_mask_property(obj: Obj, ref: nn.Module, part: str, x: Tensor, ctx: Tensor, keep: Tensor, what: str,
                          name: str = "the context mask", given: Callable = lambda keep: keep) -> None:
    """``part``'s answer for (x, ctx) with the mask ``given(keep)`` hides the keys ``keep`` (B, m) marks False: its
    weights are its own unmasked weights renormalised on the real tokens, no NaN, and a padded token's content never
    reaches the output."""
    out0, w0 = _answer(obj, part, x, ctx, 2, what + " without the mask")
    _anchor(part, ref, x, ctx, out0, w0, f"the answer{what} without the mask")
    out, w = _answer(obj, part, x, ctx, 2, what, given(keep), nan=f": {FULLY_PADDED}")
    full = keep[:, None, None, :].expand_as(w)
    wrong = {WRONG_AXIS: keep[:, None, :, None].expand_as(w)} if x.shape[1] == ctx.shape[1] else {}
    expect_masked(w, w0, full, f"the weights{what}", wrong, name)
    if (changed := hidden_keys_changed(ctx, full)) is not None:
        expect_close(expect_pair(obj(x, changed, given(keep)), part)[0], out, f"the output{what} when only padded "
                     "context tokens change (a padded token must not reach the output)")


@SUITE.check(_MASK, parts=[CROSS])
def cross_attention_mask(t: Trial) -> None:
    """A (B, m) context mask hides padded context tokens from every query (n == m and n != m); a fully padded
    example gives zero weights and no NaN."""
    obj, ref = _module(t, 8, 2)
    for b, n, m, empty in [(3, 5, 5, False), (2, 3, 6, False), (3, 7, 4, False), (2, 3, 4, True)]:
        x, ctx, keep = t.randn(b, n, 8), t.randn(b, m, 8), t.rand_mask(b, m, p=0.6)
        keep[:, 0], keep[0, -1] = True, False  # every example has a real context token, and one has a padded one
        keep[0] &= not empty  # the last case's example 0: nothing but padding
        what = f" for x {(b, n, 8)} and context {(b, m, 8)}" + (" whose example 0 is all padding" if empty else
                                                                " with a context mask")
        _with_unequal_lengths(lambda: _expect_mask_property(obj, ref, CROSS, x, ctx, keep, what),
                              WRONG_AXIS + "; or " + N_EQUALS_M)


@SUITE.check(_PROPS, parts=[CROSS])
def cross_attention_properties(t: Trial) -> None:
    """Reordering the context changes nothing; output row i depends on x row i only (no mask: the mask has its own check)."""
    obj, ref = _module(t, 8, 4)
    x, ctx = t.randn(2, 4, 8), t.randn(2, 6, 8)
    out, w = _with_unequal_lengths(lambda: _answer(obj, CROSS, x, ctx, 4, " for x (2, 4, 8) and context (2, 6, 8)"))
    _anchor(CROSS, ref, x, ctx, out, w, "the answer for x (2, 4, 8) and context (2, 6, 8)")
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


# -- source_padding_mask: per-example source lengths -> a (B, m) context mask ----------------------------


def _ref_source_mask(lengths: Tensor, m: int) -> Tensor:
    return torch.arange(m)[None, :] < lengths[:, None]  # (B, m)


@SUITE.check(_SOURCE, parts=[SOURCE_MASK])
def source_padding_mask_check(t: Trial) -> None:
    """source_padding_mask(lengths, m) is a bool (B, m) tensor, True at the first lengths[b] positions;
    a length of 0 gives a row of False."""
    cases = [[3, 1, 4], [2, 2], [0, 3, 1, 2], [t.randint(0, 6, ()).item(), 6, 0]]
    for lengths, m in zip(cases, (5, 2, 3, 6)):
        lt = torch.tensor(lengths, dtype=torch.int64)
        what = f"source_padding_mask(lengths={lengths}, m={m})"
        got = t.call(SOURCE_MASK, lt, m)
        if not isinstance(got, Tensor):
            raise CheckFailed(f"{what} should return a torch.Tensor, got {type(got).__name__}")
        if tuple(got.shape) == (len(lengths), 1, m):
            raise CheckFailed(f"{what} has shape {tuple(got.shape)}: that is chapter 04's (B, 1, m) padding mask; "
                              f"return the per-token mask (B, m) = {(len(lengths), m)}; CrossAttention adds the query axis")
        if got.dtype != torch.bool:
            raise CheckFailed(f"{what} has dtype {got.dtype}: return a bool tensor (True = a real source token), "
                              "for example from a comparison")
        if tuple(got.shape) != (len(lengths), m):
            raise CheckFailed(f"{what} has shape {tuple(got.shape)}, expected (B, m) = {(len(lengths), m)}")
        exp = _ref_source_mask(lt, m)
        if torch.equal(got, exp):
            continue
        fail_if_named(got, {
            "True marks padding here; True must mark the real source tokens (the ones that may be attended to)": ~exp,
            "one position too many is True (j <= length instead of j < length): positions 0 .. length-1 are real":
                torch.arange(m)[None, :] <= lt[:, None],
            "a source of length 0 must give a row of False (nothing to attend to), not one real token":
                torch.arange(m)[None, :] < lt.clamp(min=1)[:, None]}, what, torch.equal)
        raise CheckFailed(f"mistake in {what}: row b should be True at positions 0 .. lengths[b] - 1 and False after")


@SUITE.check(_ERRORS, parts=[SOURCE_MASK])
def source_padding_mask_errors(t: Trial) -> None:
    """A length longer than m or negative raises a ValueError (it cannot describe a source of m positions)."""
    expect_value_error(lambda: t.call(SOURCE_MASK, torch.tensor([2, 5]), 4), "source_padding_mask(lengths=[2, 5], m=4)",
                       "A length above m means the source does not fit in m positions: check lengths <= m")
    expect_value_error(lambda: t.call(SOURCE_MASK, torch.tensor([-1, 2]), 4), "source_padding_mask(lengths=[-1, 2], m=4)",
                       "A negative length is no length: check lengths >= 0")
    got = t.call(SOURCE_MASK, torch.tensor([4, 0]), 4)  # the bounds themselves are fine
    if not (isinstance(got, Tensor) and torch.equal(got, _ref_source_mask(torch.tensor([4, 0]), 4))):
        raise CheckFailed("source_padding_mask(lengths=[4, 0], m=4) should work: 0 and m are valid lengths")


# -- DecoderCrossAttention: the decoder block's cross-attention sublayer ---------------------------------


def _decoder(t: Trial, e: int, h: int) -> tuple[Obj, nn.ModuleDict]:
    """The student's sublayer and the reference's norm and cross (attnkit's CrossAttention) holding the same weights,
    the LayerNorm's weight drawn around 1."""
    ref = nn.ModuleDict({"norm": nn.LayerNorm(e), "cross": RefCrossAttention(e, h)})
    return twin(t, DECODER, e, h, reference=ref, exact=True, hint=": DecoderCrossAttention should hold "
                "self.norm = nn.LayerNorm(embed_dim) and self.cross = CrossAttention(embed_dim, num_heads)",
                draw=lambda t, s: {k: w + float(k == "norm.weight") for k, w in draw_weights(t, s).items()})[0], ref


def _sublayer_answers(ref: nn.ModuleDict, x: Tensor, mem: Tensor) -> tuple[Tensor, Tensor, mistakes.Pairs]:
    """The reference sublayer's cross-attention (output, weights) on (norm(x), memory), and its classic mistakes."""
    with torch.no_grad():
        (att, exp_w), (both, both_w), (post, post_w) = (ref.cross(ref.norm(x), mem),  # the reference: x + att
                                                        ref.cross(ref.norm(x), ref.norm(mem)), ref.cross(x, mem))
        return att, exp_w, {
            "the residual is missing: the sublayer returns x + cross-attention(norm(x), memory)": (att, exp_w),
            "the memory is normalised too: in a pre-norm decoder the sublayer's norm applies to x (the queries) "
            "only; the encoder already normalised its output": (x + both, both_w),
            "this is post-norm (norm(x + attention(x))): the exercise asks for pre-norm, x + attention(norm(x))":
                (ref.norm(x + post), post_w)}


def _params(ref: RefCrossAttention) -> dict[str, Tensor]:
    return {name: w.detach() for name, w in ref.attn.state_dict().items()}


def _anchor(part: str, ref: nn.Module, x: Tensor, ctx: Tensor, out: Tensor, w: Tensor, what: str) -> None:
    """The anchor of the checks that compare ``part`` with itself (issue 34): its unmasked answer on (x, ctx) is the
    reference's at the student's own scale, or a classic mistake a value check names."""
    h = w.shape[1] if isinstance(w, Tensor) and w.dim() == 4 else 1
    if part == CROSS:
        with torch.no_grad():
            wrong = {m: (o.detach(), ww.detach()) for m, (o, ww) in _mistakes(ref, x, ctx).items()}
        return expect_layer_of(out, w, _params(ref), x, ctx, ctx, h, what, wrong)
    _, _, wrong = _sublayer_answers(ref, x, ctx)  # the sublayer: x + its cross-attention of (norm(x), memory)
    with torch.no_grad():
        nx = ref.norm(x).detach()
    shifted = {m: (o.detach() - x, ww.detach()) for m, (o, ww) in wrong.items()}
    expect_layer_of(out - x if isinstance(out, Tensor) else out, w, _params(ref.cross), nx, ctx, ctx, h, what, shifted)


@SUITE.check(_SUBLAYER, parts=[DECODER])
def decoder_cross_attention(t: Trial) -> None:
    """With copied weights, equals x + attnkit's CrossAttention(norm(x), memory) (pre-norm), for n != m."""
    for b, n, m, e, h in [(2, 3, 5, 8, 2), (1, 6, 2, 12, 3)]:
        obj, ref = _decoder(t, e, h)
        x, mem = t.randn(b, n, e), t.randn(b, m, e)
        what = f" for x {(b, n, e)} and memory {(b, m, e)}"
        out, w = expect_pair(obj(x, mem), DECODER)
        expect_tensor(out, (b, n, e), f"the output{what}")
        expect_tensor(w, (b, h, n, m), f"the weights{what}")
        att, exp_w, wrong = _sublayer_answers(ref, x, mem)
        expect_close(w, exp_w, f"the weights{what}", mistakes.weights(wrong))
        expect_close(out, x + att, f"the output{what}", mistakes.outputs(wrong))


@SUITE.check(_PADDING, parts=[DECODER])
def decoder_cross_attention_padding(t: Trial) -> None:
    """memory_lengths hide each example's padded source positions; an empty source (length 0) gives zero weights
    and no NaN (its queries read nothing)."""
    obj, ref = _decoder(t, 8, 2)
    for lengths, n, m in [([4, 2, 1], 3, 4), ([0, 5], 2, 5)]:
        x, mem = t.randn(len(lengths), n, 8), t.randn(len(lengths), m, 8)
        what = f" for memory_lengths={lengths}, x {(len(lengths), n, 8)} and memory {(len(lengths), m, 8)}"
        _expect_mask_property(obj, ref, DECODER, x, mem, _ref_source_mask(torch.tensor(lengths), m), what, "memory_lengths",
                              given=lambda keep: keep.sum(-1))  # the lengths of the prefix mask


# -- conceptual questions ------------------------------------------------------------------------------
E2, E3 = math.exp(2), math.exp(3)  # q_padded_weight: scores (2, 0, 3), token 2 is padding

SUITE.questions({
    "q_cross_weights_shape": listed((2, 4, 5, 7), "Shape of the cross-attention weights for B=2, H=4, a target of n=5 "
                                    "and a source of m=7 tokens.", {
        "rows and columns are swapped: one row per query (a target position), one column per key (a source token)":
            (2, 4, 7, 5),
        "that is the self-attention shape of the decoder: in cross-attention the keys come from the source (m)":
            (2, 4, 5, 5),
        "the heads are missing: each of the H heads has its own weights, (B, H, n, m)": (2, 5, 7),
        "that is the encoder's self-attention shape (source attending to source)": (2, 4, 7, 7)}),
    "q_keys_from": choice("encoder", "Which side supplies the keys (and values) of the decoder's cross-attention.",
                          ["encoder", "decoder"], {
        "decoder": "the decoder supplies the queries (what it is looking for); the keys and values come from the "
                   "encoder's output, the sentence being read"}),
    "q_output_shape": listed((2, 5, 16), "Shape of the cross-attention output for B=2, n=5 target tokens, m=7 source "
                             "tokens, E=16.", {
        "one row per source token: the output has one row per query, that is per target position (n)": (2, 7, 16),
        "that is the weights' shape without heads: the output is a weighted sum of E-wide values": (2, 5, 7),
        "the heads are not merged: the output projection returns (B, n, E)": (2, 4, 5, 4)}),
    "q_padded_weight": number(E2 / (E2 + 1), "The weight of source token 0 for scores (2, 0, 3) when token 2 is "
                              "padding.", {
        "that is the weight with the padded token attended to: padding gets score -inf, so it drops out of the "
        "softmax's sum": E2 / (E2 + 1 + E3),
        "the mask's polarity is inverted: token 0 is real, so it keeps its weight": 0.0,
        "the masked score was set to 0 instead of -inf: exp(0) = 1 still counts in the sum": E2 / (E2 + 2),
        "the scores were normalised without the exponential (2 / (2 + 0))": 1.0}),
})
