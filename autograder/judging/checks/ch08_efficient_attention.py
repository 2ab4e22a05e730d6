"""Graded checks for exercise 08_efficient_attention (requirements: ``STATED_REQUIREMENTS``). The update checks fold
a block into a realistic state and name the classic mistakes computed from the same inputs; the cache checks compare
with causal attention over the whole sequence; tiled_attention's causal and mask checks compare each row with the
student's own tiled_attention over the keys it may see (a wrong scale costs test_tiled_attention alone), after the
answer is anchored to the reference (a row that sees every key is the attention of its inputs, issue 34).
"Do not call the setup's attention" is part of the tiled part's rule, not read from a size (issue 34): the part's
process refuses torch's softmax and logsumexp (its vocabulary's run-time words), and the setup's attention
computes with torch's softmax, so calling it, on inputs of any size, is refused (inlining the score matrix is left
to the formgrader).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit import causal_mask as ref_causal
from attnkit import scaled_dot_product_attention as ref_attention
from attnkit.efficient import append_to_cache as ref_append
from attnkit.efficient import online_softmax_update as ref_update
from attnkit.efficient import tiled_attention as ref_tiled
from autograder.judging.checks import (CheckFailed, Question, StudentError, Suite, Trial, close, expect_close,
                                       expect_number, expect_tensor, fail_if_named, number, requirements)

SUITE = Suite("08_efficient_attention")
_UPDATE_BASIC, _UPDATE_BLOCKS, _UPDATE_MASKED = ("test_online_softmax_basic", "test_online_softmax_blocks",
                                                "test_online_softmax_masked")
_APPEND, _CACHED_STEP, _CACHED_PROMPT = ("test_append_to_cache", "test_cached_attention_step",
                                         "test_cached_attention_prompt")
_TILED_VALUES, _TILED_CAUSAL, _TILED_MASK = ("test_tiled_attention", "test_tiled_attention_causal",
                                             "test_tiled_attention_mask")
_GQA_VALUES, _GQA_MASK, _GQA_HEADS = ("test_grouped_query_attention", "test_grouped_query_attention_mask",
                                      "test_grouped_query_attention_heads")
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'update: rescale the sum and the accumulator': ((_UPDATE_BASIC, _UPDATE_BLOCKS), 'accumulator is not rescaled',
        "a' = e^{m - m'}\\, a", (_UPDATE_MASKED,)),
    'update: new maximum': ((_UPDATE_BASIC, _UPDATE_BLOCKS), 'not updated', "m' = \\max(m, \\max_j s_j)",
        (_UPDATE_MASKED,)),
    'update: -inf rows stay (-inf, 0, 0)': (_UPDATE_MASKED, '-inf', 'state must stay (-inf, 0, 0)'),
    "update: keeps the inputs' dtype": (_UPDATE_BLOCKS, "keep the inputs' dtype", 'in the dtype of the inputs'),
    'tiled: accumulator rescaled (through the update)': (_TILED_VALUES, 'accumulator is not rescaled',
        'with your online_softmax_update', (_TILED_MASK,)),
    'tiled: scaled by 1/sqrt(d_k)': (_TILED_VALUES, 'not scaled', '\\mathrm{softmax}(qk^\\top/\\sqrt{d_k})'),
    'tiled: divide by the running sum': (_TILED_VALUES, 'accumulator itself', 'return acc / running_sum'),
    'tiled: every block, the last shorter one too': (_TILED_VALUES, 'last, shorter block', 'the last block is shorter',
        (_TILED_CAUSAL, _TILED_MASK)),
    "tiled: keeps the inputs' dtype": (_TILED_VALUES, "keep the inputs' dtype", "in the inputs' dtype"),
    'tiled: causal includes the diagonal': (_TILED_CAUSAL, 'itself included', 'keys 0 .. i, itself included'),
    'tiled: causal hides the next key': (_TILED_CAUSAL, 'one step in its future', 'hidden from query i when j > i'),
    'tiled: causal uses positions in the sequence': (_TILED_CAUSAL, 'whole sequence', 'key j of the sequence'),
    'tiled: mask hides keys': (_TILED_MASK, 'mask is ignored', 'give the masked keys of each block the score -\\infty'),
    'tiled: mask True = may attend': (_TILED_MASK, 'polarity', 'true = may attend'),
    'tiled: no allowed key gives zeros, not NaN': (_TILED_MASK, '0 / 0', 'no allowed key at all gets a row of zeros'),
    "tiled: does not call the setup's attention": (
        (_TILED_VALUES, _TILED_CAUSAL, _TILED_MASK), "setup's attention", 'so do not call attention from it'),
    'gqa: ValueError when G does not divide H': (_GQA_HEADS, 'check is missing', 'when g does not divide h'),
    'gqa: the ValueError names H and G': (_GQA_HEADS, 'name both numbers', 'message names both numbers'),
    'gqa: every G that divides H works': (_GQA_HEADS, 'reversed', 'every g that divides h', (_GQA_VALUES, _GQA_MASK)),
    'gqa: query head h uses key-value head h // (H / G)': ((_GQA_VALUES, _GQA_MASK), 'interleaved instead of grouped',
        'r = h / g consecutive heads'),
    'gqa: every query head keeps its own query': (_GQA_VALUES, 'averaged', 'keeps the h query heads', (_GQA_MASK,)),
    'gqa: mask hides keys': (_GQA_MASK, 'mask is ignored', 'mask (optional): bool, broadcastable to (b, h, n, m)'),
    'gqa: mask True = may attend': (_GQA_MASK, 'polarity', 'broadcastable to (b, h, n, m), true = may attend'),
    'gqa: a query with no allowed key gives zeros': (_GQA_MASK, 'NaN', 'no allowed key gets a row of zeros'),
    "gqa: keeps the inputs' dtype": (_GQA_VALUES, "keep the inputs' dtype", "the output keeps the inputs' dtype"),
    'cache: time axis': (_APPEND, 'wrong axis', 'appended along the time axis (after the old ones)'),
    'cached: causal shifted by t': ((_CACHED_PROMPT, _CACHED_STEP), 'aligned to the start',
        'lower triangle shifted right by t'),
})
UPDATE, APPEND, CACHED, TILED = "online_softmax_update", "append_to_cache", "cached_attention", "tiled_attention"
# The tiled loop is the online softmax written out: its vocabulary (attnkit.vocabulary, printed in the exercise) leaves
# out every name with softmax or logsumexp in it and the setup's attention; at run time the part's process refuses aten's
# softmax and logsumexp operators, so the setup's attention, which uses torch's softmax, cannot stand in for the loop on
# chunks of any size, and rebinding MAX_SCORES changes nothing.

NO_RESCALE_SUM = ("the running sum is not rescaled when the maximum grows: multiply the old running_sum by "
                  "exp(running_max - new_max) before adding the block's exponentials")
NO_RESCALE_ACC = ("the accumulator is not rescaled when the maximum grows: multiply the old acc by "
                  "exp(running_max - new_max) before adding the block's exp(scores - new_max) @ values")
NO_RESCALE = ("neither the running sum nor the accumulator is rescaled when the maximum grows: multiply both by "
              "exp(running_max - new_max)")
STALE_MAX = ("the running max is not updated: return the new maximum max(running_max, scores.max(-1)), not the "
             "old one")
BLOCK_MAX = ("the running max is the block's maximum only: it must be the maximum over every block so far, "
             "torch.maximum(running_max, scores.amax(-1, keepdim=True))")
INVERTED = ("the rescaling factor is inverted: the old terms are relative to the old maximum M, so they are "
            "multiplied by exp(M - M') <= 1, not exp(M' - M)")
NAN_ROWS = ("a row whose scores are all -inf so far gives NaN (exp(-inf - (-inf))): where the new maximum is -inf, "
            "subtract 0 instead, so the row keeps running_max = -inf, running_sum = 0, acc = 0")
WRONG_AXIS = ("the cache grew along the wrong axis: keys and values are (B, H, t, d) and new positions are "
              "appended on the time axis, dim=-2 (dim=2)")
NEW_FIRST = "the new positions are put before the cached ones: append them at the end, torch.cat([cache, new], dim=-2)"
NOT_SELF = ("the new position does not attend to itself: append its key and value to the cache first, then attend "
            "over all t + s positions")
FUTURE = ("the prompt's positions attend to the future: with s > 1 new positions, position t + i may only see "
          "positions 0..t + i, a lower triangle shifted right by t (tril(t) on an (s, t + s) mask)")
TOP_LEFT = ("the causal mask is aligned to the start of the cache: new position t + i must see the whole cache and "
            "the new positions up to itself, so shift the triangle right by t: tril(diagonal=t) on (s, t + s)")
EITHER = ("position 1 attends to position 0 only: either the new position does not attend to itself (append its key "
          "and value before attending) or the causal mask is aligned to the start of the cache (shift the triangle "
          "right by t: tril(diagonal=t) on (s, t + s))")
OLD_CACHE = "the returned cache does not hold the new positions: return the extended (keys, values)"
TWICE = ("the new positions are appended twice, so each appears twice in the keys and values: append them once "
         "(torch.cat([cache, new], dim=-2) in append_to_cache, and one call of append_to_cache in cached_attention)")

State = tuple[Tensor, Tensor, Tensor]
STATE = ("running_max", "running_sum", "acc")


# -- the online softmax ------------------------------------------------------------------------------


def _finite(x: Tensor) -> Tensor:
    """-inf as a large negative number, so that maxima compare with ``close``."""
    return x.to(torch.float64).clamp_min(-1e30)


def _start(lead: tuple[int, ...], n: int, d_v: int, dtype: torch.dtype = torch.float64) -> State:
    """The state before any block: (-inf, 0, 0)."""
    return (torch.full((*lead, n, 1), -math.inf, dtype=dtype), torch.zeros(*lead, n, 1, dtype=dtype),
            torch.zeros(*lead, n, d_v, dtype=dtype))


def _update(m: Tensor, l: Tensor, acc: Tensor, s: Tensor, v: Tensor, kind: str = "") -> State:
    """The update, or the one the classic mistake ``kind`` computes: the maximum it returns, the maximum its
    exponentials are relative to, and the factors of the old sum and accumulator."""
    block = s.amax(-1, keepdim=True)
    new = torch.maximum(m, block)
    first = torch.where(m.isfinite(), m, new)  # the first block's maximum, kept for every later block
    top = {"stale max": m, "old max": m, "block max": block, "first max": first}.get(kind, new)
    base = {"old max": m, "block max": block, "first max": first}.get(kind, new)
    shift = torch.where(base.isfinite(), base, torch.zeros_like(base))
    r, p = torch.exp(m - shift), torch.exp(s - shift)
    r_sum, r_acc = {"no rescale": (1, 1), "no rescale sum": (1, r), "no rescale acc": (r, 1), "old max": (1, 1),
                    "inverted": (1 / r, 1 / r)}.get(kind, (r, r))
    return top, r_sum * l + p.sum(-1, keepdim=True), r_acc * acc + p @ v


def _updated(t: Trial, inputs: list[Tensor], what: str) -> State:
    """The student's update of ``inputs`` (running_max, running_sum, acc, scores, values): a state shaped as the one
    it updated, without NaN (a NaN where the scores are -inf is the classic -inf - (-inf))."""
    value = t.call(UPDATE, *inputs)
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise CheckFailed(f"{what} should return a tuple (running_max, running_sum, acc), got "
                          f"{type(value).__name__}" + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else ""))
    for name, x, old in zip(STATE, value, inputs):
        if not isinstance(x, Tensor):
            raise CheckFailed(f"{what}: {name} should be a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != tuple(old.shape):
            raise CheckFailed(f"{what}: {name} has shape {tuple(x.shape)}, expected {tuple(old.shape)}")
        if torch.isnan(x).any():
            raise CheckFailed(f"mistake in {what}: {NAN_ROWS}" if inputs[3].isinf().any() else
                              f"{what}: {name} contains NaN")
    return tuple(value)


def _expect_update(got: State, inputs: list[Tensor], what: str) -> State:
    """``got``, the student's update of ``inputs`` (running_max, running_sum, acc, scores, values; float64), must be
    the reference's (returned); else the classic mistake it is, or the part that differs."""
    def same(a: State, b: State) -> bool:
        return all(close(_finite(x), _finite(y)) for x, y in zip(a, b))

    expected = ref_update(*inputs)
    if not same(got, expected):
        fail_if_named(got, [(message, _update(*inputs, kind)) for message, kind in [
            (NO_RESCALE, "no rescale"), (NO_RESCALE_SUM, "no rescale sum"), (NO_RESCALE_ACC, "no rescale acc"),
            (STALE_MAX, "stale max"), (STALE_MAX, "old max"), (BLOCK_MAX, "block max"), (INVERTED, "inverted")]],
            what, same)
    for name, x, y in zip(STATE, got, expected):
        expect_close(_finite(x), _finite(y), f"{what}: {name}")
    return expected


def _prior_state(t: Trial, lead: tuple[int, ...], n: int, d_v: int, blocks: int) -> State:
    """The reference state after ``blocks`` random blocks of keys (scores of scale 2), in float32."""
    state = _start(lead, n, d_v)
    for _ in range(blocks):
        state = ref_update(*state, t.randn(*lead, n, 3, scale=2.0).double(), t.randn(*lead, 3, d_v).double())
    return tuple(x.float() for x in state)


@SUITE.check(_UPDATE_BASIC, parts=[UPDATE])
def update_one_block(t: Trial) -> None:
    """One update from a realistic state: new maximum, rescaled sum and accumulator; maxima that grow and that do not."""
    for lead, n, b, d_v in [((), 4, 3, 2), ((2,), 3, 5, 4), ((2, 3), 2, 1, 3)]:
        state = _prior_state(t, lead, n, d_v, blocks=2)
        scores = t.randn(*lead, n, b, scale=2.0)
        scores[..., 0, :] += 6.0  # row 0: the maximum grows
        scores[..., -1, :] -= 8.0  # last row: the maximum stays
        inputs = [*state, scores, t.randn(*lead, b, d_v)]
        what = f"online_softmax_update with a {tuple(scores.shape)} block of scores"
        _expect_update(_updated(t, inputs, what), [x.double() for x in inputs], what)


@SUITE.check(_UPDATE_BLOCKS, parts=[UPDATE])
def update_chain(t: Trial) -> None:
    """Fed block by block through the student's update, acc / running_sum equals softmax attention (float32 and float64)."""
    for dtype, (n, m, d, d_v, block) in [(torch.float32, (5, 13, 4, 3, 4)), (torch.float64, (3, 9, 2, 5, 2)),
                                         (torch.float32, (2, 7, 3, 2, 7))]:
        q, k, v = t.randn(2, n, d, dtype=dtype), t.randn(2, m, d, dtype=dtype, scale=2.0), t.randn(2, m, d_v, dtype=dtype)
        expected, _ = ref_attention(q.double(), k.double(), v.double())
        state, ref_state, qs = _start((2,), n, d_v, dtype), _start((2,), n, d_v), q / math.sqrt(d)
        for j in range(0, m, block):
            scores, vals = qs @ k[:, j:j + block].transpose(-2, -1), v[:, j:j + block]
            what = f"online_softmax_update at keys {j}..{min(m, j + block) - 1} of {m} ({dtype})"
            state = _updated(t, [*state, scores, vals], what)
            if state[0].dtype != dtype:
                raise CheckFailed(f"{what}: returned {state[0].dtype} for {dtype} inputs; keep the inputs' dtype")
            ref_state = _expect_update(state, [*ref_state, scores.double(), vals.double()], what)
        out = state[2].double() / state[1].double()
        if not close(out, expected, atol=1e-4 if dtype == torch.float32 else 1e-9):
            raise CheckFailed("acc / running_sum after the last block differs from softmax attention")


@SUITE.check(_UPDATE_MASKED, parts=[UPDATE])
def update_masked(t: Trial) -> None:
    """-inf scores (masked keys): no NaN; a row with nothing allowed yet keeps (-inf, 0, 0); a later block recovers it."""
    n, d_v = 4, 3
    m, l, a = _prior_state(t, (), n, d_v, blocks=1)
    m[1:3], l[1:3], a[1:3] = -math.inf, 0.0, 0.0  # rows 1 and 2: every key so far was masked
    scores = t.randn(n, 3, scale=2.0)
    scores[0, 1] = scores[2] = scores[3] = -math.inf  # row 2 stays empty; row 3 has a fully masked block
    inputs, what = [m, l, a, scores, t.randn(3, d_v)], "online_softmax_update with masked (-inf) scores"
    got = _updated(t, inputs, what)
    if not (got[0][2].item() == -math.inf and got[1][2].item() == 0 and torch.all(got[2][2] == 0)):
        raise CheckFailed(f"{what}: a row whose scores are all -inf so far must keep running_max = -inf, "
                          f"running_sum = 0, acc = 0; got {got[0][2].item()}, {got[1][2].item()}, {got[2][2].tolist()}")
    _expect_update(got, [x.double() for x in inputs], what)


# -- the key-value cache -------------------------------------------------------------------------------


def _expect_cache(value, expected: tuple[Tensor, Tensor], what: str, old: tuple[Tensor, Tensor] | None,
                  new: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """``value`` must be the ``old`` cache (None before the first step) with the ``new`` positions appended."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise CheckFailed(f"{what} should be a pair (keys, values), got {type(value).__name__}")
    for i, (name, got, exp) in enumerate(zip(("keys", "values"), value, expected)):
        if not isinstance(got, Tensor):
            raise CheckFailed(f"{what}: {name} should be a torch.Tensor, got {type(got).__name__}")
        before = [] if old is None else [old[i]]
        fail_if_named(got, {TWICE: torch.cat([*before, new[i], new[i]], dim=-2),
                            NEW_FIRST: torch.cat([new[i], *before], dim=-2) if before else None}, what, close)
        if tuple(got.shape) != tuple(exp.shape):
            if old is not None and tuple(got.shape) == tuple(old[i].shape):
                raise CheckFailed(f"mistake in {what}: {OLD_CACHE}")
            axis = f": {WRONG_AXIS}" if got.dim() == exp.dim() and got.numel() == exp.numel() else " = (B, H, t + s, d)"
            raise CheckFailed(f"{what}: {name} have shape {tuple(got.shape)}, expected {tuple(exp.shape)}{axis}")
        if not close(got, exp):
            raise CheckFailed(f"{what}: {name} do not hold the cached positions followed by the new ones")
    return value[0], value[1]


@SUITE.check(_APPEND, parts=[APPEND])
def append_check(t: Trial) -> None:
    """None starts a cache; new positions go last along the time axis, for one or several positions."""
    b, h, d_k, d_v = 2, 3, 4, 5
    for told, s in [(0, 1), (1, 1), (4, 1), (3, 2)]:
        old = (t.randn(b, h, told, d_k), t.randn(b, h, told, d_v)) if told else None
        new = (t.randn(b, h, s, d_k), t.randn(b, h, s, d_v))
        what = f"append_to_cache of {s} position(s) to a cache of {told}" if told else \
            "append_to_cache(None, key, value)"
        _expect_cache(t.call(APPEND, old, *new), ref_append(old, *new), what, old, new)


def _expect_output(got, expected: Tensor, what: str, mistakes: dict[str, Tensor],
                   against: str = "causal attention over the whole sequence") -> None:
    if isinstance(got, Tensor) and tuple(got.shape) != tuple(expected.shape):
        fail_if_named(got, mistakes, what, close)  # a wrong shape can be a known mistake
    got = expect_tensor(got, tuple(expected.shape), what)
    if not close(got, expected):
        fail_if_named(got, mistakes, what, close)
        err = (got.double() - expected).abs().max().item()
        raise CheckFailed(f"{what} differs from {against} (largest difference {err:.3g})")


def _step_mistakes(q: Tensor, keys: Tensor, values: Tensor, t0: int, s: int) -> dict[str, Tensor]:
    """Outputs of the classic mistakes for new positions t0..t0+s-1, given all keys/values up to t0+s."""
    total = t0 + s
    q, keys, values = q.double(), keys.double(), values.double()
    out = {}
    if t0 == 1 and s == 1:  # both mistakes let position 1 see position 0 only
        out[EITHER] = ref_attention(q, keys[..., :1, :], values[..., :1, :])[0]
    elif t0 > 0:
        out[NOT_SELF] = ref_attention(q, keys[..., :t0, :], values[..., :t0, :])[0]
        top_left = torch.ones(s, total, dtype=torch.bool).tril()
        out[TOP_LEFT] = ref_attention(q, keys[..., :total, :], values[..., :total, :], top_left)[0]
    if s > 1:
        out[FUTURE] = ref_attention(q, keys[..., :total, :], values[..., :total, :])[0]
    new_k, new_v = keys[..., t0:total, :], values[..., t0:total, :]
    twice = torch.ones(s, total + s, dtype=torch.bool).tril(total)
    out[TWICE] = ref_attention(q, torch.cat([keys[..., :t0, :], new_k, new_k], dim=-2),
                               torch.cat([values[..., :t0, :], new_v, new_v], dim=-2), twice)[0]
    return out


def _decode(t: Trial, q: Tensor, k: Tensor, v: Tensor, chunks: list[int], label: str) -> None:
    full = ref_attention(q.double(), k.double(), v.double(), ref_causal(q.shape[-2]))[0]  # (B, H, n, d_v)
    cache, t0 = None, 0
    for s in chunks:
        sl = slice(t0, t0 + s)
        what = f"cached_attention for positions {t0}..{t0 + s - 1} with {t0} cached ({label})"
        result = t.call(CACHED, q[..., sl, :], k[..., sl, :], v[..., sl, :], cache)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise CheckFailed(f"{what} should return a pair (output, new_cache)")
        out, new_cache = result
        _expect_output(out, full[..., sl, :], what, _step_mistakes(q[..., sl, :], k, v, t0, s))
        cache = _expect_cache(new_cache, (k[..., :t0 + s, :], v[..., :t0 + s, :]),
                              f"the cache returned for positions {t0}..{t0 + s - 1} ({label})", cache,
                              (k[..., sl, :], v[..., sl, :]))
        t0 += s


@SUITE.check(_CACHED_STEP, parts=[CACHED])
def cached_step(t: Trial) -> None:
    """One position per step, feeding back the returned cache, equals causal attention over the sequence."""
    for b, h, n, d, d_v in [(2, 3, 7, 4, 5), (1, 1, 4, 2, 2)]:
        q, k, v = t.randn(b, h, n, d), t.randn(b, h, n, d), t.randn(b, h, n, d_v)
        _decode(t, q, k, v, [1] * n, "one position per step")


@SUITE.check(_CACHED_PROMPT, parts=[CACHED])
def cached_prompt(t: Trial) -> None:
    """A prompt of several positions, then single steps, then several again: causal, never the future."""
    q, k, v = t.randn(2, 2, 9, 4), t.randn(2, 2, 9, 4), t.randn(2, 2, 9, 3)
    _decode(t, q, k, v, [3, 1, 1, 4], "a prompt of 3, two steps, then 4 at once")


# -- tiled attention -----------------------------------------------------------------------------------

NO_SCALE = "the scores are not scaled: divide them (or the queries) by sqrt(d_k) before the softmax"
NOT_DIVIDED = "the output is the accumulator itself: divide acc by running_sum after the last block"
SKIPS_LAST = ("the last, shorter block of keys is skipped: range(0, m, block_k) visits every block, including a last "
              "one shorter than block_k when m is not a multiple of it")
STRICT = ("causal off by one: query i must see keys 0..i, itself included; hide key j only when j > i "
          "(your mask hides j >= i)")
ONE_AHEAD = ("causal off by one: query i sees key i + 1, one step in its future; hide every key j > i "
             "(compare the key's position in the whole sequence, j0 + c, with the query's)")
BLOCK_LOCAL = ("the causal mask compares positions inside the block (0..b-1) with the query's position: use the key's "
               "position in the whole sequence, block start + c")
MASK_IGNORED = "the mask is ignored: give the masked keys of each block the score -inf"
MASK_INVERTED = "the mask's polarity is inverted: True means may attend, so hide the keys where the mask is False"
CALLS_SETUP = ("tiled_attention calls the setup's attention (or torch's softmax or logsumexp), which its checks "
               "refuse, on inputs of any size: the setup's attention forms the whole score matrix of a chunk at once "
               "with torch's softmax. The exercise is the loop, one block of keys at a time through your "
               "online_softmax_update")
MAX_SCORES = 2 ** 16  # the setup's attention refuses more scores
EMPTY_NAN = ("a query with no allowed key gives NaN (0 / 0): its running sum is 0, so return zeros there "
             "(divide by 1 where running_sum is 0)")


def _tiled(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, block: int, update: str = "",
           scale: bool = True, divide: bool = True, skip_last: bool = False, causal_rule: str = "j > i") -> Tensor:
    """The tiled loop in float64, with a switch for each classic mistake."""
    q, k, v = q.double(), k.double(), v.double()
    n, m = q.shape[-2], k.shape[-2]
    q = q / math.sqrt(q.shape[-1]) if scale else q
    state = _start(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), n, v.shape[-1])
    if mask is not None:
        mask = mask.expand(*mask.shape[:-2], n, m)
    rows = torch.arange(n)[:, None]
    stop = m - (m % block or block) if skip_last else m
    for j in range(0, stop, block):
        s = q @ k[..., j:j + block, :].transpose(-2, -1)
        if mask is not None:
            s = s.masked_fill(~mask[..., j:j + block], -math.inf)
        if causal:
            cols = torch.arange(j, j + s.shape[-1])
            hide = {"j > i": cols > rows, "j >= i": cols >= rows, "j > i + 1": cols > rows + 1,
                    "local": torch.arange(s.shape[-1]) > rows}[causal_rule]
            s = s.masked_fill(hide, -math.inf)
        state = _update(*state, s, v[..., j:j + block, :], update)
    _, total, acc = state
    return acc / torch.where(total > 0, total, torch.ones_like(total)) if divide else acc


def _tiled_mistakes(q, k, v, mask, causal, block) -> dict[str, Tensor]:
    def t(**kw) -> Tensor:
        return _tiled(q, k, v, mask, causal, block, **kw)
    out = {NO_RESCALE_ACC: t(update="no rescale acc"), NO_RESCALE: t(update="no rescale"),
           STALE_MAX: t(update="first max"), NO_SCALE: t(scale=False), NOT_DIVIDED: t(divide=False)}
    if k.shape[-2] % block:
        out[SKIPS_LAST] = t(skip_last=True)
    if causal:
        out[STRICT] = t(causal_rule="j >= i")
        out[ONE_AHEAD] = t(causal_rule="j > i + 1")
        out[BLOCK_LOCAL] = t(causal_rule="local")
    if mask is not None:
        out[MASK_IGNORED] = _tiled(q, k, v, None, causal, block)
        out[MASK_INVERTED] = _tiled(q, k, v, ~mask, causal, block)
    return out


def _expect_own_rows(t: Trial, got: Tensor, q: Tensor, k: Tensor, v: Tensor, what: str, mask: Tensor | None,
                     causal: bool, block: int) -> None:
    """The causal or masked ``got``, row by row, equals the student's own tiled_attention without a mask over the keys
    that row may see (zeros where it may see none): the masking alone, whatever the rest of the formula does. Rows
    that see the same keys are asked together; at most six rows of each of the first three examples."""
    lead, (n, m) = got.shape[:-2], (q.shape[-2], k.shape[-2])
    allowed = torch.ones(n, m, dtype=torch.bool).tril() if causal else torch.ones(n, m, dtype=torch.bool)
    allowed = (allowed & mask if mask is not None else allowed).expand(*lead, n, m).reshape(-1, n, m)
    qs, ks, vs = (x.expand(*lead, *x.shape[-2:]).reshape(-1, *x.shape[-2:]) for x in (q, k, v))
    # the anchor (issue 34): without a mask, the answer is softmax attention of its inputs (or a named mistake of the
    # loop): an output that ignores the queries and keys (a mean of the values) is not compared with itself
    own = expect_tensor(t.call(TILED, qs[:1], ks[:1], vs[:1], block_k=block), (1, n, v.shape[-1]),
                        f"tiled_attention without a mask on the inputs of {what}")
    unmasked = _tiled_mistakes(qs[:1], ks[:1], vs[:1], None, False, block)
    if not close(own, ref_tiled(qs[:1].double(), ks[:1].double(), vs[:1].double())) and \
            not any(close(own, wrong) for wrong in unmasked.values()):
        raise CheckFailed(f"{what}: without a mask, your tiled_attention on the same inputs is not softmax attention "
                          "of them (softmax(Q K^T / sqrt(d_k)) V): this check compares your masked rows with your own "
                          "answer, so it first needs that answer to follow its queries and keys")
    if not bool(got.reshape(-1, n, v.shape[-1]).abs().sum(-1)[allowed.any(-1)].gt(0).all()):
        raise CheckFailed(f"{what}: a query that may see some key gets an output of zeros: it is the softmax-weighted "
                          "sum of the values it may see")
    for e in range(min(3, allowed.shape[0])):
        rows = sorted({0, n - 1, *torch.randperm(n, generator=t.gen)[:4].tolist()})
        for keys in {tuple(allowed[e, i].tolist()) for i in rows}:
            same = [i for i in rows if tuple(allowed[e, i].tolist()) == keys]
            seen = torch.tensor(keys)
            own = torch.zeros(len(same), v.shape[-1]) if not seen.any() else expect_tensor(
                t.call(TILED, qs[e, same][None], ks[e, seen][None], vs[e, seen][None], block_k=block)[0],
                (len(same), v.shape[-1]), f"tiled_attention on the keys query {same[0]} may see")
            expect_close(got.reshape(-1, n, v.shape[-1])[e, same], own, f"{what}, rows {same} (they should equal "
                         "your own tiled_attention without a mask over only the keys they may see: "
                         + ("query i sees keys 0..i of the whole sequence)" if causal else "the masked keys hidden)"))


def _expect_tiled(t: Trial, q: Tensor, k: Tensor, v: Tensor, what: str, mask: Tensor | None = None,
                  causal: bool = False, block: int = 4) -> None:
    shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], v.shape[-1])
    if math.prod(shape[:-1]) * k.shape[-2] > MAX_SCORES:
        what += " (more scores than the setup's attention accepts)"
    kwargs = {"block_k": block} | ({"mask": mask} if mask is not None else {}) | ({"causal": True} if causal else {})
    try:
        got = t.call(TILED, q, k, v, **kwargs)
    except StudentError as err:
        refused = "refused by the grader's guard" in str(err) and any(f in str(err) for f in ("softmax", "logsumexp"))
        if refused or "MemoryError" in str(err) and "MAX_SCORES" in str(err):
            raise CheckFailed(f"{what}: {CALLS_SETUP}") from None
        raise
    if isinstance(got, Tensor) and got.is_floating_point() and not torch.isfinite(got).all():
        raise CheckFailed(f"{what} contains NaN: {EMPTY_NAN}" if mask is not None or causal else
                          f"{what} contains NaN or inf: {STALE_MAX} (exp(score - an old maximum) overflows when a "
                          "later block's scores are much larger)")
    got = expect_tensor(got, shape, what)
    expected = ref_tiled(q.double(), k.double(), v.double(), mask, causal)  # attnkit: (query, key, value, mask, causal)
    wrong = _tiled_mistakes(q, k, v, mask, causal, block)
    if mask is None and not causal:
        _expect_output(got, expected, what, wrong, "softmax attention")
    elif not close(got, expected):
        masking = (STRICT, ONE_AHEAD, BLOCK_LOCAL, MASK_IGNORED, MASK_INVERTED)  # a masked row's own mistakes
        fail_if_named(got, {m: w for m, w in wrong.items() if m in masking}, what, close)
        _expect_own_rows(t, got, q, k, v, what, mask, causal, block)
    if got.dtype != q.dtype:
        raise CheckFailed(f"{what} has dtype {got.dtype} for {q.dtype} inputs: keep the inputs' dtype")


@SUITE.check(_TILED_VALUES, parts=[TILED])
def tiled_check(t: Trial) -> None:
    """Equals softmax attention for blocks that do and do not divide m, any leading dimensions, float32 and float64."""
    for lead, n, m, d, d_v, block, dtype in [((2,), 5, 11, 4, 3, 4, torch.float32), ((2, 3), 3, 8, 2, 5, 8, torch.float32),
                                              ((1,), 6, 9, 3, 2, 2, torch.float64), ((), 4, 5, 4, 4, 1, torch.float32)]:
        q, k, v = t.randn(*lead, n, d, dtype=dtype), t.randn(*lead, m, d, dtype=dtype, scale=2.0), \
            t.randn(*lead, m, d_v, dtype=dtype)
        _expect_tiled(t, q, k, v, f"tiled_attention for query {(*lead, n, d)}, key {(*lead, m, d)}, block_k={block} "
                      f"({dtype})", block=block)
    # the later blocks' scores are ~300 above the first block's: exp(300) overflows float32 unless every block is
    # taken relative to the maximum so far (a stale maximum gives inf / inf)
    q = torch.full((1, 2, 4), 3.0) + t.randn(1, 2, 4, scale=0.1)
    k = torch.cat([t.randn(1, 4, 4, scale=0.1), torch.full((1, 4, 4), 50.0) + t.randn(1, 4, 4)], dim=1)
    _expect_tiled(t, q, k, t.randn(1, 8, 3), "tiled_attention where the second block's scores are ~300 above the "
                  "first's (float32)", block=4)
    q, k, v = t.randn(1, 300, 4), t.randn(1, 260, 4, scale=1.5), t.randn(1, 260, 3)  # 78 000 scores > MAX_SCORES
    _expect_tiled(t, q, k, v, "tiled_attention for query (1, 300, 4), key (1, 260, 4), block_k=64", block=64)


@SUITE.check(_TILED_CAUSAL, parts=[TILED])
def tiled_causal(t: Trial) -> None:
    """causal=True: query i sees keys 0..i, for blocks that do and do not divide n."""
    for b, n, d, block in [(2, 7, 4, 3), (1, 8, 2, 4), (2, 5, 3, 1), (1, 270, 4, 32)]:  # 72 900 scores > MAX_SCORES
        x, v = t.randn(b, n, d, scale=1.5), t.randn(b, n, 3)
        _expect_tiled(t, x, x, v, f"tiled_attention(causal=True) for a sequence of {n} positions, block_k={block}",
                      causal=True, block=block)


@SUITE.check(_TILED_MASK, parts=[TILED])
def tiled_mask(t: Trial) -> None:
    """A padding mask (B, 1, m) and a full (B, n, m) mask hide keys; a query with no allowed key gets zeros."""
    q, k, v = t.randn(3, 4, 4), t.randn(3, 7, 4, scale=2.0), t.randn(3, 7, 2)
    keep = t.rand_mask(3, 1, 7, p=0.6)
    keep[0, 0, :] = True
    keep[2] = False  # example 2 may attend to nothing
    _expect_tiled(t, q, k, v, "tiled_attention with a (B, 1, m) padding mask, one example all padding", mask=keep, block=3)
    full = t.rand_mask(3, 4, 7, p=0.5)
    full[:, 1] = False  # query 1 of every example may attend to nothing
    _expect_tiled(t, q, k, v, "tiled_attention with a (B, n, m) mask, query 1 fully masked", mask=full, block=4)
    q, k, v = t.randn(2, 200, 4), t.randn(2, 180, 4, scale=1.5), t.randn(2, 180, 2)  # 72 000 scores > MAX_SCORES
    keep = t.rand_mask(2, 1, 180, p=0.6)
    keep[1] = False
    _expect_tiled(t, q, k, v, "tiled_attention with a (B, 1, m) padding mask, query (2, 200, 4), key (2, 180, 4), "
                  "block_k=50", mask=keep, block=50)


# -- grouped-query attention -----------------------------------------------------------------------------

GQA = "grouped_query_attention"
INTERLEAVED = ("the key-value heads are interleaved instead of grouped: query head h uses key-value head h % G "
               "(what tiling the heads, key.repeat(1, H // G, 1, 1), gives); the H / G consecutive query heads of a "
               "group share one head, so head h must use h // (H / G) (repeat each key-value head H / G times in place, "
               "repeat_interleave(H // G, dim=1))")
AVERAGED = ("the query heads of each group are averaged into one query: grouped-query attention keeps all H query "
            "heads, each with its own weights, and only the keys and values are shared (give each key-value head to "
            "H / G query heads)")
NOT_DIVISIBLE = ("G = {g} key-value heads do not divide H = {h} query heads (H % G = {r}), so the heads cannot be "
                 "grouped: raise a ValueError that says so, before repeating anything (the check is missing, or lets "
                 "this G through: test H % G != 0, which also refuses G > H)")
REVERSED = ("the divisibility check is reversed: G = {g} divides H = {h} (H % G == 0), a valid input; refuse "
            "H % G != 0, not G % H != 0")
GQA_EMPTY = "a query with no allowed key gives NaN (0 / 0): its row of the output must be zeros"


def _reference_gqa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """The oracle: torch's ``enable_gqa`` (torch >= 2.5; requirements.txt pins it), attnkit on repeated heads with a
    mask (where a query may be fully masked)."""
    q, k, v = q.double(), k.double(), v.double()
    if mask is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    r = q.shape[-3] // k.shape[-3]
    return ref_attention(q, k.repeat_interleave(r, dim=-3), v.repeat_interleave(r, dim=-3), mask)[0]


def _gqa_mistakes(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> dict[str, Tensor]:
    """Outputs of the classic grouped-query mistakes on the same inputs."""
    q, k, v = q.double(), k.double(), v.double()
    H, G = q.shape[-3], k.shape[-3]
    r = H // G
    out: dict[str, Tensor] = {}
    if 1 < G < H:  # with G == H or G == 1, tiled and grouped heads are the same
        reps = (1,) * (k.dim() - 3) + (r, 1, 1)
        out[INTERLEAVED] = ref_attention(q, k.repeat(*reps), v.repeat(*reps), mask)[0]
    if G < H and mask is None:
        averaged = ref_attention(q.unflatten(-3, (G, r)).mean(-3), k, v)[0]  # (B, G, n, d_v)
        out[AVERAGED] = averaged.repeat_interleave(r, dim=-3)  # (B, H, n, d_v)
        out[AVERAGED + "; and the output has G heads, not H"] = averaged
    if mask is not None:
        out[MASK_IGNORED] = _reference_gqa(q, k, v)
        out[MASK_INVERTED] = _reference_gqa(q, k, v, ~mask)
    return out


def _expect_gqa(t: Trial, q: Tensor, k: Tensor, v: Tensor, what: str, mask: Tensor | None = None) -> None:
    got = t.call(GQA, q, k, v, mask) if mask is not None else t.call(GQA, q, k, v)
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], Tensor):
        raise CheckFailed(f"{what} returned a pair; return the output tensor (B, H, n, d_v) only")
    if isinstance(got, Tensor) and got.is_floating_point() and torch.isnan(got).any() and mask is not None:
        raise CheckFailed(f"{what} contains NaN: {GQA_EMPTY}")
    _expect_output(got, _reference_gqa(q, k, v, mask), what, _gqa_mistakes(q, k, v, mask),
                   "attention with each query head given its group's key-value head")
    if got.dtype != q.dtype:
        raise CheckFailed(f"{what} has dtype {got.dtype} for {q.dtype} inputs: keep the inputs' dtype")


@SUITE.check(_GQA_VALUES, parts=[GQA])
def gqa_check(t: Trial) -> None:
    """Equals torch's enable_gqa (attnkit without it): G == H is multi-head, 1 < G < H grouped, G == 1 multi-query."""
    for b, h, g, n, m, d, d_v, dtype in [(2, 3, 3, 4, 5, 4, 3, torch.float32), (2, 4, 2, 3, 5, 4, 3, torch.float32),
                                         (1, 6, 2, 4, 6, 2, 5, torch.float64), (2, 6, 3, 3, 4, 4, 2, torch.float32),
                                         (2, 4, 1, 3, 6, 4, 4, torch.float32)]:
        q, k, v = t.randn(b, h, n, d, dtype=dtype), t.randn(b, g, m, d, dtype=dtype, scale=1.5), \
            t.randn(b, g, m, d_v, dtype=dtype)
        _expect_gqa(t, q, k, v, f"grouped_query_attention with H={h} query heads, G={g} key-value heads ({dtype})")


@SUITE.check(_GQA_MASK, parts=[GQA])
def gqa_mask(t: Trial) -> None:
    """A (B, 1, 1, m) padding mask, an (n, m) mask and a per-head (B, H, n, m) one; no allowed key gives zeros."""
    q, k, v = t.randn(2, 6, 4, 4), t.randn(2, 2, 5, 4, scale=1.5), t.randn(2, 2, 5, 3)
    keep, full = t.rand_mask(2, 1, 1, 5, p=0.6), t.rand_mask(2, 6, 4, 5, p=0.5)
    keep[0, ..., 0] = True
    keep[1] = False  # example 1 may attend to nothing
    full[:, :, 2] = False  # query 2 of every head may attend to nothing
    for mask, about in [(keep, "a (B, 1, 1, m) padding mask, example 1 all padding"),
                        (torch.ones(4, 5, dtype=torch.bool).tril(1), "an (n, m) mask"),
                        (full, "a (B, H, n, m) mask, query 2 fully masked")]:
        _expect_gqa(t, q, k, v, f"grouped_query_attention (H=6, G=2) with {about}", mask)


@SUITE.check(_GQA_HEADS, parts=[GQA])
def gqa_heads(t: Trial) -> None:
    """A ValueError naming H and G when G does not divide H (G < H and G > H); every G that divides H works."""
    for h, g in [(8, 2), (6, 3), (4, 1), (4, 4), (6, 4), (4, 8), (9, 6)]:
        q, k, v = t.randn(1, h, 2, 4), t.randn(1, g, 3, 4), t.randn(1, g, 3, 2)
        what = f"grouped_query_attention with H={h}" + (f", G={g}" if h % g == 0 else
                                                        f" query heads and G={g} key-value heads")
        try:
            got = t.call(GQA, q, k, v)
        except StudentError as err:
            msg = str(err)
            raised, said = msg.startswith("your code raised ValueError"), msg.split(":", 1)[1] if ":" in msg else ""
            if h % g == 0:
                why = f": {REVERSED.format(h=h, g=g)}" if raised and g < h else f" (G divides H, a valid input): {msg}"
                raise CheckFailed(what + why) from None
            if not raised:
                raise CheckFailed(f"{what}: {NOT_DIVISIBLE.format(h=h, g=g, r=h % g)}; {msg}") from None
            if str(h) not in said or str(g) not in said:
                raise CheckFailed(f"{what}: the ValueError should name both numbers, H = {h} and G = {g} "
                                  f"(it says{said[:120]!r})") from None
            continue
        if h % g:
            shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
            raise CheckFailed(f"{what} returned {shape} instead of raising a ValueError: "
                              f"{NOT_DIVISIBLE.format(h=h, g=g, r=h % g)}")


# -- conceptual questions ------------------------------------------------------------------------------
KV_BYTES = 2 * 12 * 16 * 64 * 2 * 1000  # keys and values x layers x heads x head_dim x bytes x tokens
GQA_BYTES = 2 * 32 * 8 * 128 * 2  # keys and values x layers x key-value heads x head_dim x bytes
N_F, D_F = 1024, 64  # q_attention_flops
e = math.exp


def _online_state(value, name: str) -> None:
    """q_online_state: (running max, running sum) after the blocks (1, 3) and (2, 5)."""
    value = tuple(value.flatten().tolist()) if isinstance(value, Tensor) and value.numel() == 2 else value
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise CheckFailed(f"{name} should be a tuple of two numbers (running_max, running_sum), got "
                          f"{type(value).__name__}")
    expect_number(value[0], 5.0, f"the running max of {name}", {
        "that is the first block's maximum: the running max is the largest score over every block so far": 3.0,
        "that is the second block's first score; the maximum of (1, 3, 2, 5) is 5": 2.0})
    expect_number(value[1], e(-4) + e(-2) + e(-3) + 1, f"the running sum of {name}", {
        "the old sum is not rescaled: e^(1-3) + e^(3-3) is relative to the old max 3; multiply it by e^(3-5)":
            e(-2) + 1 + e(-3) + 1,
        "the maximum is stale: every term must be relative to the new max 5, not 3": e(-2) + 1 + e(-1) + e(2),
        "that is the sum of exp(scores) with no maximum subtracted; the running sum is relative to the running max":
            e(1) + e(3) + e(2) + e(5),
        "that is only the second block's sum: the first block's terms stay in, rescaled by e^(3-5)": e(-3) + 1,
        "the rescaling factor is inverted: the old sum is multiplied by e^(M - M') = e^(3-5), not e^(5-3)":
            (e(-2) + 1) * e(2) + e(-3) + 1})


SUITE.questions({
    "q_kv_cache_bytes": number(KV_BYTES, "Bytes of a float16 KV cache: 12 layers, 16 heads of 64, 1000 tokens, one "
                               "sequence.", {
        "that is half: the cache holds both keys and values (a factor 2), and each float16 number takes 2 bytes; "
        "one of the two factors is missing": KV_BYTES // 2,
        "that is float32 (4 bytes a number); the cache is float16, 2 bytes": KV_BYTES * 2,
        "that is one layer's cache: every one of the 12 layers keeps its own keys and values": KV_BYTES // 12,
        "that is one head's cache: every layer has 16 heads, each with its own keys and values": KV_BYTES // 16,
        "that grows with the square of the tokens: the cache holds one key and one value per token, so it grows "
        "linearly": KV_BYTES * 1000}, rel=1e-9),
    "q_attention_flops": number(4 * N_F * N_F * D_F, "FLOPs of Q K^T and weights @ V for n = 1024, d = 64 (a "
                                "multiply-add is 2).", {
        "that is half: either one of the two products only, or a multiply-add counted as one operation; each "
        "product takes n * n * d multiply-adds = 2 n^2 d operations": 2 * N_F * N_F * D_F,
        "that is linear in n (n d^2 is the cost of a projection); the score matrix has n^2 entries, each a "
        "d-long dot product": 4 * N_F * D_F * D_F,
        "that is the number of entries of the score matrix, not the operations to compute them": N_F * N_F,
        "that counts one multiply-add per product and entry (n^2 d) without the factor 2 for the two products and the "
        "two operations": N_F * N_F * D_F}, rel=1e-9),
    "q_online_state": Question(_online_state, "Running max and sum after the blocks (1, 3) and (2, 5)."),
    "q_gqa_cache_bytes": number(GQA_BYTES, "Bytes per token of a bfloat16 GQA cache: 32 layers, 32 query heads, 8 "
                                "key-value heads of 128.", {
        "that counts the 32 query heads: the cache stores keys and values, and there are only 8 key-value heads "
        "(the query heads are not cached)": GQA_BYTES * 4,
        "that is multi-query attention (one key-value head): this model has 8": GQA_BYTES // 8,
        "that is half: the cache holds both keys and values (a factor 2), and each bfloat16 number takes 2 bytes; "
        "one of the two factors is missing": GQA_BYTES // 2,
        "that is float32 (4 bytes a number); bfloat16 takes 2": GQA_BYTES * 2,
        "that is one layer's cache: every one of the 32 layers keeps its own keys and values": GQA_BYTES // 32},
        rel=1e-9),
})
