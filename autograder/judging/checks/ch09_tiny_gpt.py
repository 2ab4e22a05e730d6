"""Checks of exercise 09_tiny_gpt. The fixtures the student's code receives (the model, the seeded generators) are
built from :mod:`trusted_lm`'s text in a namespace of their own in the student's process (``Trial.trusted``); the
references are computed here, on the judge's copy. Sampling is graded by the distribution of 12 000 draws and by its
randomness, so any correct way of drawing passes; ``generate`` runs on ``CacheProbeLM``, whose outputs change when a
generated position is recomputed. Forgeable, as those objects live in the student's process: a ``generate`` that
tampers with the model (in plain sight) or rebuilds the cache one token per call (a cached loop's calls), and a
sampler right on these logits only (they are drawn per student from the grading secret)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from autograder.judging.checks import (CheckFailed, Suite, Trial, choice, expect_close, expect_number,
                                       expect_tensor, fail_if_named, number, requirements, trusted_lm)
from autograder.judging.checks.trusted_lm import CacheProbeLM

FIXTURES = inspect.getsource(trusted_lm)  # sent into the student's process, executed there in a namespace of its own

SUITE = Suite("09_tiny_gpt")
LOSS, SAMPLE, GENERATE, SCORE = "lm_loss", "sample_next", "generate", "previous_token_score"

NOT_SHIFTED = ("the targets are not shifted: logits[:, i] predicts the NEXT token, so compare logits[:, :-1] with "
               "tokens[:, 1:]")
WRONG_WAY = ("the targets are shifted the wrong way: logits[:, i] predicts token i + 1, so compare logits[:, :-1] "
             "with tokens[:, 1:], not logits[:, 1:] with tokens[:, :-1]")
SUMMED = "the loss is summed over the predictions: return the mean (F.cross_entropy's default reduction)"
IN_BITS = "the loss is in bits: return it in nats (natural logarithm, what F.cross_entropy gives)"
TOP_K_LESS = "top-k keeps k - 1 tokens: keep every logit >= the k-th largest (topk(k).values[:, -1:])"
TOP_K_MORE = "top-k keeps k + 1 tokens: keep only the k largest logits (>= the k-th largest, topk(k).values[:, -1:])"
NO_TOP_K = "top_k is ignored: set every logit below the k-th largest to -inf before the softmax"
IGNORES_GENERATOR = ("two different seeds gave exactly the same tokens: the draws do not depend (or hardly depend) on "
                     "the generator passed in (no randomness at all, or torch's global generator reseeded); draw each "
                     "row with generator=generator")
NOT_INDEPENDENT = ("the rows are not drawn independently: draw each row with its own random number (torch.multinomial "
                   "does, or torch.rand(B, 1, generator=generator) for an inverse-CDF draw)")
SHARED_DRAW = "every row shares one random draw: " + NOT_INDEPENDENT
NEVER_USED = ("the cache is never used: each step runs without the cache the model returned, so every step recomputes "
              "the whole sequence (or forgets it); pass the returned cache back in and feed only the newest token")
RE_FED = ("the prompt is re-fed every step: together with the cache, feed only the newest token; the cache already "
          "holds the keys and values of everything before it")
TWICE = ("the cache is appended twice: the model already appends the new keys and values to the cache it returns, "
         "so use that cache as it is instead of concatenating it onto the old one")
SELF_DIAG = ("this is the weight of each position on itself (the main diagonal): the previous token is the "
             "diagonal below it, weights[..., i, i - 1] (diagonal offset -1)")
NEXT_DIAG = ("this reads the diagonal above the main one (position i on i + 1, always 0 under a causal mask): "
             "the previous token is weights[..., i, i - 1], offset -1")
WITH_FIRST = ("position 0 is counted, although it has no previous token: average over positions 1..n-1 only")

_LM, _TOPK, _DRAWS = "test_lm_loss", "test_sample_next_greedy_topk", "test_sample_next_distribution"
_GREEDY, _SAMPLED, _PREV, _IND = ("test_generate_greedy", "test_generate_sampling", "test_previous_token_score",
                                  "test_induction_score")
_SAMPLES, _GENERATES = (_TOPK, _DRAWS), (_GREEDY, _SAMPLED)
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'loss: logits[:, i] predicts tokens[:, i + 1]': (_LM, 'not shifted', 'the targets tokens[:, i + 1]'),
    'loss: the shift goes forward': (_LM, 'wrong way', 'the first token is never predicted'),
    'loss: the mean, not the sum': (_LM, 'summed', 'return the mean cross-entropy'),
    'loss: in nats': (_LM, 'in bits', 'the mean cross-entropy in nats'),
    'loss: a scalar tensor': (_LM, 'scalar tensor', 'in nats (a scalar tensor)'),
    'sample: temperature 0 is the arg max': (_TOPK, 'arg max of each row', 'means greedy: the arg max'),
    'sample: temperature divides the logits before the softmax': (_DRAWS, 'after the softmax', 'by temperature before'),
    'sample: divide by the temperature, not multiply': (_DRAWS, 'multiplied', 'logits by temperature'),
    'sample: draw from the softmax probabilities': (_DRAWS, 'logits themselves', 'from the probabilities', (_TOPK,)),
    'sample: top_k keeps the k largest, not k - 1': (_TOPK, 'k - 1 tokens', 'only the k largest logits'),
    'sample: top_k keeps the k largest, not k + 1': (_TOPK, 'k + 1 tokens', 'only the k largest logits'),
    'sample: top_k used': (_TOPK, 'top_k is ignored', 'set the others to -\\infty before the softmax'),
    'sample: the same seeded generator repeats the draws': (_SAMPLES, 'not reproducible', 'same tokens every time'),
    'sample: another seed draws other tokens': (_SAMPLES, 'different seeds gave exactly', 'another seed other tokens'),
    'sample: each row drawn independently': (_SAMPLES, 'shares one random draw', 'drawn independently of'),
    'sample: (B,) int64 ids': (_SAMPLES, 'int64', 'one token id per row, (b,) int64'),
    'generate: the prompt followed by the new tokens': (_GENERATES, 'ids of shape', 'prompt followed by'),
    'generate: (B, n + max_new_tokens) int64': (_GENERATES, 'int64', '(b, n + max_new_tokens) int64'),
    'generate: the cache is used': (_GENERATES, 'never used', 'run the prompt through the model once'),
    'generate: only the newest token is fed': (_GENERATES, 're-fed', 'feed only the newest token together'),
    'generate: the model appends to the cache itself': (_GENERATES, 'appended twice', 'new keys and values itself'),
    "generate: the last position's logits": (_GENERATES, 'last position', 'the logits at the last position'),
    'generate: temperature passed on': (_GREEDY, 'differ from greedy decoding', 'on temperature, top_k'),
    'generate: top_k passed on': (_SAMPLED, 'pass top_k to sample_next', 'passing on temperature, top_k'),
    'generate: the generator passed on': (_SAMPLED, 'same seeded generator differ', 'generator repeats the same'),
    'score: one score per head': (_PREV, 'wrong axis', 'batch. return one score per head'),
    'score: position i on position i - 1': (_PREV, 'main diagonal', 'from position i on position i - 1'),
    'score: positions i >= 1 only': (_PREV, 'position 0 is counted', 'over every i \\ge 1'),
    "induction: each sequence's own first and length": (_IND, 'one offset', 'first[b] and length length[b]'),
    'induction: the key after the earlier occurrence': (_IND, 'of the token itself', 'on the key i - \\ell + 1'),
    'induction: not a fixed distance back': (_IND, 'previous-token head', 'a fixed distance back cannot'),
    'induction: the last token of the second copy is not a query': (_IND, 'last token', 'copy but its last token'),
    'induction: pooled over (sequence, query) pairs': (_IND, 'per sequence', '(sequence, query) pairs'),
    'induction: one score per head': (_IND, 'one score per head', 'score per head, (h,). because'),
    'q1: a uniform loss in bits': ('test_q_uniform_bits', 'nats', 'its loss on any text, in bits'),
    'q2: nats to bits': ('test_q_bits_from_nats', 'divide by ln 2', 'what is that in bits per character'),
    'q3: the temperature divides the logits': ('test_q_temperature_prob', 'before the softmax', 'temperature t = 0.5'),
    'q4: keys and values': ('test_q_cache_numbers', 'keys only', 'numbers does its key-value cache hold'),
    'q4: every layer': ('test_q_cache_numbers', 'one layer', 'l = 6 layers of width e = 512'),
    'q5: the token after the earlier occurrence': ('test_q_induction_position', 'previous-token head',
        'which position does an induction head attend to'),
    "q6: layer 0's previous-token head": ('test_q_prev_head', 'each position itself', 'which head of layer 0'),
    'q6: the index as an int, not a bool': ('test_q_prev_head', 'not true or false', 'true and false are not accepted'),
    'q7: the score with the previous-token head removed': ('test_q_induction_ablated', 'every head in place',
        'remove the previous-token head you found'),
})


# -- the loss ---------------------------------------------------------------------------------------------


def _ce(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), targets.reshape(-1), reduction=reduction)


def _scalar(got: object, expected: Tensor, what: str, wrong: dict[str, Tensor]) -> None:
    if isinstance(got, Tensor) and got.numel() != 1:
        raise CheckFailed(f"{what} has shape {tuple(got.shape)}: return one number, the mean over the B (n - 1) "
                          "predictions, as a scalar tensor (shape ()), not one loss per prediction")
    expect_close(expect_tensor(got.reshape(()) if isinstance(got, Tensor) else got, (), what), expected, what, wrong)


SUITE.oracle("test_lm_loss", LOSS, "The mean next-token cross-entropy on random logits, against the shifted and "
             "unshifted mistakes.", cases=[(3, 7, 5), (1, 2, 9), (4, 5, 11)],
             draw=lambda t, b, n, v: (t.randn(b, n, v, scale=2.0), t.randint(0, v, (b, n))),
             reference=lambda logits, tokens: _ce(logits[:, :-1], tokens[:, 1:]),
             mistakes=lambda logits, tokens: {
                 NOT_SHIFTED: _ce(logits, tokens), WRONG_WAY: _ce(logits[:, 1:], tokens[:, :-1]),
                 SUMMED: _ce(logits[:, :-1], tokens[:, 1:], "sum"),
                 IN_BITS: _ce(logits[:, :-1], tokens[:, 1:]) / math.log(2)},
             what=lambda logits, tokens: f"lm_loss on logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)}",
             compare=_scalar)


# -- sampling ---------------------------------------------------------------------------------------------

ROWS = 12000


def _ids(got: object, shape: tuple[int, ...], vocab: int, what: str) -> Tensor:
    """``got`` must be int64 token ids of ``shape``, each in ``0 .. vocab - 1``."""
    if not isinstance(got, Tensor) or tuple(got.shape) != shape:
        found = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
        raise CheckFailed(f"{what} should return token ids of shape {shape}, got {found}")
    if got.is_floating_point() or got.dtype == torch.bool:
        raise CheckFailed(f"{what} returned {got.dtype}: return integer token ids, int64")
    if got.dtype != torch.int64:
        raise CheckFailed(f"{what} returned {got.dtype} token ids: the stated type is int64 (torch.long), what argmax "
                          "and torch.multinomial return; convert with .long() if your way of drawing gives another")
    if got.numel() and (got.min() < 0 or got.max() >= vocab):
        raise CheckFailed(f"{what} returned ids outside 0..{vocab - 1}")
    return got


def _keep_top(logits: Tensor, k: int) -> Tensor:  # every logit below the k-th largest set to -inf
    return logits.masked_fill(logits < logits.topk(k, dim=-1).values[..., -1:], float("-inf"))


def _expect_sampled(t: Trial, logits: Tensor, temperature: float, top_k: int | None, seed: int, what: str,
                    expected: Tensor, mistakes: dict[str, Tensor]) -> None:
    """Draws of ``ROWS`` identical rows: frequencies equal ``expected`` (a known mistake's are named), the same seed
    gives the same draws, another seed other draws, and neighbouring rows agree no more often than independent draws."""
    def draw(seed: int) -> Tensor:  # sample_next on ROWS copies of the row logits (1, V), the generator seeded seed
        got = t.call(SAMPLE, logits.repeat(ROWS, 1), temperature, top_k, t.trusted(FIXTURES, "seeded_generator", seed))
        return _ids(got, (ROWS,), logits.shape[-1], what)

    draws = draw(seed)
    same = float((expected ** 2).sum())  # the chance that two independent draws give the same token
    if same < 0.9 and bool((draws == draws[0]).all()):
        raise CheckFailed(f"{what}: every row drew token {int(draws[0])}: {SHARED_DRAW}")
    freq = torch.bincount(draws, minlength=logits.shape[-1]).double() / ROWS
    tol = 0.025  # about 8 standard deviations of a frequency from 12 000 draws
    if (freq - expected).abs().max() > tol:
        fail_if_named(freq, mistakes, what, lambda a, b: (a - b).abs().max() <= tol)
        raise CheckFailed(f"{what}: the frequencies of the drawn tokens {[round(x, 3) for x in freq.tolist()]} do "
                          "not match softmax(logits / temperature)")
    if same >= 0.9:
        return  # (nearly) one token can be drawn: the draws cannot show what the generator does
    if not torch.equal(draw(seed), draws):
        raise CheckFailed(f"{what} is not reproducible: two runs with the same seeded generator gave different "
                          "tokens: pass generator= to torch.multinomial (or whatever draws the sample)")
    if torch.equal(draw(seed + 7919), draws):
        raise CheckFailed(f"{what}: {IGNORES_GENERATOR}")
    agree = float((draws[0::2] == draws[1::2]).double().mean())
    if abs(agree - same) > 0.04:  # about 6 standard deviations of that fraction over 6000 pairs
        raise CheckFailed(f"{what}: {agree:.2f} of neighbouring rows drew the same token, where independent draws "
                          f"agree {same:.2f} of the time: {NOT_INDEPENDENT}")


@SUITE.check("test_sample_next_greedy_topk", parts=[SAMPLE])
def sample_greedy_topk(t: Trial) -> None:
    """Temperature 0 is the arg max; top-k draws exactly the k largest logits, in the right proportions, at random:
    the same seed gives the same tokens, another seed others."""
    logits = t.randn(5, 9, scale=2.0)
    got = _ids(t.call(SAMPLE, logits, 0.0, None, None), (5,), 9, "sample_next with temperature 0")
    if got.tolist() != logits.argmax(-1).tolist():
        raise CheckFailed("sample_next with temperature 0 should return the arg max of each row (greedy decoding)")
    row = t.randn(1, 8, scale=1.5)
    for k in (3, 6, 1):
        right, less, more, every = [torch.softmax(_keep_top(row.double(), j), -1)[0]
                                    for j in (k, max(k - 1, 1), k + 1, 8)]  # 8: every one of the 8 tokens
        _expect_sampled(t, row, 1.0, k, 11 + k, f"sample_next with top_k={k}", right,
                        {NO_TOP_K: every, **({TOP_K_LESS: less} if k > 1 else {}), TOP_K_MORE: more})


@SUITE.check("test_sample_next_distribution", parts=[SAMPLE])
def sample_distribution(t: Trial) -> None:
    """Frequencies of many draws equal softmax(logits / T) for T < 1 and T > 1, drawn at random with the generator;
    the classic mistakes are named."""
    logits = (t.randn(1, 6).abs() + 0.3) * torch.tensor([[1.0, 2.5, 0.5, 3.0, 1.5, 0.8]])  # positive, distinct
    l64 = logits.double()[0]
    for temperature in (0.5, 2.5):
        scaled, what = l64 / temperature, f"sample_next at temperature {temperature}"
        _expect_sampled(t, logits, temperature, None, int(temperature * 10), what, torch.softmax(scaled, -1), {
            "the temperature is applied after the softmax: dividing probabilities by T changes nothing once they are "
            "normalised again; divide the logits by T before the softmax": torch.softmax(l64, -1),
            "the tokens are drawn in proportion to the logits themselves: turn them into probabilities with a softmax "
            "first": scaled / scaled.sum(),
            "the logits are multiplied by the temperature: divide them by T (T < 1 sharpens, T > 1 flattens)":
                torch.softmax(l64 * temperature, -1)})


# -- generation ---------------------------------------------------------------------------------------------

VOCAB = 12  # CacheProbeLM's default vocabulary, which the prompts are drawn from
LOOP_MISTAKES = {"recomputed": NEVER_USED, "dropped": NEVER_USED, "re-fed": RE_FED, "twice": TWICE}


def _loop(model: CacheProbeLM, prompt: Tensor, max_new: int, way: str,
          pick: Callable[[int, Tensor], Tensor] | None = None) -> tuple[Tensor | None, list[Tensor] | None]:
    """Generation on the judge's copy of the model, the loop written ``way``: "cached" (the newest token fed with the
    returned cache), or a mistake's of ``LOOP_MISTAKES``: "recomputed" (every token, no cache), "dropped" (the newest
    token, no cache), "re-fed" (every token with the cache), "twice" (the returned cache appended to the old). The
    tokens ``(B, n + max_new)`` and the logits ``(B, V)`` each step drew from (None, None where a mistake's loop runs
    out of positions); ``pick(step, logits)``: the step's tokens ``(B, 1)`` (the arg max, or the student's tokens)."""
    tokens, step_input, cache, lasts = prompt, prompt, None, []
    with torch.no_grad():
        for step in range(max_new):
            try:
                logits, returned = model(tokens if way in ("recomputed", "re-fed") else step_input, cache)
            except ValueError:  # more positions than the model has
                return None, None
            if way == "twice" and cache is not None:
                returned = tuple(torch.cat([old, new], 1) for old, new in zip(cache, returned))
            cache = None if way in ("recomputed", "dropped") else returned
            lasts.append(logits[:, -1].double())
            step_input = logits[:, -1].argmax(-1, keepdim=True) if pick is None else pick(step, logits[:, -1])
            tokens = torch.cat([tokens, step_input], dim=1)
    return tokens, lasts


def _greedy_tokens(model: CacheProbeLM, prompt: Tensor, max_new: int, way: str) -> Tensor | None:
    """Greedy tokens of the loop ``way``; None where a mistake's loop runs out of positions."""
    return _loop(model, prompt, max_new, way)[0]


def _model(t: Trial, prompt: Tensor, max_new: int) -> tuple[int, CacheProbeLM, Tensor]:
    """A model seed for which recomputing gives other greedy tokens than the cache (almost every seed does), so that a
    loop without the cache cannot pass by chance; the judge's copy of that model, and its greedy tokens."""
    for _ in range(50):
        seed = int(t.randint(0, 1 << 30, (1,)))
        model = CacheProbeLM(prompt.shape[1], seed=seed)
        cached = _greedy_tokens(model, prompt, max_new, "cached")
        if not torch.equal(cached, _greedy_tokens(model, prompt, max_new, "recomputed")):
            return seed, model, cached
    raise RuntimeError("no model found whose cache shows: revisit CacheProbeLM")


def _generated(t: Trial, seed: int, prompt: Tensor, max_new: int, temperature: float, top_k: int | None,
               generator_seed: int | None, what: str) -> Tensor:
    """The student's ``generate`` on a fresh copy of the grader's model (and generator) in the student's process."""
    b, n = prompt.shape
    model = t.trusted(FIXTURES, "CacheProbeLM", n, seed=seed)
    generator = None if generator_seed is None else t.trusted(FIXTURES, "seeded_generator", generator_seed)
    out = _ids(t.call(GENERATE, model, prompt, max_new, temperature, top_k, generator), (b, n + max_new), VOCAB, what)
    if not torch.equal(out[:, :n], prompt):
        raise CheckFailed(f"{what}: the result should start with the prompt")
    return out


@SUITE.check("test_generate_greedy", parts=[GENERATE])
def generate_greedy(t: Trial) -> None:
    """Greedy tokens equal the judge's own greedy loop with the cache, on a model whose outputs change when a
    generated position is recomputed: the cache is used, one new token a step."""
    for b, n, max_new in [(2, 3, 6), (3, 1, 4)]:
        prompt = t.randint(0, VOCAB, (b, n))
        what = f"generate with temperature 0 from a {(b, n)} prompt"
        seed, model, expected = _model(t, prompt, max_new)
        out = _generated(t, seed, prompt, max_new, 0.0, None, None, what)
        if torch.equal(out, expected):
            continue
        fail_if_named(out, ((m, _greedy_tokens(model, prompt, max_new, w)) for w, m in LOOP_MISTAKES.items()),
                      what, lambda a, b: b is not None and torch.equal(a, b))
        raise CheckFailed(f"{what}: tokens {out.tolist()} differ from greedy decoding with the cache "
                          f"{expected.tolist()} (the arg max of the logits at the last position, each new token "
                          "fed alone with the cache the model returned)")


@SUITE.check("test_generate_sampling", parts=[GENERATE])
def generate_sampling(t: Trial) -> None:
    """With top-k and a seeded generator: the same tokens twice, other tokens with other seeds, every new token
    among the top k of its step (the step's logits computed here, with the cache)."""
    prompt, max_new, k, temperature = t.randint(0, VOCAB, (4, 2)), 6, 3, 1.2
    what = f"generate with temperature {temperature} and top_k={k}"
    seed, model, _ = _model(t, prompt, max_new)
    first = _generated(t, seed, prompt, max_new, temperature, k, 4, what)
    if not torch.equal(_generated(t, seed, prompt, max_new, temperature, k, 4, what), first):
        raise CheckFailed(f"{what}: two runs with the same seeded generator differ: pass the generator on to "
                          "sample_next")
    n = prompt.shape[1]
    forced = lambda step, logits: first[:, n + step:n + step + 1]  # noqa: E731 - the student's tokens, step by step
    outside = lambda lasts: [i for i, logits in enumerate(lasts)  # noqa: E731 - steps whose token is not in the top k
                             if not (logits.topk(k, dim=-1).indices == first[:, n + i:n + i + 1]).any(-1).all()]
    _, lasts = _loop(model, prompt, max_new, "cached", forced)
    if outside(lasts):
        fail_if_named(None, ((m, _loop(model, prompt, max_new, w, forced)[1]) for w, m in LOOP_MISTAKES.items()), what,
                      lambda _, wrong: wrong is not None and not outside(wrong))
        raise CheckFailed(f"{what}: token {n + outside(lasts)[0]} is not among the {k} most likely of its step: pass "
                          "top_k to sample_next, and sample from the logits of the last position")
    # The chance that another seed draws these very tokens again; two other seeds that both do are no accident.
    p_same = math.prod(float(torch.softmax(_keep_top(logits, k) / temperature, -1).gather(-1, first[:, n + i:n + i + 1])
                             .prod()) for i, logits in enumerate(lasts))
    if p_same < 1e-3 and all(torch.equal(_generated(t, seed, prompt, max_new, temperature, k, s, what), first)
                             for s in (5, 6)):
        raise CheckFailed(f"{what}: {IGNORES_GENERATOR}")


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
            raise CheckFailed(f"{what} returned shape {tuple(got.shape)}: the scores are averaged over the wrong "
                              "axis: average over the batch and the positions, keeping one score per head, shape (H,)")
    self_diag = weights.double().diagonal(dim1=-2, dim2=-1)
    expect_close(got, diag.mean(dim=(0, 2)), what, {
        SELF_DIAG: self_diag.mean(dim=(0, 2)), SELF_DIAG + " (from position 1 on)": self_diag[..., 1:].mean(dim=(0, 2)),
        NEXT_DIAG: torch.zeros(h, dtype=torch.float64), WITH_FIRST: diag.sum(dim=(0, 2)) / (b * n)})


# -- conceptual questions -----------------------------------------------------------------------------------


SUITE.questions({  # value, words (the check's description), named mistakes, points
    "q_uniform_bits": number(6.0, "log2(64) = 6 bits.", {
        "that is ln 64, the loss in nats; bits use log base 2": math.log(64),
        "that is the vocabulary size; the loss of a uniform guess is its logarithm": 64.0,
        "that is the probability of one character, 1/64; the loss is -log2 of it": 1 / 64}),
    "q_bits_from_nats": number(1.2 / math.log(2), "1.2 nats = 1.2 / ln 2 bits.", {
        "that multiplies by ln 2; one bit is ln 2 nats, so divide by ln 2": 1.2 * math.log(2),
        "that divides by ln 10 or log2(10); bits use ln 2": 1.2 / math.log(10),
        "that is 1.2 * log2(e) computed as 1.2 * ln 10": 1.2 * math.log(10)}, rel=2e-3),
    "q_temperature_prob": number(math.exp(4) / (math.exp(4) + 1), "softmax((2, 0) / 0.5)[0] = e^4 / (e^4 + 1).", {
        "that is the probability at temperature 1: divide the logits by T = 0.5 before the softmax "
        "(applying T after the softmax changes nothing)": math.exp(2) / (math.exp(2) + 1),
        "that multiplies the logits by T; divide them by T": math.exp(1) / (math.exp(1) + 1)}, rel=2e-3),
    "q_cache_numbers": number(2 * 6 * 1000 * 512, "Keys and values, per layer, per token, E numbers each: 2 L n E.", {
        "that counts the keys only (or the values only): the cache holds both": 6 * 1000 * 512,
        "that is one layer's cache: every layer keeps its own keys and values": 2 * 1000 * 512,
        "that counts the keys of one layer only": 1000 * 512,
        "that is the size of an n x n score matrix per layer, which the cache does not hold": 6 * 1000 * 1000},
        rel=1e-9, abs_tol=0.5),
    "q_induction_position": choice("2", "In x a b c y a, at the last a the induction head attends to b (position 2), "
                                   "which followed the earlier a.", ["0", "1", "2", "4"], {
        "1": "position 1 is the earlier a itself; an induction head attends to the token that FOLLOWED it, "
             "which is what it predicts comes next",
        "4": "position 4 is the previous token; that is a previous-token head, not an induction head",
        "0": "position 0 is the first token; an induction head looks for the earlier occurrence of the current token"}),
})


# -- the induction circuit ----------------------------------------------------------------------------------
# The answers to Q6 and Q7 are recomputed here from the exercise's setup cell (CopyToy, make_repeats), never read
# from the student's objects.

INDUCTION = "induction_score"
FIXED_OFFSET = ("one offset for every sequence: use each sequence's own first[b] and length[b] (the key of "
                "query i in sequence b is i - length[b] + 1)")


def _toy_weights(tokens: Tensor, head_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The attention weights (B, 2, n, n) of layers 0 and 1 of the exercise's hand-set ``CopyToy()`` (vocabulary 16
    and a start token, 20 positions, sharpness 12). Its logits are not needed: only the output of layer 0 head 1 (the
    previous-token head) reaches a weight, so ``head_mask[0, 1]`` is the only entry that changes one."""
    n, eye = tokens.shape[1], torch.eye(20)
    causal = torch.ones(n, n, dtype=torch.bool).tril()

    def attend(q: Tensor, k: Tensor) -> Tensor:
        return torch.softmax((12.0 * q @ k.transpose(-2, -1)).masked_fill(~causal, float("-inf")), -1)

    tok, pos = F.one_hot(tokens, 17).float(), eye[:n]
    w00, w01 = attend(pos, pos), attend(pos.roll(-1, dims=-1), pos)  # on the positions alone: the same in each row
    prev = (1.0 if head_mask is None else head_mask[0, 1]) * (w01 @ tok)  # the previous-token slot after layer 0
    w10, w11 = attend(tok, prev), attend(torch.ones(n, 1), eye[:n, :1])  # the induction head, and one on position 0
    batch = (tokens.shape[0], n, n)
    return torch.stack([w00.expand(batch), w01.expand(batch)], 1), torch.stack([w10, w11.expand(batch)], 1)


def _make_repeats(batch: int) -> tuple[Tensor, Tensor, Tensor]:  # make_repeats(batch) with its defaults
    g = torch.Generator().manual_seed(0)  # n = 20 tokens of a vocabulary of 16, a block of 3 to 8 repeated
    tokens = torch.randint(0, 16, (batch, 20), generator=g)
    tokens[:, 0] = 16
    length = torch.randint(3, 8 + 1, (batch,), generator=g)
    first = torch.stack([torch.randint(1, 20 - 2 * int(l) + 1, (1,), generator=g)[0] for l in length])
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
        "this is the weight on the earlier occurrence of the token itself, i - length; an induction head attends to "
        "the token AFTER it, i - length + 1, which is what comes next": _induction(weights, first, length, back=length),
        "this is the weight on the previous token, i - 1: a previous-token head, not an induction head":
            _induction(weights, first, length, back=torch.ones_like(length)),
        "the last token of the second copy is counted: its next token is not a copy, so the queries end at "
        "first + 2 length - 2": _induction(weights, first, length, last=1),
        "the scores are averaged per sequence first: average over all (sequence, query) pairs together, so a sequence "
        "with a longer block counts for more queries": _induction(weights, first, length, pooled=False)})


@SUITE.check("test_q_prev_head", parts=["q_prev_head"])
def q_prev_head(t: Trial) -> None:
    """Layer 0's previous-token head of the hand-set circuit, recomputed here."""
    scores = _toy_weights(_make_repeats(256)[0])[0].diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))  # (2,)
    expected = int(scores.argmax())
    if isinstance(t.value("q_prev_head"), bool):  # the text asks for an int; True == 1 is not an index
        raise CheckFailed("q_prev_head is a bool: assign the head's index as the int 0 or 1, not True or False")
    expect_number(t.value("q_prev_head"), expected, "q_prev_head", {
        f"head {1 - expected} of layer 0 attends to each position itself (score "
        f"{scores[1 - expected]:.2f}); the previous-token head puts its weight on position i - 1": 1 - expected},
        rel=0, abs_tol=0.01)


@SUITE.check("test_q_induction_ablated", parts=["q_induction_ablated"])
def q_induction_ablated(t: Trial) -> None:
    """The induction score of layer 1 head 0 with the previous-token head removed, recomputed on the same data."""
    tokens, first, length = _make_repeats(256)
    layer0, layer1 = _toy_weights(tokens)
    knock_out = torch.ones(2, 2)
    knock_out[0, int(layer0.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2)).argmax())] = 0
    intact = _induction(layer1, first, length).tolist()  # head 1 of layer 1 does not depend on layer 0
    ablated = float(_induction(_toy_weights(tokens, knock_out)[1], first, length)[0])
    expect_number(t.value("q_induction_ablated"), ablated, "q_induction_ablated", {
        f"that is the score with every head in place ({intact[0]:.3f}), or with a head removed that the "
        "induction head does not depend on: remove the previous-token head of Q6": intact[0],
        "that is head 1 of layer 1, which never attends after an earlier occurrence: the induction head is "
        "layer 1, head 0": intact[1]}, rel=2e-3, abs_tol=1e-4)
