"""Graded checks for exercise 04_masked_attention (requirements: ``STATED_REQUIREMENTS``; not graded: the dtype,
and the device of padding_mask's result). test_masked_attention tests the formula; the checks through the setup's
``MultiHeadAttention`` and ``SelfAttention`` (weights drawn here; causality by perturbing future inputs and by
gradients, with the student's own causal mask) compare at the student's own scale (``common.scaled_reference``) or
with the student's own rows, anchored to attention of the inputs at the student's own scale (issue 34), so an unscaled
attention costs test_masked_attention alone.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit import causal_mask as ref_causal
from attnkit import padding_mask as ref_padding
from attnkit import scaled_dot_product_attention as ref_attention
from attnkit import softmax as ref_softmax
from autograder.judging.checks import (CheckFailed, StudentError, Suite, Trial, choice, close, expect_close,
                                       expect_pair, expect_tensor, explained, fail_if_named, listed, mistakes,
                                       named_mistake, number, requirements, row_set, twin)
from autograder.judging.checks.common import (ATTENTION_MISTAKES, UNIFORM_ROWS, expect_attention_of, expect_distributions,
                                              head_mistakes, random_weights, scaled_reference)

SUITE = Suite("04_masked_attention")
_CAUSAL_CHECK, _PADDING_CHECK, _VALUES = "test_causal_mask", "test_padding_mask", "test_masked_attention"
_FULLY_MASKED, _MHA, _CAUSALITY = "test_masked_attention_fully_masked", "test_masked_mha", "test_causality"
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'causal: bool': (_CAUSAL_CHECK, 'bool', '(n, n) bool mask', (_CAUSALITY,)),
    'causal: on and below the diagonal': (_CAUSAL_CHECK, 'diagonal is hidden', 'true on and below the diagonal',
        (_CAUSALITY,)),
    'causal: device honoured': (_CAUSAL_CHECK, 'device argument is ignored', 'bool tensor on device'),
    'padding: (B, 1, max_len)': (_PADDING_CHECK, '(B, 1, max_len)', 'a bool (b, 1, max_len) mask'),
    'padding: True at the real tokens': (_PADDING_CHECK, 'off by one', 'positions 0..lengths[b]-1'),
    'attention: scaled scores': (_VALUES, 'not scaled', 's = q k^t / sqrt(d_k)'),
    'attention: -inf before the softmax, True = may attend': (_VALUES, 'after the softmax',
        'replaced by -inf before the softmax', (_MHA, _CAUSALITY)),
    'attention: rows are queries': (_VALUES, 'transposed', '(output (..., n, d_v), weights (..., n, m))',
        (_FULLY_MASKED, _MHA, _CAUSALITY)),
    'attention: n != m, d_v != d_k, broadcast masks': (_VALUES, 'must broadcast',
        'mask bool broadcastable to (..., n, m)', (_MHA,)),
    'attention: any leading dimensions': (_MHA, 'leading dimensions', 'any number of leading dimensions',
        (_CAUSALITY,)),
    'attention: fully masked row gives zeros': (_FULLY_MASKED, 'NaN', 'zero weights and a zero output row', (_MHA,)),
    'causality end to end': (_CAUSALITY, 'future', 'changing a later input must not change', (_CAUSAL_CHECK,)),
})
CAUSAL, PADDING, MASKED = "causal_mask", "padding_mask", "masked_attention"

INVERTED = "the mask is inverted: True must mean 'may attend'"
STRICT = ("off by one: the diagonal is hidden (a strictly lower triangle, tril(diagonal=-1)): position i may attend "
          "to itself, so the mask is True on and below the diagonal (tril with diagonal=0)")
SEES_NEXT = ("off by one: the mask also lets each position see the next (future) position i+1 (tril(diagonal=1)); "
             "query i may only see keys 0..i, so use tril with diagonal=0")
NAN_ROWS = ("a query whose keys are all masked gives NaN: the softmax of a row of -inf is 0/0. The contract asks for "
            "zero weights and a zero output row (for example torch.nan_to_num, or divide only where the sum is positive)")


def expect_bool_mask(value, shape: tuple[int, ...], what: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise CheckFailed(f"{what} should be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != torch.bool:
        raise CheckFailed(f"{what} has dtype {value.dtype}: return a bool tensor (True = may attend), for example "
                          "with .bool() or a comparison")
    if tuple(value.shape) != shape:
        raise CheckFailed(f"{what} has shape {tuple(value.shape)}, expected {shape}")
    return value


def expect_mask(got, expected: Tensor, what: str, known: dict[str, Tensor]) -> None:
    """``got`` must be the bool mask ``expected``; else the ``known`` mistake (message -> mask) it is, or where not."""
    if isinstance(got, Tensor) and tuple(got.shape) != tuple(expected.shape) and got.dim() and got.shape[0] != 1:
        fail_if_named(got.bool(), known, what, torch.equal)  # False for masks of different shapes
    actual = expect_bool_mask(got, tuple(expected.shape), what)
    if torch.equal(actual, expected):
        return
    fail_if_named(actual, known, what, torch.equal)
    bad = (actual != expected).nonzero()[0].tolist()
    raise CheckFailed(f"mistake in {what} at index {tuple(bad)}: got {bool(actual[tuple(bad)])}, "
                      f"expected {bool(expected[tuple(bad)])}")


# -- masks -----------------------------------------------------------------------------------------


def _causal_mistakes(n: int) -> dict[str, Tensor]:
    ones = torch.ones(n, n, dtype=torch.bool)
    return {
        INVERTED + " (query i may see keys 0..i): yours is True above the diagonal, where attention is "
                   "forbidden": ~ones.tril(),
        STRICT: ones.tril(-1),
        SEES_NEXT: ones.tril(1),
        "the triangle is the upper one, so query i sees the future keys i..n-1: query i (row i) may see keys "
        "0..i (columns), so use tril, not triu": ones.triu(),
        "the mask is all True: nothing is hidden": ones,
    }


@SUITE.check(_CAUSAL_CHECK, parts=[CAUSAL])
def causal_mask_check(t: Trial) -> None:
    """causal_mask(n) is a bool (n, n) tensor, True on and below the diagonal."""
    for n in (5, 2, 1, 8):  # n=5 first: for n=1 several mistakes coincide
        expect_mask(t.call(CAUSAL, n) if n != 5 else t.call(CAUSAL, n, device="cpu"), ref_causal(n),
                    f"causal_mask({n})", _causal_mistakes(n))
    # "a torch.bool tensor on device": ask for the meta device (every machine has it, it holds no data) and read
    # the tensor's type name in the student's process; a mask that comes back on the CPU ignored the argument.
    try:
        kind = t.new(CAUSAL, 3, device="meta").method("type")
    except StudentError as err:
        if "unexpected keyword" in str(err) or "positional argument" in str(err):
            raise CheckFailed(f"causal_mask(3, device='meta') failed ({err}): causal_mask takes a device argument, "
                              "causal_mask(n, device=None)") from None
        return  # this construction does not run on the meta device, so the device cannot be read back this way
    if isinstance(kind, str) and ".meta." not in kind:
        raise CheckFailed(f"causal_mask(3, device='meta') returned a {kind}, not a tensor on the meta device: the "
                          "device argument is ignored. Create the mask on it (torch.ones(n, n, dtype=torch.bool, "
                          "device=device)), so a model on the GPU gets its mask there")


def _padding_mistakes(lengths: Tensor, max_len: int) -> dict[str, Tensor]:
    pos, real = torch.arange(max_len), ref_padding(lengths, max_len)
    return {
        "the mask has shape (B, max_len): add a query axis, (B, 1, max_len), so the mask broadcasts over the "
        "queries of each example (mask[:, None, :])": real[:, 0],
        "the mask has shape (B, max_len, 1): the singleton axis goes in the middle, (B, 1, max_len), so that the "
        "mask hides keys (columns), not queries": real.transpose(1, 2),
        "off by one: a sequence of length L has real tokens at positions 0..L-1, so use position < L, "
        "not position <= L": (pos <= lengths[:, None])[:, None],
        "off by one: a sequence of length L has real tokens at positions 0..L-1 (all L of them), "
        "so use position < L, not position < L - 1": (pos < lengths[:, None] - 1)[:, None],
        INVERTED + ": it is True at the padding": (pos >= lengths[:, None])[:, None]}


SUITE.oracle(_PADDING_CHECK, PADDING, "padding_mask(lengths, max_len) is a bool (B, 1, max_len) tensor, True at "
             "the first lengths[b] positions.", cases=[([3, 1, 4], 5), ([2, 2], 2), ([0, 3, 1, 2], 3)],
             draw=lambda t, lengths, max_len: (torch.tensor(lengths, dtype=torch.int64), max_len),
             reference=ref_padding, mistakes=_padding_mistakes, compare=expect_mask,
             what=lambda lengths, max_len: f"padding_mask(lengths={lengths.tolist()}, max_len={max_len})")


# -- masked attention ----------------------------------------------------------------------------


def _against_reference(t: Trial, q, k, v, mask, what: str):
    """(output, weights) of the student's masked attention, without NaN and of the right shapes, then the reference's."""
    out, w = expect_pair(t.call(MASKED, q, k, v, mask), MASKED)
    exp_out, exp_w = ref_attention(q, k, v, mask)
    mistakes.expect_no_nan({"weights": w, "output": out}, f" of {what}", f": {NAN_ROWS}")
    expect_tensor(w, tuple(exp_w.shape), f"the weights of {what}")
    expect_tensor(out, tuple(exp_out.shape), f"the output of {what}")
    return out, w, exp_out, exp_w


# the classic mistakes of attention (checks/mistakes.py) in this chapter's words, then chapter 01's for the rest
MISTAKES = {
    mistakes.MASK_AFTER: "the mask is applied after the softmax, so the remaining weights no longer sum to 1: fill "
                         "the masked scores with -inf before the softmax",
    mistakes.MASK_INVERTED: INVERTED + ", so fill the scores where the mask is False",
    mistakes.MASK_IGNORED: "the mask is ignored: fill the scores where the mask is False with -inf",
    mistakes.NOT_SCALED: "the scores are not scaled: divide Q K^T by sqrt(d_k) before masking",
    mistakes.FINITE_FILL: UNIFORM_ROWS,
}
MISTAKES |= {key: message for key, message in ATTENTION_MISTAKES.items() if key not in MISTAKES}


@SUITE.check(_VALUES, parts=[MASKED])
def masked_attention_check(t: Trial) -> None:
    """masked_attention equals torch's masked scaled_dot_product_attention for (n, m), causal and (B, 1, m) masks."""
    b, n, m, d = 2, 5, 6, 4
    q, k, v = t.randn(b, n, d), t.randn(b, m, d), t.randn(b, m, d + 2)
    random_mask = t.rand_mask(n, m, p=0.6)
    random_mask[:, 0] = True
    # the causal mask first: a square one shows a transposed mask
    for (qq, mask, what) in [(t.randn(b, 6, d), ref_causal(6), "attention with a causal mask"),
                             (q, random_mask, "attention with an (n, m) mask"),
                             (q, ref_padding(torch.tensor([6, 3]), m), "attention with a (B, 1, m) padding mask")]:
        with explained(lambda err: f"{err} ({what}: query {tuple(qq.shape)}, key {tuple(k.shape)}, value "
                       f"{tuple(v.shape)}, mask {tuple(mask.shape)}). The mask must broadcast against the "
                       "scores (..., n, m) as it is, and n, m, d_k and d_v may all differ"):
            out, w, exp_out, exp_w = _against_reference(t, qq, k, v, mask, what)
        full = mask.expand_as(w)
        if bool((w.masked_select(~full).abs() > 1e-6).any()):  # a masked key has weight: name how it leaks
            scores = qq @ k.transpose(-2, -1) / math.sqrt(d)
            leaks = {"the mask is ignored: fill the scores where the mask is False with -inf before the softmax":
                     ref_softmax(scores)}
            if mask.shape[-1] == mask.shape[-2]:
                leaks["the mask is used transposed: mask[..., i, j] says whether query i (row) may see key j (column), "
                      "the same layout as the scores"] = ref_softmax(scores.masked_fill(~mask.mT, float("-inf")))
            why = named_mistake(w, leaks, lambda a, b: close(a, b, atol=1e-4, rtol=1e-5))
            if bool((w.masked_select(full).abs() < 1e-9).all()):
                why = f"{INVERTED}, so the keys where the mask is False must get weight 0"
            raise CheckFailed(f"{what}: " + (why or "masked keys (mask False) get non-zero weight: fill their scores "
                                             "with -inf before the softmax"))
        wrong = mistakes.named(mistakes.wrong_attention(qq, k, v, mask), MISTAKES)
        expect_close(w, exp_w, f"the weights of {what}", mistakes.weights(wrong))
        expect_close(out, F.scaled_dot_product_attention(qq, k, v, attn_mask=mask), f"the output of {what}",
                     mistakes.outputs(wrong))


@SUITE.check(_FULLY_MASKED, parts=[MASKED])
def fully_masked_check(t: Trial) -> None:
    """A query row with every key masked gives zero weights and a zero output row, never NaN; the other rows are unchanged."""
    q, k, v = t.randn(2, 4, 3), t.randn(2, 5, 3), t.randn(2, 5, 2)
    mask = torch.ones(2, 4, 5, dtype=torch.bool)
    mask[0, 1] = False  # one fully masked row
    mask[1] = False  # a whole example masked (a sequence of length 0)
    out, w, _, _ = _against_reference(t, q, k, v, mask, "attention with fully masked rows")
    empty = ~mask.any(-1)  # (B, n)
    expect_close(w[empty], torch.zeros(int(empty.sum()), 5), "the weights of the fully masked rows (they should be "
                 "all zero)", {UNIFORM_ROWS: torch.full((int(empty.sum()), 5), 0.2)})
    expect_close(out[empty], torch.zeros(int(empty.sum()), 2), "the output of the fully masked rows (they should be all zero)")
    rest = torch.tensor([0, 2, 3])
    expect_distributions(w[:1, rest], "the weights of the other rows")
    out2, w2, _, _ = _against_reference(t, q[:1, rest], k[:1], v[:1], mask[:1, rest], "attention on the other rows")
    # the anchor (issue 34): the other rows are compared with the student's own answer on them alone, which an answer
    # that ignores q and k (uniform weights) or computes no output satisfies; it must first be attention of its inputs
    expect_attention_of(q[:1, rest], k[:1], v[:1], out2, w2, "attention on the other rows", allowed=mask[:1, rest])
    expect_close(w[:1, rest], w2, "the weights of the other rows (a fully masked row must not change them)")
    expect_close(out[:1, rest], out2, "the output of the other rows (a fully masked row must not change them)")


@SUITE.check(_MHA, parts=[MASKED])
def masked_mha_check(t: Trial) -> None:
    """Through the given MultiHeadAttention: causal & padding masks for a batch of unequal lengths, length 0 included."""
    b, n, e, h = 3, 5, 8, 2
    p = random_weights(t, e)
    obj, _ = twin(t, "MultiHeadAttention", e, h, reference=p, hint=" (the given MultiHeadAttention: was the setup "
                  "cell changed?)")
    x = t.randn(b, n, e)
    mask = ref_causal(n) & ref_padding(torch.tensor([5, 2, 0]), n)  # (B, n, n)
    with explained(lambda err: f"{err}. The given MultiHeadAttention calls masked_attention with 4-D inputs "
                   "(B, H, n, Dh) and a (B, 1, n, m) mask: it must work for any number of leading "
                   "dimensions (use transpose(-2, -1) and @, not bmm or transpose(1, 2))"):
        out, w = expect_pair(obj(x, x, x, mask), "MultiHeadAttention")
    what = "MultiHeadAttention with a causal & padding mask"
    mistakes.expect_no_nan({"weights": w, "output": out}, f" of {what}",
                           f" (the example of length 0 has no key to attend to): {NAN_ROWS}")
    w = expect_tensor(w, (b, h, n, n), f"the per-head weights of {what}")
    (exp_out, exp_w), wrong = scaled_reference(p, x, x, x, h, mask, w), _mask_mistakes(p, x, h, mask)
    expect_close(w, exp_w, f"the per-head weights of {what}", mistakes.weights(wrong))
    expect_close(out, exp_out, f"the output of {what}", mistakes.outputs(wrong))


def _mask_mistakes(p: dict[str, Tensor], x: Tensor, h: int, mask: Tensor) -> mistakes.Pairs:
    """Chapter 02's layer with attention's classic mistakes in every head (``common.head_mistakes``), on x alone."""
    return {f"masked_attention: {msg}": pair for msg, pair in head_mistakes(p, x, x, x, h, mask).items()}


@SUITE.check(_CAUSALITY, parts=[CAUSAL, MASKED])
def causality_check(t: Trial) -> None:
    """With your causal_mask, SelfAttention's output i ignores inputs j > i: perturbing them changes nothing, their gradient is 0."""
    n, e, h = 6, 8, 2
    mask = expect_bool_mask(t.call(CAUSAL, n), (n, n), f"causal_mask({n})")
    p = random_weights(t, e)
    obj, _ = twin(t, "SelfAttention", e, h, reference=p, names=lambda k: f"attn.{k}")
    x = t.randn(1, n, e)
    out, w = expect_pair(obj(x, mask), "SelfAttention")
    expect_tensor(out, (1, n, e), "the output of SelfAttention with your causal mask")
    for i in (0, 2, 4):
        x2 = x.clone()
        x2[:, i + 1:] += t.randn(1, n - i - 1, e)
        out2, _ = expect_pair(obj(x2, mask), "SelfAttention")
        expect_tensor(out2, (1, n, e), "the output of SelfAttention")
        if not torch.allclose(out2[:, : i + 1], out[:, : i + 1], atol=1e-5):
            if bool(mask.triu(1).any()):
                named = named_mistake(mask, _causal_mistakes(n), torch.equal)
                raise CheckFailed(f"changing inputs after position {i} changes output {i}: the model sees the future. "
                                  + (f"Your causal mask is wrong: {named}" if named else
                                     "Your causal mask is True above the diagonal, where attention is forbidden: "
                                     "query i may only see keys 0..i"))
            because = named_mistake(out.double(), mistakes.outputs(_mask_mistakes(p, x, h, mask)),
                                    lambda a, b: torch.allclose(a, b, atol=1e-4))
            raise CheckFailed(f"changing inputs after position {i} changes output {i}" + (
                f", because {because}" if because else ": masked attention leaks the future (mask the scores with "
                "-inf before the softmax)"))
        probe = torch.zeros(1, n, e)
        probe[0, i] = t.randn(e)
        g = expect_tensor(t.grad(obj, x, mask, wrt=0, probe=probe), (1, n, e), "the gradient")
        if bool((g[0, i + 1:].abs() > 1e-7).any()):
            raise CheckFailed(f"the gradient of output {i} with respect to a later input is not zero: output {i} "
                              "depends on the future")
    exp_out, _ = scaled_reference(p, x, x, x, h, ref_causal(n), expect_tensor(w, (1, h, n, n), "the weights"))
    wrong = mistakes.outputs(_mask_mistakes(p, x, h, ref_causal(n)))
    wrong[STRICT] = scaled_reference(p, x, x, x, h, ref_causal(n).tril(-1), w)[0]
    expect_close(out, exp_out, "the output of causal self-attention", wrong)


# -- conceptual questions (the inputs are in the question; the answer is a value) ----------------------
SEEN = (ref_causal(6) & ref_padding(torch.tensor([4]), 6))[0].sum(-1)  # q_keys_seen: causal_mask(6) & padding([4], 6)
# q_mask_pattern: the four patterns of the question (rows = queries, columns = keys, 1 = may attend)
PATTERNS = {"a": ["1000", "1100", "1110", "1111"], "b": ["1000", "1100", "1110", "1110"],
            "c": ["1000", "1100", "1110", "0000"], "d": ["1110", "1110", "1110", "1110"]}
PATTERN = next(k for k, rows in PATTERNS.items()  # the one causal_mask(4) & padding_mask(tensor([3]), 4) draws
               if ["".join(str(int(b)) for b in r) for r in (ref_causal(4) & ref_padding(torch.tensor([3]), 4))[0]] == rows)
# q_nan_step: the steps of a plain softmax, e = exp(s); w = e / e.sum(); out = w @ V, on a row of three -inf
NAN_STEPS = {"a": "e = exp(s), the exponentials of the -inf scores", "b": "w = e / e.sum(), dividing by the sum",
             "c": "w @ V, multiplying the weights by the values"}

SUITE.questions({
    "q_keys_seen": listed(tuple(int(c) for c in SEEN), "How many keys each query sees under causal_mask(6) & "
                          "padding_mask([4], 6).", {
        "(1, 2, 3, 4, 5, 6) ignores the padding mask: keys 4 and 5 are padding, hidden from every query":
            (1, 2, 3, 4, 5, 6),
        "(4, 4, 4, 4, 4, 4) ignores the causal mask: query i may not see the keys after i": (4,) * 6,
        "(1, 2, 3, 4, 0, 0) hides the padding *queries*; the padding mask (B, 1, max_len) hides keys (columns), "
        "so a padding query still sees the real keys up to its position": (1, 2, 3, 4, 0, 0),
        "(0, 1, 2, 3, 3, 3) hides the diagonal: under the causal mask a query sees its own position too":
            (0, 1, 2, 3, 3, 3)}),
    "q_mask_pattern": choice(PATTERN, "Which of four drawn patterns causal_mask(4) & padding_mask(tensor([3]), 4) "
                             "produces.", PATTERNS, {
        "a": "pattern a is the causal mask alone: the padding mask also hides key 3 (the padding) from every query",
        "c": "pattern c hides query 3 (a row); the padding mask has shape (B, 1, max_len), so it hides the padding "
             "key (a column) from every query",
        "d": "pattern d is the padding mask alone: the causal mask also hides the keys after each query"}),
    "q_finite_fill_weight": number(1 / 4, "The weight of each of 4 keys in a row where all are masked with a finite "
                                   "fill (-1e9) instead of -inf.", {
        "NaN is what a fill of -inf gives (0/0); -1e9 is a finite number, and the softmax of equal finite scores "
        "is well defined": math.nan,
        "0 is what the contract asks for, but a finite fill does not give it: the softmax only sees four equal "
        "scores, so it cannot tell that every key is hidden": 0.0,
        "1 would put all the weight on one key; the four scores are equal": 1.0}),
    "q_nan_step": choice("b", "Which step of a plain softmax first produces NaN on a fully masked row (all scores "
                         "-inf).", NAN_STEPS, {
        "a": "exp(-inf) is exactly 0.0, a valid number: nothing is wrong yet after the exponential",
        "c": "the NaN is already in the weights before they meet V; the product only spreads it to the output"}),
    "q_causal_swap": listed((2, 3), "Which rows of causal self-attention's output are new values after positions 2 "
                            "and 3 of the input swap.", {
        "() is the answer without a mask (the outputs are only reordered): the causal mask breaks that "
        "symmetry, because output i sees only positions 0..i": (),
        "(0, 1, 2, 3) says every row changes, but outputs 0 and 1 see only positions 0 and 1, which did not "
        "move": (0, 1, 2, 3),
        "(0, 1) lists the rows that stay the same: they see only positions 0 and 1": (0, 1),
        "(3,) is incomplete: check every row whose query, or whose visible prefix of the input, changed": (3,),
        "(2,) is incomplete: check every row whose query, or whose visible prefix of the input, changed": (2,)},
        prepare=row_set),
})
