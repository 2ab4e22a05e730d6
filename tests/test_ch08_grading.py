"""Exercise 08's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest
import torch

from autograder.judging.checks import CheckFailed, LocalBackend, Trial, load_suite, seed_for
import checking
from autograder.judging.checks.ch08_efficient_attention import STATED_REQUIREMENTS
from chapter_checking import assert_requirement_broken_alone
from checking import namespace, assert_delegation_named, assert_full_marks, assert_mistake_named, mutate, run_suite, source_code

A = "08_efficient_attention"
REF = source_code(A)
SETUP = REF.split("def online_softmax_update")[0]  # the given setup cell (attention)
ANSWERS = "\n" + "\n".join(line for line in REF.splitlines() if line.startswith("q_")) + "\n"  # the questions

# Log-space bookkeeping in float64, a loop over blocks' keys, an explicit-loop cache and an arange mask.
UNUSUAL = SETUP + '''
def online_softmax_update(running_max, running_sum, acc, scores, values):
    dtype = acc.dtype
    m, l, a, s, v = (x.double() for x in (running_max, running_sum, acc, scores, values))
    new = torch.cat([m, s], dim=-1).max(dim=-1, keepdim=True).values
    safe = new.nan_to_num(neginf=0.0).masked_fill(new == float("-inf"), 0.0)
    old_weight = torch.where(m == float("-inf"), torch.zeros_like(m), (m - safe).exp())
    for j in range(s.shape[-1]):
        w = (s[..., j:j + 1] - safe).exp()  # (..., n, 1)
        l = l * 1 if j else l * old_weight
        a = a * 1 if j else a * old_weight
        l = l + w
        a = a + w * v[..., j:j + 1, :].transpose(-2, -1).squeeze(-1).unsqueeze(-2)
    return new.to(dtype), l.to(dtype), a.to(dtype)

def append_to_cache(cache, key, value):
    if cache is None:
        return key.clone(), value.clone()
    keys, values = cache
    return torch.concat((keys, key), dim=2), torch.concat((values, value), dim=2)

def cached_attention(query, key, value, cache):
    keys, values = append_to_cache(cache, key, value)
    t = keys.shape[2] - query.shape[2]
    rows = torch.arange(query.shape[2], device=query.device)[:, None] + t
    cols = torch.arange(keys.shape[2], device=query.device)[None, :]
    scores = torch.einsum("bhsd,bhtd->bhst", query, keys) * query.shape[-1] ** -0.5
    scores = scores.masked_fill(cols > rows, float("-inf"))
    return torch.softmax(scores, dim=-1) @ values, (keys, values)

def tiled_attention(query, key, value, mask=None, causal=False, block_k=4):
    # key blocks from torch.split, a boolean "allowed" tensor built once, and float64 bookkeeping
    n, m = query.shape[-2], key.shape[-2]
    allowed = torch.ones(n, m, dtype=torch.bool, device=query.device)
    if causal:
        allowed = allowed.tril()
    if mask is not None:
        allowed = allowed & mask
    out_shape = (*torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], allowed.shape[:-2]), n)
    allowed = allowed.expand(*out_shape, m)
    q = query.double() * query.shape[-1] ** -0.5
    state = (torch.full((*out_shape, 1), -math.inf, dtype=torch.float64), torch.zeros(*out_shape, 1, dtype=torch.float64),
             torch.zeros(*out_shape, value.shape[-1], dtype=torch.float64))
    start = 0
    for kb, vb in zip(key.double().split(block_k, dim=-2), value.double().split(block_k, dim=-2)):
        s = torch.einsum("...nd,...bd->...nb", q, kb)
        s = torch.where(allowed[..., start:start + kb.shape[-2]], s, torch.tensor(-math.inf, dtype=s.dtype))
        state = online_softmax_update(*state, s, vb)
        start += kb.shape[-2]
    m_, l, a = state
    return (a / l.clamp_min(1e-300)).to(query.dtype)

def grouped_query_attention(query, key, value, mask=None):
    # a group axis and einsum: (B, G, r, n, d) queries against (B, G, m, d) keys, no repeated copies
    B, H, n, d = query.shape
    G, m = key.shape[1], key.shape[2]
    if G > H or H % G != 0:
        raise ValueError(f"H={H} query heads cannot be split into G={G} equal groups")
    q = query.reshape(B, G, H // G, n, d)
    scores = torch.einsum("bgrnd,bgmd->bgrnm", q, key) / d ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask.expand(B, H, n, m).reshape(B, G, H // G, n, m), -math.inf)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a fully masked row: NaN -> 0
    return torch.einsum("bgrnm,bgmv->bgrnv", weights, value).reshape(B, H, n, -1)
''' + ANSWERS


def test_reference_gets_full_marks():
    assert_full_marks(A, REF)


def test_unusual_correct_answer_gets_full_marks():
    assert_full_marks(A, UNUSUAL)


NEW_SUM = "rescale * running_sum + p.sum(dim=-1, keepdim=True)"
NEW_ACC = "rescale * acc + p @ values"
RET = "return new_max, rescale * running_sum + p.sum(dim=-1, keepdim=True), rescale * acc + p @ values"
SHIFT = "shift = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))"
CAT = "return torch.cat([cache[0], key], dim=-2), torch.cat([cache[1], value], dim=-2)"
MASK = "mask = torch.ones(s, total, dtype=torch.bool, device=query.device).tril(total - s)  # (s, t + s)"
MISTAKES = {
    # name: (mutated code, the checks that must fail, words each message must contain)
    "sum not rescaled": (mutate(REF, NEW_SUM, "running_sum + p.sum(dim=-1, keepdim=True)"),
                         ["test_online_softmax_basic", "test_online_softmax_blocks"], "running sum is not rescaled"),
    "acc not rescaled": (mutate(REF, NEW_ACC, "acc + p @ values"),
                         ["test_online_softmax_basic", "test_online_softmax_blocks"], "accumulator is not rescaled"),
    "nothing rescaled": (mutate(mutate(REF, NEW_SUM, "running_sum + p.sum(dim=-1, keepdim=True)"), NEW_ACC,
                                "acc + p @ values"), ["test_online_softmax_basic"], "neither"),
    "running max not updated": (mutate(REF, RET, RET.replace("return new_max", "return running_max")),
                                ["test_online_softmax_basic", "test_online_softmax_blocks"], "not updated"),
    "block max only": (mutate(REF, "new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))",
                              "new_max = scores.amax(dim=-1, keepdim=True)"),
                       ["test_online_softmax_basic"], "maximum over every block"),
    "inverted factor": (mutate(REF, "rescale = torch.exp(running_max - shift)", "rescale = torch.exp(shift - running_max)"),
                        ["test_online_softmax_basic"], "inverted"),
    "NaN for masked rows": (mutate(REF, SHIFT, "shift = new_max"), ["test_online_softmax_masked"], "-inf"),
    "cache on the feature axis": (mutate(REF, CAT, CAT.replace("dim=-2", "dim=-1")), ["test_append_to_cache"],
                                  "wrong axis"),
    "cache on the head axis": (mutate(REF, CAT, CAT.replace("dim=-2", "dim=1")), ["test_append_to_cache"],
                               "wrong axis"),
    "new positions first": (mutate(REF, CAT, "return torch.cat([key, cache[0]], dim=-2), torch.cat([value, cache[1]], dim=-2)"),
                            ["test_append_to_cache", "test_cached_attention_step"], "before the cached ones"),
    "attending to the future": (mutate(REF, MASK, "mask = None"), ["test_cached_attention_prompt"], "future"),
    "mask aligned to the start": (mutate(REF, MASK, MASK.replace(".tril(total - s)", ".tril()")),
                                  ["test_cached_attention_prompt", "test_cached_attention_step"], "aligned to the start"),
    "appended twice in append_to_cache": (mutate(REF, CAT, "return torch.cat([cache[0], key, key], dim=-2), "
                                                     "torch.cat([cache[1], value, value], dim=-2)"),
                                          ["test_append_to_cache", "test_cached_attention_step"], "appended twice"),
    "appended twice in cached_attention": (mutate(REF, "keys, values = append_to_cache(cache, key, value)  # (B, H, t + s, d)",
                                                  "keys, values = append_to_cache(cache, key, value)  # (B, H, t + s, d)\n"
                                                  "    keys, values = append_to_cache((keys, values), key, value)"),
                                           ["test_cached_attention_step", "test_cached_attention_prompt"], "appended twice"),
    "attends before appending": (mutate(REF, "keys, values = append_to_cache(cache, key, value)  # (B, H, t + s, d)",
                                        "keys, values = cache if cache is not None else (key, value)"),
                                 ["test_cached_attention_step"], "does not attend to itself"),
}


GQA_CHECK = "    if G < 1 or H % G:"
GQA_RAISE = ('        raise ValueError(f"the {G} key-value heads must divide the {H} query heads (H={H}, G={G}): each "\n'
             '                         f"key-value head serves H / G query heads")')
GQA_K = "key = key.repeat_interleave(H // G, dim=-3)"
GQA_V = "value = value.repeat_interleave(H // G, dim=-3)"
GQA_RET = "return attention(query, key, value, mask)  # (B, H, n, d_v)"
NAN_SOFTMAX = ("s = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])\n"
               "    s = s if mask is None else s.masked_fill(~mask, float('-inf'))\n"
               "    return torch.softmax(s, dim=-1) @ value")
GQA_MISTAKES = {
    "K/V heads interleaved (repeat, not repeat_interleave)": (
        mutate(mutate(REF, GQA_K, "key = key.repeat(1, H // G, 1, 1)"), GQA_V, "value = value.repeat(1, H // G, 1, 1)"),
        ["test_grouped_query_attention", "test_grouped_query_attention_mask"], "interleaved instead of grouped"),
    "query heads averaged instead of sharing K/V": (
        mutate(mutate(mutate(REF, GQA_K, "query = query.unflatten(-3, (G, H // G)).mean(-3)"), GQA_V, "pass"),
               GQA_RET, "return attention(query, key, value, mask).repeat_interleave(H // G, dim=-3)"),
        ["test_grouped_query_attention"], "averaged"),
    "query heads averaged, G outputs": (
        mutate(mutate(REF, GQA_K, "query = query.unflatten(-3, (G, H // G)).mean(-3)"), GQA_V, "pass"),
        ["test_grouped_query_attention"], "averaged"),
    "divisibility check reversed (G % H)": (mutate(REF, GQA_CHECK, "    if G % H:"),
                                             ["test_grouped_query_attention_heads"], "reversed"),
    "divisibility check missing": (mutate(REF, GQA_CHECK, "    if False:"), ["test_grouped_query_attention_heads"],
                                   "check is missing"),
    "divisibility check only refuses G > H": (mutate(REF, GQA_CHECK, "    if G > H:"),
                                              ["test_grouped_query_attention_heads"], "lets this G through"),
    "assert instead of ValueError": (mutate(REF, GQA_CHECK + "\n" + GQA_RAISE, "    assert H % G == 0"),
                                     ["test_grouped_query_attention_heads"], "raise a ValueError"),
    "ValueError that names neither number": (
        mutate(REF, GQA_RAISE, '        raise ValueError("the heads cannot be grouped")'),
        ["test_grouped_query_attention_heads"], "name both numbers"),
    "a head-by-head loop with no check (silent for G not dividing H)": (
        mutate(mutate(mutate(mutate(REF, GQA_CHECK + "\n" + GQA_RAISE, ""), GQA_K + "  # (B, H, m, d_k): query head h gets key head h // (H // G)",
                      "pass"), GQA_V, "pass"), GQA_RET, "return torch.stack([attention(query[:, h], key[:, h * G // H], value[:, h * G // H], "
               "None if mask is None else mask.expand(*mask.shape[:-3], H, *mask.shape[-2:])[..., h, :, :]) "
               "for h in range(H)], dim=1)"),
        ["test_grouped_query_attention_heads"], "returned"),
}
MISTAKES.update(GQA_MISTAKES)


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


@pytest.mark.parametrize("code, part", [
    (REF + "\nimport torch.nn.functional as F\n"
           "def cached_attention(query, key, value, cache):\n"
           "    keys, values = append_to_cache(cache, key, value)\n"
           "    return F.scaled_dot_product_attention(query, keys, values), (keys, values)\n", "cached_attention"),
    (REF + "\nfrom attnkit.efficient import online_softmax_update\n", "online_softmax_update"),
    (REF + "\nimport torch.nn.functional as F\n"
           "def grouped_query_attention(query, key, value, mask=None):\n"
           "    return F.scaled_dot_product_attention(query, key, value, mask, enable_gqa=True)\n",
     "grouped_query_attention"),
], ids=["torch-sdpa", "import-attnkit", "torch-enable-gqa"])
def test_delegation_earns_nothing_for_that_part(code, part):
    assert_delegation_named(A, code, part)


def run_checks(code: str, gids: list[str]) -> dict[str, str]:
    """Only the checks ``gids`` of this assignment (see checking.run_checks)."""
    return checking.run_checks(A, code, gids)


# -- stated requirements (issue 13): each one, broken alone, costs points on its check with a named message --

CAUSAL = "scores = scores.masked_fill(cols > rows, float(\"-inf\"))  # key j is in query i's future"
DIVIDE = "return acc / torch.where(total > 0, total, torch.ones_like(total))  # (..., n, d_v); empty rows stay 0"
MASK_FILL = "scores = scores.masked_fill(~mask[..., j:j + block_k], float(\"-inf\"))"
SCALE = "q = query / math.sqrt(query.shape[-1])  # (..., n, d_k)"
LOOP = "for j in range(0, m, block_k):"
ACC_ONLY = "return new_max, rescale * running_sum + p.sum(dim=-1, keepdim=True), acc + p @ values"
REQUIREMENTS = {
    # requirement (as in STATED_REQUIREMENTS, which names its check and message): a mutant of the reference
    # that breaks only it
    "update: rescale the sum and the accumulator": MISTAKES["acc not rescaled"][0],
    "update: new maximum": MISTAKES["running max not updated"][0],
    "update: -inf rows stay (-inf, 0, 0)": MISTAKES["NaN for masked rows"][0],
    "update: keeps the inputs' dtype": mutate(REF, RET, RET.replace("return new_max,", "return new_max.double(),")),
    "tiled: accumulator rescaled (through the update)": mutate(REF, RET, ACC_ONLY),
    "tiled: scaled by 1/sqrt(d_k)": mutate(REF, SCALE, "q = query  # (..., n, d_k)"),
    "tiled: divide by the running sum": mutate(REF, DIVIDE, "return acc"),
    "tiled: every block, the last shorter one too": mutate(REF, LOOP, "for j in range(0, m - m % block_k if m % block_k else m, block_k):"),
    "tiled: keeps the inputs' dtype": mutate(REF, DIVIDE, "return (acc / torch.where(total > 0, total, torch.ones_like(total))).float()"),
    "tiled: causal includes the diagonal": mutate(REF, CAUSAL, CAUSAL.replace("cols > rows", "cols >= rows")),
    "tiled: causal hides the next key": mutate(REF, CAUSAL, CAUSAL.replace("cols > rows", "cols > rows + 1")),
    "tiled: causal uses positions in the sequence": mutate(REF, CAUSAL, CAUSAL.replace("cols > rows", "(cols - j) > rows")),
    "tiled: mask hides keys": mutate(REF, MASK_FILL, "pass"),
    "tiled: mask True = may attend": mutate(REF, MASK_FILL, MASK_FILL.replace("~mask", "mask")),
    "tiled: no allowed key gives zeros, not NaN": mutate(REF, DIVIDE, "return acc / total"),
    "tiled: does not call the setup's attention": REF + "\ndef tiled_attention(query, key, value, mask=None, causal=False, block_k=4):\n"
              "    n, m = query.shape[-2], key.shape[-2]\n"
              "    if causal:\n"
              "        tril = torch.ones(n, m, dtype=torch.bool).tril()\n"
              "        mask = tril if mask is None else mask & tril\n"
              "    return attention(query, key, value, mask)\n",
    "gqa: ValueError when G does not divide H": GQA_MISTAKES["divisibility check missing"][0],
    "gqa: the ValueError names H and G": GQA_MISTAKES["ValueError that names neither number"][0],
    "gqa: every G that divides H works": GQA_MISTAKES["divisibility check reversed (G % H)"][0],
    "gqa: query head h uses key-value head h // (H / G)": GQA_MISTAKES["K/V heads interleaved (repeat, not repeat_interleave)"][0],
    "gqa: every query head keeps its own query": GQA_MISTAKES["query heads averaged instead of sharing K/V"][0],
    "gqa: mask hides keys": mutate(REF, GQA_RET, "return attention(query, key, value)"),
    "gqa: mask True = may attend": mutate(REF, GQA_RET, "return attention(query, key, value, None if mask is None else ~mask)"),
    "gqa: a query with no allowed key gives zeros": mutate(REF, GQA_RET, NAN_SOFTMAX),
    "gqa: keeps the inputs' dtype": mutate(REF, GQA_RET, "return attention(query, key, value, mask).float()"),
    "cache: time axis": MISTAKES["cache on the feature axis"][0],
    "cached: causal shifted by t": MISTAKES["mask aligned to the start"][0],
}


@pytest.mark.parametrize("name", list(REQUIREMENTS))
def test_stated_requirement_broken_alone_loses_points_on_its_check(name):
    assert_requirement_broken_alone(A, STATED_REQUIREMENTS, REQUIREMENTS, name)


def test_tiled_attention_that_keeps_a_stale_maximum_is_named():
    stale = mutate(REF, "new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))  # (..., n, 1)",
                   "new_max = torch.where(torch.isfinite(running_max), running_max, "
                   "scores.amax(dim=-1, keepdim=True))  # (..., n, 1)")
    results = run_checks(stale, ["test_tiled_attention"])
    assert "not updated" in results["test_tiled_attention"], results["test_tiled_attention"]


# -- conceptual questions (issue 14): the reference's answers pass; each named wrong answer gets its message --

KV = 2 * 12 * 16 * 64 * 2 * 1000
GQA = 2 * 32 * 8 * 128 * 2
E = __import__("math").exp
QUESTIONS = {
    "q_kv_cache_bytes": [(str(KV // 2), "is half"), (str(KV * 2), "float32"), (str(KV // 12), "one layer"),
                         (str(KV // 16), "one head"), (str(KV * 1000), "square"), ("12345", "not right")],
    "q_attention_flops": [(str(2 * 1024 ** 2 * 64), "half"), (str(4 * 1024 * 64 ** 2), "linear in n"),
                          (str(1024 ** 2), "entries of the score matrix"), (str(1024 ** 2 * 64), "multiply-add")],
    "q_gqa_cache_bytes": [(str(GQA * 4), "query heads"), (str(GQA // 8), "multi-query"), (str(GQA // 2), "half"),
                          (str(GQA * 2), "float32"), (str(GQA // 32), "one layer"), ("1000", "not right")],
    "q_online_state": [(f"(3.0, {E(-4) + E(-2) + E(-3) + 1})", "first block's maximum"),
                       (f"(5.0, {E(-2) + 1 + E(-3) + 1})", "not rescaled"),
                       (f"(5.0, {E(-2) + 1 + E(-1) + E(2)})", "stale"),
                       (f"(5.0, {E(1) + E(3) + E(2) + E(5)})", "no maximum subtracted"),
                       (f"(5.0, {E(-3) + 1})", "only the second block"),
                       (f"(5.0, {(E(-2) + 1) * E(2) + E(-3) + 1})", "inverted"),
                       ("5.0", "tuple of two numbers")],
}


@pytest.mark.parametrize("name, wrong, words", [(q, w, m) for q, cases in QUESTIONS.items() for w, m in cases])
def test_question_wrong_answer_is_named(name, wrong, words):
    checking.assert_only_question_named(A, checking.with_answer(REF, name, wrong), name, QUESTIONS, words)


def test_grouped_query_attention_by_expand_and_reshape_gets_full_marks():
    """The other common correct form: a view that expands each key-value head over its group, with torch's softmax."""
    code = REF + '''
def grouped_query_attention(query, key, value, mask=None):
    B, H, n, _ = query.shape
    G, m = key.shape[1], key.shape[2]
    if not (0 < G <= H and H % G == 0):
        raise ValueError(f"expected a number of key-value heads dividing H={H}, got G={G}")
    k = key[:, :, None].expand(B, G, H // G, m, key.shape[-1]).reshape(B, H, m, -1)
    v = value[:, :, None].expand(B, G, H // G, m, value.shape[-1]).reshape(B, H, m, -1)
    s = query @ k.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1)
    return torch.where(torch.isnan(w), torch.zeros_like(w), w) @ v
'''
    gids = ["test_grouped_query_attention", "test_grouped_query_attention_mask", "test_grouped_query_attention_heads"]
    assert run_checks(code, gids) == {gid: "" for gid in gids}


# -- issue 34: "does not call the setup's attention" is the tiled part's rule, not a size ----------------------

CHUNKED = REF + '''
def tiled_attention(query, key, value, mask=None, causal=False, block_k=4):
    """The setup's attention on chunks of 8 queries: never more than MAX_SCORES scores at once."""
    n, m = query.shape[-2], key.shape[-2]
    if causal:
        tril = torch.ones(n, m, dtype=torch.bool).tril()
        mask = tril if mask is None else mask & tril
    outs, step = [], 8
    for i in range(0, n, step):
        sub = None if mask is None else mask.expand(*mask.shape[:-2], n, m)[..., i:i + step, :]
        outs.append(attention(query[..., i:i + step, :], key, value, sub))
    return torch.cat(outs, dim=-2)
'''
REBOUND = mutate(CHUNKED, "    outs, step = [], 8\n", "    outs, step = [], n  # one chunk: every query at once\n"
                 "    global MAX_SCORES\n    MAX_SCORES = 10 ** 12  # the setup's attention reads this global\n")


@pytest.mark.parametrize("code", [CHUNKED, REBOUND], ids=["chunked-queries", "MAX_SCORES-rebound"])
def test_the_setup_attention_earns_nothing_in_the_tiled_part_at_any_size(code):
    """Issue 34: calling the setup's attention on small chunks, or after rebinding MAX_SCORES, earned every tiled
    point; the tiled part's process refuses torch's softmax, which the setup's attention uses."""
    tiled = ["test_tiled_attention", "test_tiled_attention_causal", "test_tiled_attention_mask"]
    scanned = run_suite(A, code)  # the static scan follows the call into the setup's attention
    assert all(scanned[g].startswith("earns no points") for g in tiled), {g: scanned[g] for g in tiled}
    assert scanned["test_cached_attention_step"] == "", "the setup's attention still works in the other parts"
    results = checking.run_checks(A, code, tiled)  # and the run-time rule alone (a call the scan cannot resolve)
    assert all("setup's attention" in results[g] for g in tiled), results


def test_the_tiled_ban_refuses_logsumexp_at_run_time_and_the_setup_still_runs():
    """The names of SUITE.forbidden map to refused operators: aten::logsumexp and aten::_softmax refuse in a call of
    the tiled part, and the setup cell's code (its attention, defined and called in another part) runs."""
    from autograder.judging.checks import StudentError
    from autograder.in_sandbox.torch_names import runtime_fragments

    suite = load_suite(A)
    assert {"logsumexp", "softmax"} <= set(runtime_fragments(suite.bans(["tiled_attention"])))
    ns = namespace(REF + "\ndef lse(x):\n    return torch.logsumexp(x, -1)\n"
                         "def sm(x):\n    return attention(x, x, x)\n")
    x = torch.randn(2, 3, 4)
    for fn in ("lse", "sm"):
        with pytest.raises(StudentError, match="refused by the grader's guard"):
            Trial(LocalBackend(ns), 0, suite.bans(["tiled_attention"])).call(fn, x)
    assert Trial(LocalBackend(ns), 0, suite.bans(["cached_attention"])).call("sm", x).shape == (2, 3, 4)


UNIFORM_TILED = REF + '''
def tiled_attention(query, key, value, mask=None, causal=False, block_k=4):
    """The mean of the values each query may see, whatever the queries and keys are."""
    n, m = query.shape[-2], key.shape[-2]
    allowed = torch.ones(n, m, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if mask is not None:
        allowed = allowed & mask
    w = allowed.to(value.dtype)
    return (w / w.sum(-1, keepdim=True).clamp_min(1)) @ value
'''


def test_a_tiled_answer_that_ignores_its_inputs_earns_nothing():
    """Issue 34: a mean over the allowed keys earned the causal and mask checks (rows compared with itself)."""
    results = checking.run_checks(A, UNIFORM_TILED, ["test_tiled_attention", "test_tiled_attention_causal",
                                                      "test_tiled_attention_mask"])
    assert all(results.values()), results
