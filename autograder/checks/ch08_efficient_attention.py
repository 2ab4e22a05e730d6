"""Graded checks for exercise 08_efficient_attention: ``online_softmax_update``, ``tiled_attention``,
``append_to_cache``, ``cached_attention``, three conceptual questions.

Stated requirements (exercise text and docstrings) and the check that exercises each:

=========================================================================  ======================================
requirement                                                                check
=========================================================================  ======================================
update: returns (running_max, running_sum, acc), shapes (..., n, 1) x2,    every update check (_state)
        (..., n, d_v)
update: M' = max(M, block max); sum and acc rescaled by exp(M - M')        test_online_softmax_basic, _blocks
update: keeps the inputs' dtype                                            test_online_softmax_blocks
update: an all -inf row stays (-inf, 0, 0), no NaN                         test_online_softmax_masked
tiled: equals attention, blocks that do not divide m, (..., n, d_v)        test_tiled_attention
tiled: scores scaled by 1/sqrt(d_k); acc / running_sum at the end          test_tiled_attention
tiled: keeps the inputs' dtype (float64 in, float64 out)                   test_tiled_attention
tiled: causal, query i sees keys 0..i (itself included)                    test_tiled_attention_causal
tiled: mask (True = may attend, broadcastable) hides keys                  test_tiled_attention_mask
tiled: a query with no allowed key gives zeros, never NaN                  test_tiled_attention_mask
tiled: does not call torch's attention or attnkit                          the authorship scan (every part)
tiled: does not call the setup's ``attention``                             NOT checked: same outputs, and the
                                                                           scan bans attribute and imported
                                                                           names only (left to the formgrader)
append: None starts a cache; new positions last on the time axis           test_append_to_cache
cached: output (B, H, s, d_v); causal shifted by t; cache of t + s         test_cached_attention_step, _prompt
the three questions                                                        test_q_*
=========================================================================  ======================================

The online-softmax checks build a realistic state in the judge (the reference state after some
blocks), ask the student's update to fold in one more block whose maximum is larger for some rows and
smaller for others, and compare the three returned tensors; the classic mistakes (no rescaling of the
sum or the accumulator, a stale or block-only maximum, the inverted factor, NaN for masked rows) are
computed from the same inputs and named when the answer equals one. The cache checks compare with
causal attention over the whole sequence computed here by :mod:`attnkit`.
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
from autograder.checks import CheckFailed, StudentError, Suite, Trial, close, expect_number, expect_tensor

SUITE = Suite("08_efficient_attention")
UPDATE, APPEND, CACHED, TILED = "online_softmax_update", "append_to_cache", "cached_attention", "tiled_attention"

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


# -- the online softmax ------------------------------------------------------------------------------


def _finite(x: Tensor) -> Tensor:
    """-inf as a large negative number, so that maxima compare with ``close``."""
    return torch.nan_to_num(x.to(torch.float64), neginf=-1e30)


def _mistaken_updates(m: Tensor, l: Tensor, acc: Tensor, s: Tensor, v: Tensor) -> list[tuple[str, State]]:
    new = torch.maximum(m, s.amax(-1, keepdim=True))
    shift = torch.where(new.isfinite(), new, torch.zeros_like(new))
    r = torch.exp(m - shift)
    p = torch.exp(s - shift)
    block = s.amax(-1, keepdim=True)
    bshift = torch.where(block.isfinite(), block, torch.zeros_like(block))
    rb, pb = torch.exp(m - bshift), torch.exp(s - bshift)
    mshift = torch.where(m.isfinite(), m, torch.zeros_like(m))
    po = torch.exp(s - mshift)  # relative to the old maximum, never updated
    return [
        (NO_RESCALE, (new, l + p.sum(-1, keepdim=True), acc + p @ v)),
        (NO_RESCALE_SUM, (new, l + p.sum(-1, keepdim=True), r * acc + p @ v)),
        (NO_RESCALE_ACC, (new, r * l + p.sum(-1, keepdim=True), acc + p @ v)),
        (STALE_MAX, (m, r * l + p.sum(-1, keepdim=True), r * acc + p @ v)),
        (STALE_MAX, (m, l + po.sum(-1, keepdim=True), acc + po @ v)),
        (BLOCK_MAX, (block, rb * l + pb.sum(-1, keepdim=True), rb * acc + pb @ v)),
        (INVERTED, (new, l / r + p.sum(-1, keepdim=True), acc / r + p @ v)),
    ]


def _state(value, what: str, n: int, d_v: int, lead: tuple[int, ...]) -> State:
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise CheckFailed(f"{what} should return a tuple (running_max, running_sum, acc), got "
                          f"{type(value).__name__}" + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else ""))
    m, l, a = value
    for name, t, shape in (("running_max", m, (*lead, n, 1)), ("running_sum", l, (*lead, n, 1)),
                           ("acc", a, (*lead, n, d_v))):
        if not isinstance(t, Tensor):
            raise CheckFailed(f"{what}: {name} should be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise CheckFailed(f"{what}: {name} has shape {tuple(t.shape)}, expected {shape}")
        if torch.isnan(t).any():
            raise CheckFailed(f"{what}: {name} contains NaN")
    return m, l, a


def _states_close(a: State, b: State) -> bool:
    return close(_finite(a[0]), _finite(b[0])) and close(a[1], b[1]) and close(a[2], b[2])


def _expect_state(got: State, expected: State, what: str, mistakes: list[tuple[str, State]]) -> None:
    if _states_close(got, expected):
        return
    for message, wrong in mistakes:
        if _states_close(got, wrong):
            raise CheckFailed(f"{what} is wrong: {message}")
    for name, i in (("running_max", 0), ("running_sum", 1), ("acc", 2)):
        g, e = (_finite(got[i]), _finite(expected[i])) if i == 0 else (got[i], expected[i])
        if not close(g, e):
            err = (g.to(torch.float64) - e.to(torch.float64)).abs().max().item()
            raise CheckFailed(f"{what}: {name} does not match the expected values (largest difference {err:.3g})")


def _prior_state(t: Trial, lead: tuple[int, ...], n: int, d_v: int, blocks: int) -> State:
    """The reference state after ``blocks`` random blocks of keys (scores of scale 2)."""
    state = (torch.full((*lead, n, 1), -math.inf, dtype=torch.float64), torch.zeros(*lead, n, 1, dtype=torch.float64),
             torch.zeros(*lead, n, d_v, dtype=torch.float64))
    for _ in range(blocks):
        state = ref_update(*state, t.randn(*lead, n, 3, scale=2.0).double(), t.randn(*lead, 3, d_v).double())
    return state


@SUITE.check("test_online_softmax_basic", parts=[UPDATE])
def update_one_block(t: Trial) -> None:
    """One update from a realistic state: new maximum, rescaled sum and accumulator; maxima that grow and that do not."""
    for lead, n, b, d_v in [((), 4, 3, 2), ((2,), 3, 5, 4), ((2, 3), 2, 1, 3)]:
        m, l, a = (x.float() for x in _prior_state(t, lead, n, d_v, blocks=2))
        scores = t.randn(*lead, n, b, scale=2.0)
        scores[..., 0, :] += 6.0  # row 0: the maximum grows
        scores[..., -1, :] -= 8.0  # last row: the maximum stays
        values = t.randn(*lead, b, d_v)
        what = f"online_softmax_update with a {tuple(scores.shape)} block of scores"
        got = _state(t.call(UPDATE, m, l, a, scores, values), what, n, d_v, lead)
        expected = ref_update(m.double(), l.double(), a.double(), scores.double(), values.double())
        _expect_state(got, expected, what, _mistaken_updates(m.double(), l.double(), a.double(), scores.double(),
                                                             values.double()))


@SUITE.check("test_online_softmax_blocks", parts=[UPDATE])
def update_chain(t: Trial) -> None:
    """Fed block by block through the student's update, acc / running_sum equals softmax attention (float32 and float64)."""
    for dtype, (n, m, d, d_v, block) in [(torch.float32, (5, 13, 4, 3, 4)), (torch.float64, (3, 9, 2, 5, 2)),
                                         (torch.float32, (2, 7, 3, 2, 7))]:
        q, k, v = t.randn(2, n, d, dtype=dtype), t.randn(2, m, d, dtype=dtype, scale=2.0), t.randn(2, m, d_v, dtype=dtype)
        expected, _ = ref_attention(q.double(), k.double(), v.double())
        state: State = (torch.full((2, n, 1), -math.inf, dtype=dtype), torch.zeros(2, n, 1, dtype=dtype),
                        torch.zeros(2, n, d_v, dtype=dtype))
        ref_state = tuple(x.double() for x in state)
        qs = q / math.sqrt(d)
        for j in range(0, m, block):
            scores, vals = qs @ k[:, j:j + block].transpose(-2, -1), v[:, j:j + block]
            what = f"online_softmax_update at keys {j}..{min(m, j + block) - 1} of {m} ({dtype})"
            mistakes = _mistaken_updates(*ref_state, scores.double(), vals.double())
            state = _state(t.call(UPDATE, *state, scores, vals), what, n, d_v, (2,))
            if state[0].dtype != dtype:
                raise CheckFailed(f"{what}: returned {state[0].dtype} for {dtype} inputs; keep the inputs' dtype")
            expected_state = ref_update(*ref_state, scores.double(), vals.double())
            _expect_state(state, expected_state, what, mistakes)
            ref_state = expected_state
        out = state[2].double() / state[1].double()
        if not close(out, expected, atol=1e-4 if dtype == torch.float32 else 1e-9):
            raise CheckFailed("acc / running_sum after the last block differs from softmax attention")


@SUITE.check("test_online_softmax_masked", parts=[UPDATE])
def update_masked(t: Trial) -> None:
    """-inf scores (masked keys): no NaN; a row with nothing allowed yet keeps (-inf, 0, 0); a later block recovers it."""
    n, d_v = 4, 3
    m, l, a = (x.float() for x in _prior_state(t, (), n, d_v, blocks=1))
    m[1:3], l[1:3], a[1:3] = -math.inf, 0.0, 0.0  # rows 1 and 2: every key so far was masked
    scores = t.randn(n, 3, scale=2.0)
    scores[0, 1] = scores[2] = scores[3] = -math.inf  # row 2 stays empty; row 3 has a fully masked block
    values = t.randn(3, d_v)
    what = "online_softmax_update with masked (-inf) scores"
    raw = t.call(UPDATE, m, l, a, scores, values)
    if isinstance(raw, (tuple, list)) and len(raw) == 3 and all(isinstance(x, Tensor) for x in raw) \
            and any(torch.isnan(x).any() for x in raw):
        raise CheckFailed(f"{what} is wrong: {NAN_ROWS}")
    got = _state(raw, what, n, d_v, ())
    expected = ref_update(m.double(), l.double(), a.double(), scores.double(), values.double())
    if not (got[0][2].item() == -math.inf and got[1][2].item() == 0 and torch.all(got[2][2] == 0)):
        raise CheckFailed(f"{what}: a row whose scores are all -inf so far must keep running_max = -inf, "
                          f"running_sum = 0, acc = 0; got {got[0][2].item()}, {got[1][2].item()}, {got[2][2].tolist()}")
    _expect_state(got, expected, what, _mistaken_updates(m.double(), l.double(), a.double(), scores.double(),
                                                         values.double()))


# -- the key-value cache -------------------------------------------------------------------------------


def _expect_cache(value, expected: tuple[Tensor, Tensor], what: str, old: tuple[Tensor, Tensor] | None = None,
                  new: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise CheckFailed(f"{what} should be a pair (keys, values), got {type(value).__name__}")
    for name, got, exp in zip(("keys", "values"), value, expected):
        if not isinstance(got, Tensor):
            raise CheckFailed(f"{what}: {name} should be a torch.Tensor, got {type(got).__name__}")
        i = 0 if name == "keys" else 1
        if new is not None:
            twice = torch.cat([*([old[i]] if old is not None else []), new[i], new[i]], dim=-2)
            if close(got, twice):
                raise CheckFailed(f"{what} is wrong: {TWICE}")
        if tuple(got.shape) != tuple(exp.shape):
            if old is not None and tuple(got.shape) == tuple(old[i].shape):
                raise CheckFailed(f"{what} is wrong: {OLD_CACHE}")
            if got.dim() == exp.dim() and got.numel() == exp.numel():
                raise CheckFailed(f"{what}: {name} have shape {tuple(got.shape)}, expected {tuple(exp.shape)}: "
                                  f"{WRONG_AXIS}")
            raise CheckFailed(f"{what}: {name} have shape {tuple(got.shape)}, expected {tuple(exp.shape)} = (B, H, t + s, d)")
        if not close(got, exp):
            if old is not None and new is not None:
                i = 0 if name == "keys" else 1
                if close(got, torch.cat([new[i], old[i]], dim=-2)):
                    raise CheckFailed(f"{what} is wrong: {NEW_FIRST}")
            raise CheckFailed(f"{what}: {name} do not hold the cached positions followed by the new ones")
    return value[0], value[1]


@SUITE.check("test_append_to_cache", parts=[APPEND])
def append_check(t: Trial) -> None:
    """None starts a cache; new positions go last along the time axis, for one or several positions."""
    b, h, d_k, d_v = 2, 3, 4, 5
    k, v = t.randn(b, h, 1, d_k), t.randn(b, h, 1, d_v)
    _expect_cache(t.call(APPEND, None, k, v), (k, v), "append_to_cache(None, key, value)")
    for told, s in [(1, 1), (4, 1), (3, 2)]:
        old = (t.randn(b, h, told, d_k), t.randn(b, h, told, d_v))
        new = (t.randn(b, h, s, d_k), t.randn(b, h, s, d_v))
        expected = ref_append(old, *new)
        _expect_cache(t.call(APPEND, old, *new), expected,
                      f"append_to_cache of {s} position(s) to a cache of {told}", old, new)


def _causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return ref_attention(q.double(), k.double(), v.double(), ref_causal(q.shape[-2]))[0]


def _expect_output(got, expected: Tensor, what: str, mistakes: dict[str, Tensor],
                   against: str = "causal attention over the whole sequence") -> Tensor:
    got = expect_tensor(got, tuple(expected.shape), what)
    if close(got, expected):
        return got
    for message, wrong in mistakes.items():
        if close(got, wrong):
            raise CheckFailed(f"{what} is wrong: {message}")
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
    full = _causal(q, k, v)  # (B, H, n, d_v)
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


@SUITE.check("test_cached_attention_step", parts=[CACHED])
def cached_step(t: Trial) -> None:
    """One position per step, feeding back the returned cache, equals causal attention over the sequence."""
    for b, h, n, d, d_v in [(2, 3, 7, 4, 5), (1, 1, 4, 2, 2)]:
        q, k, v = t.randn(b, h, n, d), t.randn(b, h, n, d), t.randn(b, h, n, d_v)
        _decode(t, q, k, v, [1] * n, "one position per step")


@SUITE.check("test_cached_attention_prompt", parts=[CACHED])
def cached_prompt(t: Trial) -> None:
    """A prompt of several positions, then single steps, then several again: causal, never the future."""
    q, k, v = t.randn(2, 2, 9, 4), t.randn(2, 2, 9, 4), t.randn(2, 2, 9, 3)
    _decode(t, q, k, v, [3, 1, 1, 4], "a prompt of 3, two steps, then 4 at once")


# -- tiled attention -----------------------------------------------------------------------------------

NO_SCALE = "the scores are not scaled: divide them (or the queries) by sqrt(d_k) before the softmax"
NOT_DIVIDED = "the output is the accumulator itself: divide acc by running_sum after the last block"
SKIPS_LAST = ("the last, shorter block of keys is skipped: range(0, m, block) visits every block, including a last one "
              "shorter than block when m is not a multiple of it")
STRICT = ("causal off by one: query i must see keys 0..i, itself included; hide key j only when j > i "
          "(your mask hides j >= i)")
ONE_AHEAD = ("causal off by one: query i sees key i + 1, one step in its future; hide every key j > i "
             "(compare the key's position in the whole sequence, j0 + c, with the query's)")
BLOCK_LOCAL = ("the causal mask compares positions inside the block (0..b-1) with the query's position: use the key's "
               "position in the whole sequence, block start + c")
MASK_IGNORED = "the mask is ignored: give the masked keys of each block the score -inf"
MASK_INVERTED = "the mask's polarity is inverted: True means may attend, so hide the keys where the mask is False"
EMPTY_NAN = ("a query with no allowed key gives NaN (0 / 0): its running sum is 0, so return zeros there "
             "(divide by 1 where running_sum is 0)")


def _variant_update(kind: str):
    """The reference update, or one with a classic mistake (for the tiled loop's named mistakes)."""
    def update(m: Tensor, l: Tensor, acc: Tensor, s: Tensor, v: Tensor) -> State:
        new = torch.maximum(m, s.amax(-1, keepdim=True))
        shift = torch.where(new.isfinite(), new, torch.zeros_like(new))
        r = torch.exp(m - shift)
        p = torch.exp(s - shift)
        if kind == "no rescale acc":
            return new, r * l + p.sum(-1, keepdim=True), acc + p @ v
        if kind == "no rescale":
            return new, l + p.sum(-1, keepdim=True), acc + p @ v
        if kind == "stale max":  # the first block's maximum is kept: later blocks are relative to it
            keep = torch.where(m.isfinite(), m, new)
            ks = torch.where(keep.isfinite(), keep, torch.zeros_like(keep))
            rk = torch.exp(m - ks)
            pk = torch.exp(s - ks)
            return keep, rk * l + pk.sum(-1, keepdim=True), rk * acc + pk @ v
        return new, r * l + p.sum(-1, keepdim=True), r * acc + p @ v
    return update


def _tiled(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, block: int, update: str = "",
           scale: bool = True, divide: bool = True, skip_last: bool = False, causal_rule: str = "j > i",
           guard: bool = True) -> Tensor:
    """The tiled loop in float64, with a switch for each classic mistake."""
    q, k, v = q.double(), k.double(), v.double()
    n, m = q.shape[-2], k.shape[-2]
    q = q / math.sqrt(q.shape[-1]) if scale else q
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    state: State = (torch.full((*lead, n, 1), -math.inf, dtype=torch.float64),
                    torch.zeros(*lead, n, 1, dtype=torch.float64), torch.zeros(*lead, n, v.shape[-1], dtype=torch.float64))
    if mask is not None:
        mask = mask.expand(*mask.shape[:-2], n, m)
    rows = torch.arange(n)[:, None]
    fn = _variant_update(update)
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
        state = fn(*state, s, v[..., j:j + block, :])
    _, total, acc = state
    if not divide:
        return acc
    return acc / torch.where(total > 0, total, torch.ones_like(total)) if guard else acc / total


def _tiled_mistakes(q, k, v, mask, causal, block) -> dict[str, Tensor]:
    def t(**kw) -> Tensor:
        return _tiled(q, k, v, mask, causal, block, **kw)
    out = {NO_RESCALE_ACC: t(update="no rescale acc"), NO_RESCALE: t(update="no rescale"),
           STALE_MAX: t(update="stale max"), NO_SCALE: t(scale=False), NOT_DIVIDED: t(divide=False)}
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


def _expect_tiled(t: Trial, q: Tensor, k: Tensor, v: Tensor, what: str, mask: Tensor | None = None,
                  causal: bool = False, block: int = 4) -> Tensor:
    kwargs: dict = {"block": block}
    if mask is not None:
        kwargs["mask"] = mask
    if causal:
        kwargs["causal"] = True
    got = t.call(TILED, q, k, v, **kwargs)
    shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], v.shape[-1])
    if isinstance(got, Tensor) and got.is_floating_point() and not torch.isfinite(got).all():
        raise CheckFailed(f"{what} contains NaN: {EMPTY_NAN}" if mask is not None or causal else
                          f"{what} contains NaN or inf: {STALE_MAX} (exp(score - an old maximum) overflows when a "
                          "later block's scores are much larger)")
    got = expect_tensor(got, shape, what)
    expected = ref_tiled(q.double(), k.double(), v.double(), mask, causal)  # attnkit: (query, key, value, mask, causal)
    _expect_output(got, expected, what, _tiled_mistakes(q, k, v, mask, causal, block),
                   "softmax attention" + (" with the causal mask" if causal else "") + (" with the mask" if mask is not None else ""))
    if got.dtype != q.dtype:
        raise CheckFailed(f"{what} has dtype {got.dtype} for {q.dtype} inputs: keep the inputs' dtype")
    return got


@SUITE.check("test_tiled_attention", parts=[TILED])
def tiled_check(t: Trial) -> None:
    """Equals softmax attention for blocks that do and do not divide m, any leading dimensions, float32 and float64."""
    for lead, n, m, d, d_v, block, dtype in [((2,), 5, 11, 4, 3, 4, torch.float32), ((2, 3), 3, 8, 2, 5, 8, torch.float32),
                                              ((1,), 6, 9, 3, 2, 2, torch.float64), ((), 4, 5, 4, 4, 1, torch.float32)]:
        q, k, v = t.randn(*lead, n, d, dtype=dtype), t.randn(*lead, m, d, dtype=dtype, scale=2.0), \
            t.randn(*lead, m, d_v, dtype=dtype)
        _expect_tiled(t, q, k, v, f"tiled_attention for query {(*lead, n, d)}, key {(*lead, m, d)}, block={block} "
                      f"({dtype})", block=block)
    # the later blocks' scores are ~300 above the first block's: exp(300) overflows float32 unless every block is
    # taken relative to the maximum so far (a stale maximum gives inf / inf)
    q = torch.full((1, 2, 4), 3.0) + t.randn(1, 2, 4, scale=0.1)
    k = torch.cat([t.randn(1, 4, 4, scale=0.1), torch.full((1, 4, 4), 50.0) + t.randn(1, 4, 4)], dim=1)
    _expect_tiled(t, q, k, t.randn(1, 8, 3), "tiled_attention where the second block's scores are ~300 above the "
                  "first's (float32)", block=4)


@SUITE.check("test_tiled_attention_causal", parts=[TILED])
def tiled_causal(t: Trial) -> None:
    """causal=True: query i sees keys 0..i, for blocks that do and do not divide n."""
    for b, n, d, block in [(2, 7, 4, 3), (1, 8, 2, 4), (2, 5, 3, 1)]:
        x, v = t.randn(b, n, d, scale=1.5), t.randn(b, n, 3)
        _expect_tiled(t, x, x, v, f"tiled_attention(causal=True) for a sequence of {n} positions, block={block}",
                      causal=True, block=block)


@SUITE.check("test_tiled_attention_mask", parts=[TILED])
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


# -- conceptual questions ------------------------------------------------------------------------------

KV_BYTES = 2 * 12 * 16 * 64 * 2 * 1000  # keys and values x layers x heads x head_dim x bytes x tokens


@SUITE.check("test_q_kv_cache_bytes", parts=["q_kv_cache_bytes"])
def q_kv_cache_bytes(t: Trial) -> None:
    """Bytes of a float16 KV cache: 12 layers, 16 heads of 64, 1000 tokens, one sequence."""
    expect_number(t.value("q_kv_cache_bytes"), KV_BYTES, "q_kv_cache_bytes", {
        "that is half: the cache holds both keys and values (a factor 2), and each float16 number takes 2 bytes; "
        "one of the two factors is missing": KV_BYTES // 2,
        "that is float32 (4 bytes a number); the cache is float16, 2 bytes": KV_BYTES * 2,
        "that is one layer's cache: every one of the 12 layers keeps its own keys and values": KV_BYTES // 12,
        "that is one head's cache: every layer has 16 heads, each with its own keys and values": KV_BYTES // 16,
        "that grows with the square of the tokens: the cache holds one key and one value per token, so it grows "
        "linearly": KV_BYTES * 1000,
    }, rel=1e-9)


@SUITE.check("test_q_attention_flops", parts=["q_attention_flops"])
def q_attention_flops(t: Trial) -> None:
    """FLOPs of Q K^T and weights @ V for n = 1024, d = 64 (a multiply-add is 2)."""
    n, d = 1024, 64
    expect_number(t.value("q_attention_flops"), 4 * n * n * d, "q_attention_flops", {
        "that is half: either one of the two products only, or a multiply-add counted as one operation; each "
        "product takes n * n * d multiply-adds = 2 n^2 d operations": 2 * n * n * d,
        "that is linear in n (n d^2 is the cost of a projection); the score matrix has n^2 entries, each a "
        "d-long dot product": 4 * n * d * d,
        "that is the number of entries of the score matrix, not the operations to compute them": n * n,
        "that counts one multiply-add per product and entry (n^2 d) without the factor 2 for the two products and the "
        "two operations": n * n * d,
    }, rel=1e-9)


@SUITE.check("test_q_online_state", parts=["q_online_state"])
def q_online_state(t: Trial) -> None:
    """Running max and sum after the blocks (1, 3) and (2, 5)."""
    value = t.value("q_online_state")
    if isinstance(value, Tensor) and value.numel() == 2:
        value = tuple(value.flatten().tolist())
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise CheckFailed(f"q_online_state should be a tuple of two numbers (running_max, running_sum), got "
                          f"{type(value).__name__}")
    expect_number(value[0], 5.0, "the running max of q_online_state", {
        "that is the first block's maximum: the running max is the largest score over every block so far": 3.0,
        "that is the second block's first score; the maximum of (1, 3, 2, 5) is 5": 2.0,
    })
    e = math.exp
    expect_number(value[1], e(-4) + e(-2) + e(-3) + 1, "the running sum of q_online_state", {
        "the old sum is not rescaled: e^(1-3) + e^(3-3) is relative to the old max 3; multiply it by e^(3-5)":
            e(-2) + 1 + e(-3) + 1,
        "the maximum is stale: every term must be relative to the new max 5, not 3": e(-2) + 1 + e(-1) + e(2),
        "that is the sum of exp(scores) with no maximum subtracted; the running sum is relative to the running max":
            e(1) + e(3) + e(2) + e(5),
        "that is only the second block's sum: the first block's terms stay in, rescaled by e^(3-5)": e(-3) + 1,
        "the rescaling factor is inverted: the old sum is multiplied by e^(M - M') = e^(3-5), not e^(5-3)":
            (e(-2) + 1) * e(2) + e(-3) + 1,
    })
