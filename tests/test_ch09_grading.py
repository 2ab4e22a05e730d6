"""Exercise 09's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest
import torch

from autograder.judging.checks.ch09_tiny_gpt import STATED_REQUIREMENTS
from chapter_checking import assert_earns_only, assert_requirement_broken_alone
from corpus import FIXTURES_REDEFINED, FORGED_LOG_GENERATE
from checking import (assert_delegation_named, assert_full_marks, assert_mistake_named, mutate, run_suite, source_code,
                      with_answer)

A = "09_tiny_gpt"
REF = source_code(A)
SETUP = REF.split("def lm_loss")[0]  # the given setup cell (TinyLM, seeded_generator)
ANSWERS = REF[REF.index("q_uniform_bits ="):]  # the question answers, kept in every variant


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# log-softmax and gather, probabilities raised to 1/T with inverse-CDF sampling, a sort for top-k, a
# loop over rows, a generator that feeds the prompt in two pieces, and a score from an explicit loop.
UNUSUAL = SETUP + '''
def lm_loss(logits, tokens):
    logp = torch.log_softmax(logits.double(), dim=-1)[:, :-1]
    picked = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return (-picked.sum() / picked.numel()).to(logits.dtype)

def sample_next(logits, temperature=1.0, top_k=None, generator=None):
    if temperature == 0:
        return torch.stack([row.argmax() for row in logits])
    probs = torch.softmax(logits.double(), dim=-1) ** (1.0 / temperature)
    if top_k is not None:
        order = probs.argsort(dim=-1, descending=True)
        drop = order[:, top_k:]
        probs = probs.scatter(-1, drop, 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64)
    return (probs.cumsum(-1) < u).sum(-1).clamp(max=probs.shape[-1] - 1)

def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    out = prompt.clone()
    if max_new_tokens == 0:
        return out
    n = prompt.shape[1]
    cache = None
    if n > 1:
        _, cache = model(prompt[:, :n - 1], None)
    logits, cache = model(prompt[:, n - 1:], cache)
    for step in range(max_new_tokens):
        nxt = sample_next(logits[:, -1, :], temperature, top_k, generator).reshape(-1, 1)
        out = torch.cat((out, nxt), 1)
        if step + 1 < max_new_tokens:
            logits, cache = model(nxt, cache)
    return out

def previous_token_score(weights):
    B, H, n, _ = weights.shape
    total = torch.zeros(H, dtype=weights.dtype)
    for i in range(1, n):
        total += weights[:, :, i, i - 1].sum(0)
    return total / (B * (n - 1))
''' + ANSWERS


def test_reference_gets_full_marks():
    assert_full_marks(A, REF)


def test_unusual_correct_answer_gets_full_marks():
    assert_full_marks(A, UNUSUAL)


LOSS = ("return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),\n"
        "                           tokens[:, 1:].reshape(-1))")
SCALE = "    logits = logits / temperature\n"
SOFTMAX = "probs = torch.softmax(logits, dim=-1)"
KTH = "kth = logits.topk(top_k, dim=-1).values[:, -1:]"
CALL = "logits, cache = model(step_input, cache)"
SCORE = "return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))"
MISTAKES = {
    # name: (mutated code, the checks that must fail, words each message must contain)
    "targets not shifted": (mutate(REF, LOSS, "return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), "
                                               "tokens.reshape(-1))"), "test_lm_loss", "not shifted"),
    "shifted the wrong way": (mutate(REF, LOSS, "return F.cross_entropy(logits[:, 1:].reshape(-1, logits.shape[-1]), "
                                                 "tokens[:, :-1].reshape(-1))"), "test_lm_loss", "wrong way"),
    "summed loss": (mutate(REF, LOSS, LOSS.replace(".reshape(-1))", ".reshape(-1), reduction='sum')")),
                    "test_lm_loss", "mean"),
    "temperature after the softmax": (mutate(mutate(REF, SCALE, ""), SOFTMAX, SOFTMAX + " / temperature"),
                                      "test_sample_next_distribution", "after the softmax"),
    "sampling from the logits": (mutate(REF, SOFTMAX, "probs = logits"), "test_sample_next_distribution",
                                 "logits themselves"),
    "temperature multiplied": (mutate(REF, SCALE, "    logits = logits * temperature\n"), "test_sample_next_distribution",
                               "multiplied"),
    "top-k keeps k - 1": (mutate(REF, "logits.masked_fill(logits < kth", "logits.masked_fill(logits <= kth"),
                          "test_sample_next_greedy_topk", "k - 1"),
    "top-k keeps k + 1": (mutate(REF, KTH, "kth = logits.topk(min(top_k + 1, logits.shape[-1]), dim=-1).values[:, -1:]"),
                          "test_sample_next_greedy_topk", "k + 1"),
    "top-k ignored": (mutate(REF, "    if top_k is not None:\n        kth", "    if False:\n        kth"),
                      "test_sample_next_greedy_topk", "ignored"),
    "generator not used": (mutate(REF, "torch.multinomial(probs, 1, generator=generator)", "torch.multinomial(probs, 1)"),
                           "test_sample_next_greedy_topk", "generator"),
    "cache never used": (mutate(REF, CALL, "logits, _ = model(tokens)"), ["test_generate_greedy",
                                                                          "test_generate_sampling"], "never used"),
    "cache dropped each step": (mutate(REF, CALL, "logits, _ = model(step_input, None)"), "test_generate_greedy",
                                "never used"),
    "prompt re-fed every step": (mutate(REF, CALL, "logits, cache = model(tokens, cache)"),
                                 ["test_generate_greedy", "test_generate_sampling"], "re-fed"),
    "cache appended twice": (mutate(REF, CALL, "logits, new = model(step_input, cache)\n"
                                               "            cache = new if cache is None else (torch.cat([cache[0], new[0]], 1), "
                                               "torch.cat([cache[1], new[1]], 1))"),
                             "test_generate_greedy", "appended twice"),
    "first position's logits": (mutate(REF, "sample_next(logits[:, -1], temperature", "sample_next(logits[:, 0], temperature"),
                                "test_generate_greedy", "differ from greedy"),
    "score averaged over heads": (mutate(REF, SCORE, SCORE.replace("dim=(0, 2)", "dim=(1, 2)")),
                                  "test_previous_token_score", "wrong axis"),
    "score kept positions": (mutate(REF, SCORE, SCORE.replace("dim=(0, 2)", "dim=(0, 1)")),
                             "test_previous_token_score", "wrong axis"),
    "score over everything": (mutate(REF, SCORE, SCORE.replace(".mean(dim=(0, 2))", ".mean()")),
                              "test_previous_token_score", "wrong axis"),
    "score on the main diagonal": (mutate(REF, SCORE, SCORE.replace("offset=-1", "offset=0")),
                                   "test_previous_token_score", "main diagonal"),
    "score on the next token": (mutate(REF, SCORE, SCORE.replace("offset=-1", "offset=1")),
                                "test_previous_token_score", "above the main one"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


QUESTION_MISTAKES = {
    "q_uniform_bits": ("math.log(64)", "nats"),
    "q_bits_from_nats": ("1.2 * math.log(2)", "divide by ln 2"),
    "q_temperature_prob": ("math.exp(2) / (math.exp(2) + 1)", "before the softmax"),
    "q_cache_numbers": ("6 * 1000 * 512", "keys only"),
    "q_induction_position": ('"4"', "previous-token head"),
}


@pytest.mark.parametrize("name", list(QUESTION_MISTAKES))
def test_question_names_the_usual_wrong_answer(name):
    wrong, words = QUESTION_MISTAKES[name]
    results = run_suite(A, REF + f"\n{name} = {wrong}\n")
    assert words.lower() in results[f"test_{name}"].lower(), results[f"test_{name}"]
    assert sum(1 for m in results.values() if m) == 1


def test_questions_unanswered_fail_cleanly():
    results = run_suite(A, REF + "\nq_cache_numbers = 'a lot'\ndel q_uniform_bits\n")
    assert "number" in results["test_q_cache_numbers"] and "q_uniform_bits" in results["test_q_uniform_bits"]


@pytest.mark.parametrize("code, part", [
    (REF + "\nfrom attnkit.gpt import sample_next\n", "sample_next"),
], ids=["import-attnkit"])
def test_delegation_earns_nothing_for_that_part(code, part):
    assert_delegation_named(A, code, part)


# -- forgeries (issue 20): the fixtures are the grader's, the cache shows in the tokens, sampling is random -----

SAMPLE_REF = REF[REF.index("def sample_next"):REF.index("def generate")]
GENERATE_REF = REF[REF.index("def generate"):REF.index("def previous_token_score")]
PROBS = "    probs = torch.softmax(logits, dim=-1)\n    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)"

# A generate that never uses the cache, then rewrites the model's call log as a cached loop would have left it.
FORGED_LOG = mutate(REF, GENERATE_REF, FORGED_LOG_GENERATE.lstrip("\n") + "\n")
# The fixtures redefined in an answer cell (TinyLM, seeded_generator), with a generate that returns zeros.
TINYLM_REDEFINED = mutate(REF, GENERATE_REF, FIXTURES_REDEFINED.lstrip("\n") + "\n")
# Samplers that are right on identical rows without drawing at random from `generator`.
QUANTILES = mutate(REF, PROBS, '''    probs = torch.softmax(logits, dim=-1)
    u = (torch.arange(logits.shape[0], dtype=probs.dtype) + 0.5)[:, None] / logits.shape[0]
    return (probs.cumsum(-1) < u).sum(-1).clamp(max=logits.shape[-1] - 1)''')
GLOBAL_RESEED = mutate(REF, PROBS, '''    probs = torch.softmax(logits, dim=-1)
    torch.manual_seed(0)
    return torch.multinomial(probs, 1).squeeze(-1)''')
# A random shift, then the rows spread over the quantiles: right frequencies, reproducible, seeds differ.
STRATIFIED = mutate(REF, PROBS, '''    probs = torch.softmax(logits, dim=-1)
    shift = torch.rand(1, generator=generator, dtype=probs.dtype)
    u = ((torch.arange(logits.shape[0], dtype=probs.dtype) + shift) / logits.shape[0])[:, None]
    return (probs.cumsum(-1) < u).sum(-1).clamp(max=logits.shape[-1] - 1)''')
ONE_NUMBER = mutate(REF, PROBS, '''    probs = torch.softmax(logits, dim=-1)
    u = torch.rand(1, 1, generator=generator, dtype=probs.dtype)
    return (probs.cumsum(-1) < u).sum(-1).clamp(max=logits.shape[-1] - 1)''')
INT32 = mutate(REF, "generator=generator).squeeze(-1)", "generator=generator).squeeze(-1).int()")
SAMPLES = ["test_sample_next_greedy_topk", "test_sample_next_distribution"]
GENERATES = ["test_generate_greedy", "test_generate_sampling"]
FORGERIES = {
    "generate rewrites the call log": (FORGED_LOG, GENERATES, "never used"),
    "TinyLM redefined in an answer cell, greedy": (TINYLM_REDEFINED, "test_generate_greedy", "differ from greedy decoding"),
    "TinyLM redefined in an answer cell, sampling": (TINYLM_REDEFINED, "test_generate_sampling", "not among the 3 most"),
    "sampler without randomness (quantiles)": (QUANTILES, SAMPLES, "two different seeds gave exactly the same tokens"),
    "sampler reseeds the global generator": (GLOBAL_RESEED, SAMPLES, "global generator reseeded"),
    # one random shift for all rows: seeds often give the same 12 000 tokens; where not, neighbours agree too often
    "sampler spreads the rows over the quantiles": (STRATIFIED, SAMPLES, "draw each row with"),
    "one random number for every row": (ONE_NUMBER, SAMPLES, "shares one random draw"),
    "int32 token ids": (INT32, SAMPLES, "int64"),
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forgery_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *FORGERIES[name])


def test_sampler_ignoring_the_generator_also_fails_generate_sampling():
    """generate passes the generator on, but the draws do not depend on it: other seeds give the same tokens."""
    results = run_suite(A, GLOBAL_RESEED)
    assert "global generator reseeded" in results["test_generate_sampling"], results
    assert results["test_generate_greedy"] == "", results


# Correct answers, written unusually: Gumbel-max with the generator; a generate that feeds the prompt a token
# at a time and keeps going with a while loop.
GUMBEL = mutate(REF, PROBS, '''    u = torch.rand(logits.shape, generator=generator, dtype=torch.float64).clamp_min(1e-300)
    return (logits.double() - torch.log(-torch.log(u))).argmax(-1)''')
TOKEN_BY_TOKEN = mutate(GUMBEL, GENERATE_REF, '''def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    cache, logits = None, None
    for i in range(prompt.shape[1]):
        logits, cache = model(prompt[:, i:i + 1], cache)
    out = [prompt]
    while len(out) <= max_new_tokens:
        nxt = sample_next(logits[:, -1], temperature, top_k, generator).view(-1, 1)
        out.append(nxt)
        if len(out) <= max_new_tokens:
            logits, cache = model(nxt, cache)
    return torch.cat(out, dim=1)

''')


@pytest.mark.parametrize("code", [GUMBEL, TOKEN_BY_TOKEN], ids=["gumbel-max", "prompt-token-by-token-while-loop"])
def test_other_correct_ways_get_full_marks(code):
    assert_full_marks(A, code)


def test_the_cache_shows_in_the_tokens_and_the_reference_is_the_judges():
    """The grader's model gives the cached loop's tokens only to a loop that uses the cache, and those are the
    tokens of recomputing everything on TinyLM's positions; the student's namespace is never consulted."""
    from autograder.judging.checks.ch09_tiny_gpt import _greedy_tokens
    from autograder.judging.checks.trusted_lm import CacheProbeLM

    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    model = CacheProbeLM(3, seed=5)
    cached = _greedy_tokens(model, prompt, 6, "cached")
    assert not torch.equal(cached, _greedy_tokens(model, prompt, 6, "recomputed"))
    plain = CacheProbeLM(3, seed=5)
    plain.recomputed = plain.pos  # no mark: recomputing equals the cache, as on TinyLM
    assert torch.equal(_greedy_tokens(plain, prompt, 6, "recomputed"), cached)


# the induction circuit (section 6): the score's classic mistakes, and the questions about the hand-set circuit
IND = "    return (picked * q).sum(dim=(0, 2)) / q.sum()"
KEYS = "keys = (i - length[:, None] + 1).clamp(min=0)"
INDUCTION_MISTAKES = {
    "one offset for every sequence": (mutate(REF, KEYS, "keys = (i - length[:1, None] + 1).clamp(min=0)"),
                                      "one offset"),
    "the earlier token itself": (mutate(REF, KEYS, "keys = (i - length[:, None]).clamp(min=0)"), "itself"),
    "the previous token": (mutate(REF, KEYS, "keys = (i - 1).clamp(min=0).expand(B, n)"), "previous token"),
    "the last query counted": (mutate(REF, "(first + 2 * length - 2)[:, None]", "(first + 2 * length - 1)[:, None]"),
                               "last token"),
    "per-sequence means": (mutate(REF, IND, "    return ((picked * q).sum(-1) / q.sum(-1)).mean(0)"),
                           "per sequence"),
}


@pytest.mark.parametrize("name", list(INDUCTION_MISTAKES))
def test_induction_score_mistake_named(name):
    code, words = INDUCTION_MISTAKES[name]
    assert_mistake_named(A, name, code, "test_induction_score", words)


@pytest.mark.parametrize("name, wrong, words", [
    ("q_prev_head", "0", "itself"),
    ("q_induction_ablated", "float(induction_score(toy(repeats)[1][1], first, length)[0])", "every head in place"),
], ids=["prev-head", "not-ablated"])
def test_circuit_question_names_the_usual_wrong_answer(name, wrong, words):
    results = run_suite(A, REF + f"\n{name} = {wrong}\n")
    assert words.lower() in results[f"test_{name}"].lower(), results[f"test_{name}"]
    assert sum(1 for m in results.values() if m) == 1


# -- stated requirements (issue 20): each one, broken alone, costs points on its check with a named message --

STEP = "step_input = sample_next(logits[:, -1], temperature, top_k,\n                                     generator)[:, None]"
RETURN = "tokens = torch.cat([tokens, step_input], dim=1)\n    return tokens"
REQUIREMENTS = {
    # requirement (as in STATED_REQUIREMENTS, which names its check and message): a mutant of the reference
    # that breaks only it
    "loss: logits[:, i] predicts tokens[:, i + 1]": MISTAKES["targets not shifted"][0],
    "loss: the shift goes forward": MISTAKES["shifted the wrong way"][0],
    "loss: the mean, not the sum": MISTAKES["summed loss"][0],
    "loss: in nats": mutate(REF, LOSS, LOSS + " / math.log(2)"),
    "loss: a scalar tensor": mutate(REF, LOSS, LOSS.replace(".reshape(-1))", ".reshape(-1), reduction='none')")),
    "sample: temperature 0 is the arg max": mutate(REF, "        return logits.argmax(dim=-1)\n",
                                                   "        probs = torch.softmax(logits, dim=-1)\n"
                                                   "        return torch.multinomial(probs, 1, generator=generator)"
                                                   ".squeeze(-1)\n"),
    "sample: temperature divides the logits before the softmax": MISTAKES["temperature after the softmax"][0],
    "sample: divide by the temperature, not multiply": MISTAKES["temperature multiplied"][0],
    "sample: draw from the softmax probabilities": MISTAKES["sampling from the logits"][0],
    "sample: top_k keeps the k largest, not k - 1": MISTAKES["top-k keeps k - 1"][0],
    "sample: top_k keeps the k largest, not k + 1": MISTAKES["top-k keeps k + 1"][0],
    "sample: top_k used": MISTAKES["top-k ignored"][0],
    "sample: the same seeded generator repeats the draws": MISTAKES["generator not used"][0],
    "sample: another seed draws other tokens": GLOBAL_RESEED,
    "sample: each row drawn independently": ONE_NUMBER,
    "sample: (B,) int64 ids": INT32,
    "generate: the prompt followed by the new tokens": mutate(REF, RETURN, RETURN + "[:, prompt.shape[1]:]"),
    "generate: (B, n + max_new_tokens) int64": mutate(REF, RETURN, RETURN + ".int()"),
    "generate: the cache is used": MISTAKES["cache never used"][0],
    "generate: only the newest token is fed": MISTAKES["prompt re-fed every step"][0],
    "generate: the model appends to the cache itself": MISTAKES["cache appended twice"][0],
    "generate: the last position's logits": MISTAKES["first position's logits"][0],
    "generate: temperature passed on": mutate(REF, STEP, STEP.replace("temperature, top_k", "1.0, top_k")),
    "generate: top_k passed on": mutate(REF, STEP, STEP.replace("temperature, top_k", "temperature, None")),
    "generate: the generator passed on": mutate(REF, STEP, STEP.replace("generator)[", "None)[")),
    "score: one score per head": MISTAKES["score averaged over heads"][0],
    "score: position i on position i - 1": MISTAKES["score on the main diagonal"][0],
    "score: positions i >= 1 only": mutate(REF, SCORE, "return F.pad(weights.diagonal(offset=-1, dim1=-2, dim2=-1), "
                                                       "(1, 0)).mean(dim=(0, 2))"),
    "induction: each sequence's own first and length": INDUCTION_MISTAKES["one offset for every sequence"][0],
    "induction: the key after the earlier occurrence": INDUCTION_MISTAKES["the earlier token itself"][0],
    "induction: not a fixed distance back": INDUCTION_MISTAKES["the previous token"][0],
    "induction: the last token of the second copy is not a query": INDUCTION_MISTAKES["the last query counted"][0],
    "induction: pooled over (sequence, query) pairs": INDUCTION_MISTAKES["per-sequence means"][0],
    "induction: one score per head": with_answer(mutate(REF, IND, "    return (picked * q).sum(dim=2) / q.sum()"),
                                                 "q_induction_ablated", "0.5"),  # Q7's answer reads a score per head
    "q1: a uniform loss in bits": with_answer(REF, "q_uniform_bits", "math.log(64)"),
    "q2: nats to bits": with_answer(REF, "q_bits_from_nats", "1.2 * math.log(2)"),
    "q3: the temperature divides the logits": with_answer(REF, "q_temperature_prob", "math.exp(2) / (math.exp(2) + 1)"),
    "q4: keys and values": with_answer(REF, "q_cache_numbers", "6 * 1000 * 512"),
    "q4: every layer": with_answer(REF, "q_cache_numbers", "2 * 1000 * 512"),
    "q5: the token after the earlier occurrence": with_answer(REF, "q_induction_position", '"4"'),
    "q6: layer 0's previous-token head": with_answer(REF, "q_prev_head", "0"),
    "q6: the index as an int, not a bool": with_answer(REF, "q_prev_head",
                                                                 "bool(previous_token_score(toy_weights[0]).argmax())"),
    "q7: the score with the previous-token head removed": with_answer(
        REF, "q_induction_ablated", "float(induction_score(toy(repeats)[1][1], first, length)[0])"),
}


@pytest.mark.parametrize("name", list(REQUIREMENTS))
def test_stated_requirement_broken_alone_loses_points_on_its_check(name):
    assert_requirement_broken_alone(A, STATED_REQUIREMENTS, REQUIREMENTS, name)


# -- the visible tests (issue 27): what the text states, broken alone, fails a test the student can run -------

def visible_failures(code: str) -> dict[str, str]:
    """grade_id -> the message of each visible test of the released notebook run on ``code`` ("" if it passes)."""
    import json

    from autograder.course import RELEASE
    from checking import namespace

    ns, out = namespace(code), {}
    for cell in json.loads((RELEASE / A / "tiny_gpt.ipynb").read_text())["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] == "code" and meta.get("grade"):
            try:
                exec(compile("".join(cell["source"]), meta["grade_id"], "exec"), ns)
                out[meta["grade_id"]] = ""
            except AssertionError as e:
                out[meta["grade_id"]] = str(e) or "failed"
    return out


def test_the_reference_passes_every_visible_test():
    failures = visible_failures(REF)
    assert len(failures) >= 12 and not any(failures.values()), failures


VISIBLE = {
    # mutant: (code, the visible test that must fail, words its message must contain)
    "top-k keeps k - 1": (MISTAKES["top-k keeps k - 1"][0], "test_sample_next_greedy_topk", "not k - 1"),
    "induction averaged per sequence first": (INDUCTION_MISTAKES["per-sequence means"][0], "test_induction_score",
                                              "not averaged per sequence"),
    "the last query of the second copy counted": (INDUCTION_MISTAKES["the last query counted"][0],
                                                  "test_induction_score", "second copy but its last token"),
    "temperature not passed on": (REQUIREMENTS["generate: temperature passed on"], "test_generate_greedy",
                                  "calls use the cache as they should: is temperature passed on"),
    "q6 answered with a bool": (REQUIREMENTS["q6: the index as an int, not a bool"], "test_q_prev_head",
                                "not True or False"),
    # torch's own message (the values) comes first, the hint after it
    "loss in bits": (REQUIREMENTS["loss: in nats"], "test_lm_loss", "Expected 1.9459"),
}


@pytest.mark.parametrize("name", list(VISIBLE))
def test_a_stated_requirement_broken_alone_fails_a_visible_test(name):
    code, gid, words = VISIBLE[name]
    failures = visible_failures(code)
    assert words in failures[gid], failures[gid]
    assert [g for g, message in failures.items() if message] == [gid], failures


def test_a_visible_close_check_keeps_torchs_values_and_adds_the_hint():
    message = visible_failures(REQUIREMENTS["loss: in nats"])["test_lm_loss"]
    assert "Expected" in message and "ln 7" in message, message


# -- issue 34: every check anchored to the reference ------------------------------------------------------

# A sampler that ignores the logits but draws with the generator: reproducible, other seeds other tokens,
# independent rows (and one that is greedy at temperature 0 only).
SAMPLE_IGNORES_LOGITS = mutate(REF, SAMPLE_REF, '''def sample_next(logits, temperature=1.0, top_k=None, generator=None):
    return torch.randint(0, logits.shape[-1], (logits.shape[0],), generator=generator)

''')
SAMPLE_GREEDY_ONLY = mutate(REF, SAMPLE_REF, '''def sample_next(logits, temperature=1.0, top_k=None, generator=None):
    if temperature == 0:
        return logits.argmax(dim=-1)
    return torch.randint(0, logits.shape[-1], (logits.shape[0],), generator=generator)

''')
# A generate that never calls the model: the student's own sampler on fixed logits (it passes the generator, the
# temperature and top_k on), or the prompt followed by zeros.
GENERATE_IGNORES_MODEL = mutate(REF, GENERATE_REF, '''def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None,
             generator=None):
    flat = torch.zeros(prompt.shape[0], 12)
    new = [sample_next(flat + 0.01 * i, temperature, top_k, generator)[:, None] for i in range(max_new_tokens)]
    return torch.cat([prompt, *new], dim=1)

''')
GENERATE_ZEROS = mutate(REF, GENERATE_REF, '''def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None,
             generator=None):
    return torch.cat([prompt, torch.zeros(prompt.shape[0], max_new_tokens, dtype=torch.long)], dim=1)

''')
SCORES_OF_ZEROS = mutate(mutate(REF, SCORE, "return torch.zeros(weights.shape[1])"),
                         IND, "    return torch.zeros(weights.shape[1])")


@pytest.mark.parametrize("code, part", [
    (SAMPLE_IGNORES_LOGITS, "sample_next"), (SAMPLE_GREEDY_ONLY, "sample_next"), (GENERATE_IGNORES_MODEL, "generate"),
    (GENERATE_ZEROS, "generate"), (SCORES_OF_ZEROS, {"previous_token_score", "induction_score"})],
    ids=["sampler-ignores-logits", "sampler-greedy-only", "generate-ignores-model", "generate-zeros", "scores-zeros"])
def test_a_part_that_ignores_its_inputs_earns_nothing(code, part):
    """Issue 34: the sampling checks compare the student's draws with each other (the same seed, another seed,
    neighbouring rows) only after their frequencies match softmax(logits / T); generate's tokens are compared with
    the grader's model; the scores are values. A part that ignores its inputs earns none of them."""
    assert_earns_only(A, code, part)
