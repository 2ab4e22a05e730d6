"""Exercise 08's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest

from checking import assert_delegation_named, assert_full_marks, assert_mistake_named, mutate, source_code

A = "08_efficient_attention"
REF = source_code(A)
SETUP = REF.split("def online_softmax_update")[0]  # the given setup cell (attention, tiled_attention)

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
'''


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


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


@pytest.mark.parametrize("code, part", [
    (REF + "\nimport torch.nn.functional as F\n"
           "def cached_attention(query, key, value, cache):\n"
           "    keys, values = append_to_cache(cache, key, value)\n"
           "    return F.scaled_dot_product_attention(query, keys, values), (keys, values)\n", "cached_attention"),
    (REF + "\nfrom attnkit.efficient import online_softmax_update\n", "online_softmax_update"),
], ids=["torch-sdpa", "import-attnkit"])
def test_delegation_earns_nothing_for_that_part(code, part):
    assert_delegation_named(A, code, part)
