"""Graded checks for exercise 09_tiny_gpt: ``lm_loss``, ``sample_next``, ``generate``, ``previous_token_score``.

The loss and the score are compared with values computed here from the same inputs; the classic
mistakes (targets not shifted or shifted the wrong way, a sum for a mean, scores averaged over
the wrong axis or read from the wrong diagonal) are computed too and named when the answer equals
one. Sampling is graded by its *distribution*: thousands of rows of the same logits are drawn with
a generator seeded in the student's process, and the frequencies are compared with
``softmax(logits / T)`` and with the distributions the classic mistakes give (temperature after
the softmax, sampling from the logits themselves, top-k keeping k - 1 or k + 1 tokens). Any
correct way of sampling passes. ``generate`` runs on the setup's ``TinyLM``, whose call log (new
tokens, cached tokens) shows how the loop used the cache; greedy tokens are compared with
recomputing everything, calling a second, identical model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from autograder.checks import (CheckFailed, Suite, Trial, close, expect_choice, expect_close, expect_number,
                               expect_tensor)

SUITE = Suite("09_tiny_gpt")
LOSS, SAMPLE, GENERATE, SCORE = "lm_loss", "sample_next", "generate", "previous_token_score"

NOT_SHIFTED = ("the targets are not shifted: logits[:, i] predicts the NEXT token, so compare logits[:, :-1] with "
               "tokens[:, 1:]")
WRONG_WAY = ("the targets are shifted the wrong way: logits[:, i] predicts token i + 1, so compare logits[:, :-1] "
             "with tokens[:, 1:], not logits[:, 1:] with tokens[:, :-1]")
SUMMED = "the loss is summed over the predictions: return the mean (F.cross_entropy's default reduction)"
TEMP_AFTER = ("the temperature is applied after the softmax: dividing probabilities by T changes nothing once they "
              "are normalised again; divide the logits by T before the softmax")
FROM_LOGITS = ("the tokens are drawn in proportion to the logits themselves: turn them into probabilities with a "
               "softmax first")
TEMP_TIMES = "the logits are multiplied by the temperature: divide them by T (T < 1 sharpens, T > 1 flattens)"
NO_TEMP = "the temperature is ignored: divide the logits by temperature before the softmax"
TOP_K_LESS = "top-k keeps k - 1 tokens: keep every logit >= the k-th largest (topk(k).values[:, -1:])"
TOP_K_MORE = "top-k keeps k + 1 tokens: keep only the k largest logits (>= the k-th largest, topk(k).values[:, -1:])"
NO_TOP_K = "top_k is ignored: set every logit below the k-th largest to -inf before the softmax"
NO_GENERATOR = ("two runs with the same seeded generator gave different tokens: pass generator= to "
                "torch.multinomial (or whatever draws the sample)")
NEVER_USED = ("the cache is never used: each step runs without the cache the model returned, so every step "
              "recomputes the whole sequence (or forgets it); pass the returned cache back in and feed only the newest token")
RE_FED = ("the prompt is re-fed every step: together with the cache, feed only the newest token; the cache already "
          "holds the keys and values of everything before it")
TWICE = ("the cache is appended twice: the model already appends the new keys and values to the cache it returns, "
         "so use that cache as it is instead of concatenating it onto the old one")
INCONSISTENT = ("the cache does not match the tokens fed so far: pass exactly the cache the previous call returned")
WRONG_AXIS = ("the scores are averaged over the wrong axis: average over the batch and the positions, keeping one "
              "score per head, shape (H,)")
SELF_DIAG = ("this is the weight of each position on itself (the main diagonal): the previous token is the "
             "diagonal below it, weights[..., i, i - 1] (diagonal offset -1)")
NEXT_DIAG = ("this reads the diagonal above the main one (position i on i + 1, always 0 under a causal mask): "
             "the previous token is weights[..., i, i - 1], offset -1")
WITH_FIRST = ("position 0 is counted, although it has no previous token: average over positions 1..n-1 only")


# -- the loss ---------------------------------------------------------------------------------------------


def _ce(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), targets.reshape(-1), reduction=reduction)


@SUITE.check("test_lm_loss", parts=[LOSS])
def loss_check(t: Trial) -> None:
    """The mean next-token cross-entropy on random logits, against the shifted and unshifted mistakes."""
    for b, n, v in [(3, 7, 5), (1, 2, 9), (4, 5, 11)]:
        logits, tokens = t.randn(b, n, v, scale=2.0), t.randint(0, v, (b, n))
        what = f"lm_loss on logits {(b, n, v)} and tokens {(b, n)}"
        got = t.call(LOSS, logits, tokens)
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.reshape(())
        expected = _ce(logits[:, :-1], tokens[:, 1:])
        expect_close(expect_tensor(got, (), what), expected, what, {
            NOT_SHIFTED: _ce(logits, tokens), WRONG_WAY: _ce(logits[:, 1:], tokens[:, :-1]),
            SUMMED: _ce(logits[:, :-1], tokens[:, 1:], "sum")})


# -- sampling ---------------------------------------------------------------------------------------------

ROWS = 12000


def _frequencies(t: Trial, logits: Tensor, temperature: float, top_k: int | None, seed: int, what: str) -> Tensor:
    generator = t.new("seeded_generator", seed)
    draws = t.call(SAMPLE, logits.repeat(ROWS, 1), temperature, top_k, generator)
    if not isinstance(draws, Tensor) or tuple(draws.shape) != (ROWS,):
        got = tuple(draws.shape) if isinstance(draws, Tensor) else type(draws).__name__
        raise CheckFailed(f"{what} should return one token id per row, shape ({ROWS},), got {got}")
    if draws.is_floating_point() or draws.dtype == torch.bool:
        raise CheckFailed(f"{what} returned {draws.dtype}: return integer token ids")
    if draws.min() < 0 or draws.max() >= logits.shape[-1]:
        raise CheckFailed(f"{what} returned ids outside 0..{logits.shape[-1] - 1}")
    return torch.bincount(draws.long(), minlength=logits.shape[-1]).double() / ROWS


def _keep_top(logits: Tensor, k: int) -> Tensor:
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _expect_distribution(freq: Tensor, expected: Tensor, what: str, mistakes: dict[str, Tensor]) -> None:
    tol = 0.025  # about 8 standard deviations of a frequency from 12 000 draws
    if (freq - expected).abs().max() <= tol:
        return
    for message, wrong in mistakes.items():
        if (freq - wrong).abs().max() <= tol:
            raise CheckFailed(f"{what} is wrong: {message}")
    raise CheckFailed(f"{what}: the frequencies of the drawn tokens {[round(x, 3) for x in freq.tolist()]} do not "
                      f"match softmax(logits / temperature)")


@SUITE.check("test_sample_next_greedy_topk", parts=[SAMPLE])
def sample_greedy_topk(t: Trial) -> None:
    """Temperature 0 is the arg max; top-k draws exactly the k largest logits, in the right proportions; a seeded
    generator gives the same tokens twice."""
    logits = t.randn(5, 9, scale=2.0)
    got = t.call(SAMPLE, logits, 0.0, None, None)
    if not isinstance(got, Tensor) or got.tolist() != logits.argmax(-1).tolist():
        raise CheckFailed("sample_next with temperature 0 should return the arg max of each row (greedy decoding)")
    row = t.randn(1, 8, scale=1.5)
    for k in (3, 6, 1):
        what = f"sample_next with top_k={k}"
        freq = _frequencies(t, row, 1.0, k, 11 + k, what)
        expected = torch.softmax(_keep_top(row.double(), k), -1)[0]
        mistakes = {NO_TOP_K: torch.softmax(row.double(), -1)[0]}
        if k > 1:
            mistakes[TOP_K_LESS] = torch.softmax(_keep_top(row.double(), k - 1), -1)[0]
        mistakes[TOP_K_MORE] = torch.softmax(_keep_top(row.double(), k + 1), -1)[0]
        _expect_distribution(freq, expected, what, mistakes)
    first = t.call(SAMPLE, row.repeat(200, 1), 1.0, None, t.new("seeded_generator", 99))
    second = t.call(SAMPLE, row.repeat(200, 1), 1.0, None, t.new("seeded_generator", 99))
    if not (isinstance(first, Tensor) and isinstance(second, Tensor) and torch.equal(first, second)):
        raise CheckFailed(f"sample_next is not reproducible: {NO_GENERATOR}")


@SUITE.check("test_sample_next_distribution", parts=[SAMPLE])
def sample_distribution(t: Trial) -> None:
    """Frequencies of many draws equal softmax(logits / T) for T < 1 and T > 1; the classic mistakes are named."""
    logits = (t.randn(1, 6).abs() + 0.3) * torch.tensor([[1.0, 2.5, 0.5, 3.0, 1.5, 0.8]])  # positive, distinct
    for temperature in (0.5, 2.5):
        what = f"sample_next at temperature {temperature}"
        freq = _frequencies(t, logits, temperature, None, int(temperature * 10), what)
        l64 = logits.double()[0]
        _expect_distribution(freq, torch.softmax(l64 / temperature, -1), what, {
            TEMP_AFTER: torch.softmax(l64, -1),
            FROM_LOGITS: (l64 / temperature) / (l64 / temperature).sum(),
            TEMP_TIMES: torch.softmax(l64 * temperature, -1)})


# -- generation ---------------------------------------------------------------------------------------------


def _diagnose_log(log, prompt_len: int, max_new: int, what: str) -> None:
    calls = [tuple(int(x) for x in c) for c in log]
    if not calls:
        raise CheckFailed(f"{what}: the model was never called")
    fed = 0
    for i, (s, cached) in enumerate(calls):
        if cached != fed:
            if cached == 0 and i > 0:
                raise CheckFailed(f"{what} is wrong: {NEVER_USED}")
            if cached > fed:
                raise CheckFailed(f"{what} is wrong: {TWICE}")
            raise CheckFailed(f"{what} is wrong: {INCONSISTENT} (call {i}: {cached} cached after {fed} fed)")
        fed += s
    if fed > prompt_len + max_new:
        raise CheckFailed(f"{what} is wrong: {RE_FED}")


def _generate(t: Trial, seed: int, prompt: Tensor, max_new: int, temperature: float, top_k: int | None,
              generator_seed: int | None, what: str) -> tuple[Tensor, list]:
    model = t.new("TinyLM", seed=seed)
    generator = t.new("seeded_generator", generator_seed) if generator_seed is not None else None
    out = t.call(GENERATE, model, prompt, max_new, temperature, top_k, generator)
    b, n = prompt.shape
    if not isinstance(out, Tensor) or tuple(out.shape) != (b, n + max_new):
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise CheckFailed(f"{what} should return (B, n + max_new_tokens) = {(b, n + max_new)}, got {got}")
    if not torch.equal(out[:, :n].long(), prompt):
        raise CheckFailed(f"{what}: the result should start with the prompt")
    return out.long(), model.method("call_log")


@SUITE.check("test_generate_greedy", parts=[GENERATE])
def generate_greedy(t: Trial) -> None:
    """Greedy tokens equal recomputing the whole sequence each step; the cache is used: one token per step."""
    for b, n, max_new in [(2, 3, 6), (3, 1, 4)]:
        seed = int(t.randint(0, 1000, (1,)))
        prompt = t.randint(0, 12, (b, n))
        what = f"generate with temperature 0 from a {(b, n)} prompt"
        out, log = _generate(t, seed, prompt, max_new, 0.0, None, None, what)
        _diagnose_log(log, n, max_new, what)
        reference = t.new("TinyLM", seed=seed)
        expected = prompt
        for _ in range(max_new):
            logits, _ = reference(expected)
            expected = torch.cat([expected, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        if not torch.equal(out, expected):
            raise CheckFailed(f"{what}: tokens {out.tolist()} differ from greedy decoding without a cache "
                              f"{expected.tolist()}")


@SUITE.check("test_generate_sampling", parts=[GENERATE])
def generate_sampling(t: Trial) -> None:
    """With top-k and a seeded generator: the same tokens twice, every new token among the top k of its step."""
    prompt, max_new, k = t.randint(0, 12, (2, 2)), 6, 3
    seed = int(t.randint(0, 1000, (1,)))
    what = f"generate with temperature 1.2 and top_k={k}"
    first, log = _generate(t, seed, prompt, max_new, 1.2, k, 4, what)
    _diagnose_log(log, 2, max_new, what)
    second, _ = _generate(t, seed, prompt, max_new, 1.2, k, 4, what)
    if not torch.equal(first, second):
        raise CheckFailed(f"{what}: two runs with the same seeded generator differ: pass the generator on to "
                          f"sample_next")
    reference = t.new("TinyLM", seed=seed)
    for i in range(2, 2 + max_new):
        logits, _ = reference(first[:, :i])
        allowed = logits[:, -1].topk(k, dim=-1).indices
        if not (allowed == first[:, i:i + 1]).any(-1).all():
            raise CheckFailed(f"{what}: token {i} is not among the {k} most likely of its step: pass top_k to "
                              f"sample_next, and sample from the logits of the last position")


# -- the previous-token score -------------------------------------------------------------------------------


@SUITE.check("test_previous_token_score", parts=[SCORE])
def score_check(t: Trial) -> None:
    """One score per head from random causal weights (B, H, n differ), against the wrong axes and diagonals."""
    b, h, n = 3, 4, 7
    raw = t.randn(b, h, n, n, scale=2.0).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    weights = torch.softmax(raw, dim=-1)
    got = t.call(SCORE, weights)
    diag = weights.double().diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, H, n - 1)
    what = "previous_token_score on weights (B, H, n, n) = (3, 4, 7, 7)"
    if isinstance(got, Tensor) and tuple(got.shape) != (h,):
        if got.numel() == 1 or tuple(got.shape) in ((b,), (n - 1,), (b, h), (h, n - 1), (b, n - 1)):
            raise CheckFailed(f"{what} returned shape {tuple(got.shape)}: {WRONG_AXIS}")
    self_diag = weights.double().diagonal(dim1=-2, dim2=-1)
    with_first = torch.cat([torch.zeros(b, h, 1, dtype=torch.float64), diag], dim=-1).mean(dim=(0, 2))
    expect_close(got, diag.mean(dim=(0, 2)), what, {
        SELF_DIAG: self_diag.mean(dim=(0, 2)), SELF_DIAG + " (from position 1 on)": self_diag[..., 1:].mean(dim=(0, 2)),
        NEXT_DIAG: torch.zeros(h, dtype=torch.float64), WITH_FIRST: with_first})


# -- conceptual questions -----------------------------------------------------------------------------------


@SUITE.check("test_q_uniform_bits", parts=["q_uniform_bits"])
def q_uniform_bits(t: Trial) -> None:
    """log2(64) = 6 bits."""
    expect_number(t.value("q_uniform_bits"), 6.0, "q_uniform_bits", {
        "that is ln 64, the loss in nats; bits use log base 2": math.log(64),
        "that is the vocabulary size; the loss of a uniform guess is its logarithm": 64.0,
        "that is the probability of one character, 1/64; the loss is -log2 of it": 1 / 64})


@SUITE.check("test_q_bits_from_nats", parts=["q_bits_from_nats"])
def q_bits_from_nats(t: Trial) -> None:
    """1.2 nats = 1.2 / ln 2 bits."""
    expect_number(t.value("q_bits_from_nats"), 1.2 / math.log(2), "q_bits_from_nats", {
        "that multiplies by ln 2; one bit is ln 2 nats, so divide by ln 2": 1.2 * math.log(2),
        "that divides by ln 10 or log2(10); bits use ln 2": 1.2 / math.log(10),
        "that is 1.2 * log2(e) computed as 1.2 * ln 10": 1.2 * math.log(10)}, rel=2e-3)


@SUITE.check("test_q_temperature_prob", parts=["q_temperature_prob"])
def q_temperature_prob(t: Trial) -> None:
    """softmax((2, 0) / 0.5)[0] = e^4 / (e^4 + 1)."""
    expect_number(t.value("q_temperature_prob"), math.exp(4) / (math.exp(4) + 1), "q_temperature_prob", {
        "that is the probability at temperature 1: divide the logits by T = 0.5 before the softmax "
        "(applying T after the softmax changes nothing)": math.exp(2) / (math.exp(2) + 1),
        "that multiplies the logits by T; divide them by T": math.exp(1) / (math.exp(1) + 1)}, rel=2e-3)


@SUITE.check("test_q_cache_numbers", parts=["q_cache_numbers"])
def q_cache_numbers(t: Trial) -> None:
    """Keys and values, per layer, per token, E numbers each: 2 L n E."""
    expect_number(t.value("q_cache_numbers"), 2 * 6 * 1000 * 512, "q_cache_numbers", {
        "that counts the keys only (or the values only): the cache holds both": 6 * 1000 * 512,
        "that is one layer's cache: every layer keeps its own keys and values": 2 * 1000 * 512,
        "that counts the keys of one layer only": 1000 * 512,
        "that is the size of an n x n score matrix per layer, which the cache does not hold": 6 * 1000 * 1000},
        rel=1e-9, abs_tol=0.5)


@SUITE.check("test_q_induction_position", parts=["q_induction_position"])
def q_induction_position(t: Trial) -> None:
    """In x a b c y a, at the last a the induction head attends to b (position 2), which followed the earlier a."""
    expect_choice(t.value("q_induction_position"), "2", "q_induction_position", ["0", "1", "2", "4"], {
        "1": "position 1 is the earlier a itself; an induction head attends to the token that FOLLOWED it, "
             "which is what it predicts comes next",
        "4": "position 4 is the previous token; that is a previous-token head, not an induction head",
        "0": "position 0 is the first token; an induction head looks for the earlier occurrence of the current token"})


# -- the induction circuit ----------------------------------------------------------------------------------
# The grader's own copy of the exercise's CopyToy and make_repeats (its setup cell): the answers to Q6 and Q7
# are recomputed here, never read from the student's objects.

INDUCTION = "induction_score"
FIXED_OFFSET = ("one offset for every sequence: use each sequence's own first[b] and length[b] (the key of "
                "query i in sequence b is i - length[b] + 1)")
SAME_TOKEN = ("this is the weight on the earlier occurrence of the token itself, i - length; an induction head "
              "attends to the token AFTER it, i - length + 1, which is what comes next")
PREVIOUS = "this is the weight on the previous token, i - 1: a previous-token head, not an induction head"
LAST_QUERY = ("the last token of the second copy is counted: its next token is not a copy, so the queries end at "
              "first + 2 length - 2")
PER_SEQUENCE = ("the scores are averaged per sequence first: average over all (sequence, query) pairs together, "
                "so a sequence with a longer block counts for more queries")


class _CopyToy:
    """The exercise's hand-set 2-layer circuit: layer 0 head 1 looks one back, layer 1 head 0 copies."""

    def __init__(self, vocab_size: int = 16, max_len: int = 20, sharpness: float = 12.0) -> None:
        V1, n = vocab_size + 1, max_len
        self.V1, self.max_len, self.beta = V1, n, sharpness
        self.tok, self.pos = slice(0, V1), slice(V1, V1 + n)
        self.prev, self.copy = slice(V1 + n, 2 * V1 + n), slice(2 * V1 + n, 3 * V1 + n)
        self.dim = 3 * V1 + n

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        n = q.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        weights = torch.softmax((self.beta * q @ k.transpose(1, 2)).masked_fill(~causal, float("-inf")), -1)
        return weights @ v, weights

    def __call__(self, tokens: Tensor, head_mask: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        B, n = tokens.shape
        mask = torch.ones(2, 2) if head_mask is None else head_mask
        x = torch.zeros(B, n, self.dim)
        x[..., self.tok] = F.one_hot(tokens, self.V1).float()
        x[..., self.pos] = torch.eye(self.max_len)[:n]
        pos, nothing = x[..., self.pos], torch.zeros_like(x)
        out00, w00 = self._attend(pos, pos, nothing)
        v01 = torch.zeros_like(x)
        v01[..., self.prev] = x[..., self.tok]
        out01, w01 = self._attend(pos.roll(-1, dims=-1), pos, v01)
        x = x + mask[0, 0] * out00 + mask[0, 1] * out01
        v10 = torch.zeros_like(x)
        v10[..., self.copy] = x[..., self.tok]
        out10, w10 = self._attend(x[..., self.tok], x[..., self.prev], v10)
        first = torch.zeros(B, n, 1)
        first[:, 0] = 1
        out11, w11 = self._attend(torch.ones(B, n, 1), first, nothing)
        x = x + mask[1, 0] * out10 + mask[1, 1] * out11
        return 8.0 * x[..., self.copy], [torch.stack([w00, w01], 1), torch.stack([w10, w11], 1)]


def _make_repeats(batch: int, n: int = 20, vocab_size: int = 16, lengths: tuple[int, int] = (3, 8),
                  seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch, n), generator=g)
    tokens[:, 0] = vocab_size
    length = torch.randint(lengths[0], lengths[1] + 1, (batch,), generator=g)
    first = torch.stack([torch.randint(1, n - 2 * int(l) + 1, (1,), generator=g)[0] for l in length])
    for b in range(batch):
        f, l = int(first[b]), int(length[b])
        tokens[b, f + l:f + 2 * l] = tokens[b, f:f + l]
    return tokens, first, length


def _induction(weights: Tensor, first: Tensor, length: Tensor, back: Tensor | None = None, last: int = 2,
               pooled: bool = True) -> Tensor:
    """Reference score (key i - (length - 1), queries up to first + 2 length - 2, pooled over sequences and
    queries) and its classic variants: another distance ``back`` (B,), another last query, per-sequence means."""
    B, H, n, _ = weights.shape
    i = torch.arange(n)
    queries = ((i >= (first + length)[:, None]) & (i <= (first + 2 * length - last)[:, None])).double()
    keys = (i - (length - 1 if back is None else back)[:, None]).clamp(min=0)  # (B, n)
    picked = weights.double().gather(-1, keys[:, None, :, None].expand(B, H, n, 1))[..., 0]  # (B, H, n)
    if pooled:
        return (picked * queries[:, None]).sum(dim=(0, 2)) / queries.sum()
    return ((picked * queries[:, None]).sum(-1) / queries.sum(-1)[:, None]).mean(0)


@SUITE.check("test_induction_score", parts=[INDUCTION])
def induction_check(t: Trial) -> None:
    """One score per head from random causal weights and per-sequence offsets, against fixed offsets, the wrong
    keys, the last query counted and per-sequence means."""
    b, h, n = 6, 3, 16
    raw = t.randn(b, h, n, n, scale=2.0).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    weights = torch.softmax(raw, dim=-1)
    length = t.randint(2, 8, (b,))
    length[:2] = torch.tensor([7, 3])  # two lengths at least, far apart
    first = torch.stack([t.randint(1, n - 2 * int(l) + 1, (1,))[0] for l in length])
    what = f"induction_score on weights (B, H, n, n) = {(b, h, n, n)} with per-sequence first and length"
    got = t.call(INDUCTION, weights, first, length)
    if isinstance(got, Tensor) and tuple(got.shape) != (h,) and got.numel() in (1, b, b * h):
        raise CheckFailed(f"{what} returned shape {tuple(got.shape)}: return one score per head, (H,)")
    expect_close(got, _induction(weights, first, length), what, {
        FIXED_OFFSET: _induction(weights, first[:1].expand(b), length[:1].expand(b)),
        FIXED_OFFSET + " (not the first sequence's)": _induction(weights, first, length, back=length[:1] - 1),
        SAME_TOKEN: _induction(weights, first, length, back=length),
        PREVIOUS: _induction(weights, first, length, back=torch.ones_like(length)),
        LAST_QUERY: _induction(weights, first, length, last=1),
        PER_SEQUENCE: _induction(weights, first, length, pooled=False)})


@SUITE.check("test_q_prev_head", parts=["q_prev_head"])
def q_prev_head(t: Trial) -> None:
    """Layer 0's previous-token head of the hand-set circuit, recomputed here."""
    tokens, _, _ = _make_repeats(256)
    _, weights = _CopyToy()(tokens)
    scores = weights[0].diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))  # (2,)
    expected = int(scores.argmax())
    expect_number(t.value("q_prev_head"), expected, "q_prev_head", {
        f"head {1 - expected} of layer 0 attends to each position itself (score "
        f"{scores[1 - expected]:.2f}); the previous-token head puts its weight on position i - 1": 1 - expected},
        rel=0, abs_tol=0.01)


@SUITE.check("test_q_induction_ablated", parts=["q_induction_ablated"])
def q_induction_ablated(t: Trial) -> None:
    """The induction score of layer 1 head 0 with the previous-token head removed, recomputed on the same data."""
    tokens, first, length = _make_repeats(256)
    toy = _CopyToy()

    def score(layer: int, head: int) -> float:
        mask = torch.ones(2, 2)
        mask[layer, head] = 0
        return float(_induction(toy(tokens, mask)[1][1], first, length)[0])

    intact = float(_induction(toy(tokens)[1][1], first, length)[0])
    prev_head = int(toy(tokens)[1][0].diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2)).argmax())
    expect_number(t.value("q_induction_ablated"), score(0, prev_head), "q_induction_ablated", {
        f"that is the score with every head in place ({intact:.3f}), or with a head removed that the "
        "induction head does not depend on: remove the previous-token head of Q6": intact,
        "that is head 1 of layer 1, which never attends after an earlier occurrence: the induction head is "
        "layer 1, head 0": float(_induction(toy(tokens, torch.tensor([[1.0, 0.0], [1.0, 1.0]]))[1][1],
                                          first, length)[1])}, rel=2e-3, abs_tol=1e-4)
