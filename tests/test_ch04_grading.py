"""Exercise 04's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest

from checking import assert_delegation_named, assert_full_marks, assert_mistake_named, mutate, run_suite, source_code

A = "04_masked_attention"
REF = source_code(A)
SETUP = REF.split("def causal_mask")[0]  # the given setup cell

UNUSUAL = SETUP + '''
def causal_mask(n, device=None):
    i = torch.arange(n, device=device)
    return i[:, None] >= i[None, :]

def padding_mask(lengths, max_len):
    rows = [[pos < int(length) for pos in range(max_len)] for length in lengths.tolist()]
    return torch.tensor(rows, dtype=torch.bool, device=lengths.device).reshape(len(rows), 1, max_len)

def masked_attention(query, key, value, mask):
    q, k, v = query.double(), key.double(), value.double()
    scores = torch.einsum("...nd,...md->...nm", q, k) / math.sqrt(q.shape[-1])
    scores = torch.where(mask, scores, torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device))
    top = scores.amax(-1, keepdim=True).clamp_min(-1e300)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    e = torch.exp(scores - top)
    total = e.sum(-1, keepdim=True)
    w = torch.where(total > 0, e / total, torch.zeros_like(e))
    return (w @ v).to(query.dtype), w.to(query.dtype)
'''

CAUSAL = "return torch.ones(n, n, dtype=torch.bool, device=device).tril()  # (n, n)"
PAD = "return (positions < lengths[:, None])[:, None, :]  # (B, 1, max_len)"
SOFTMAX = 'weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # (..., n, m) a fully masked row: 0/0 -> 0'
FILL = 'scores = scores.masked_fill(~mask, float("-inf"))'
MISTAKES = {
    # name: (mutated code, the checks that must fail, words each message must contain)
    "inverted causal mask": (mutate(REF, CAUSAL, "return ~torch.ones(n, n, dtype=torch.bool, device=device).tril()"),
                             ["test_causal_mask", "test_causality"], "inverted"),
    "strictly lower causal mask": (mutate(REF, CAUSAL, "return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)"),
                                   ["test_causal_mask", "test_causality"], "diagonal is hidden"),
    "causal mask sees the next position": (mutate(REF, CAUSAL, "return torch.ones(n, n, dtype=torch.bool, device=device).tril(1)"),
                                           ["test_causal_mask", "test_causality"], "see the next (future) position"),
    "upper triangle": (mutate(REF, CAUSAL, "return torch.ones(n, n, dtype=torch.bool, device=device).triu()"),
                       ["test_causal_mask", "test_causality"], "future"),
    "float causal mask": (mutate(REF, CAUSAL, "return torch.ones(n, n, device=device).tril()"),
                          ["test_causal_mask", "test_causality"], "bool"),
    "padding off by one (<=)": (mutate(REF, PAD, "return (positions <= lengths[:, None])[:, None, :]"),
                                ["test_padding_mask"], "off by one"),
    "padding off by one (< L-1)": (mutate(REF, PAD, "return (positions < lengths[:, None] - 1)[:, None, :]"),
                                   ["test_padding_mask"], "off by one"),
    "padding inverted": (mutate(REF, PAD, "return (positions >= lengths[:, None])[:, None, :]"),
                         ["test_padding_mask"], "inverted"),
    "padding without query axis": (mutate(REF, PAD, "return positions < lengths[:, None]"),
                                   ["test_padding_mask"], "(B, 1, max_len)"),
    "NaN rows": (mutate(REF, SOFTMAX, "weights = torch.softmax(scores, dim=-1)"),
                 ["test_masked_attention_fully_masked", "test_masked_mha"], "NaN"),
    "mask after the softmax": (mutate(mutate(REF, FILL, "pass"), SOFTMAX,
                                      "weights = torch.softmax(scores, dim=-1) * mask"),
                               ["test_masked_attention"], "after the softmax"),
    "mask polarity in attention": (mutate(REF, FILL, 'scores = scores.masked_fill(mask, float("-inf"))'),
                                   ["test_masked_attention"], "inverted"),
    "mask ignored": (mutate(REF, FILL, "pass"), ["test_masked_attention", "test_causality"], "mask"),
    "mask transposed in attention": (mutate(REF, FILL, 'scores = scores.masked_fill(~mask.transpose(-2, -1), float("-inf"))'),
                                     ["test_masked_attention"], "mask is used transposed"),
    "no scaling": (mutate(REF, "scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])",
                          "scores = query @ key.transpose(-2, -1)"),
                   ["test_masked_attention", "test_masked_attention_fully_masked", "test_masked_mha", "test_causality"],
                   "not scaled"),
    "large negative fill, no zero rows": (mutate(REF, FILL, "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)"),
                                          ["test_masked_attention_fully_masked", "test_masked_mha"], "equal weights"),
}


def test_reference_gets_full_marks():
    assert_full_marks(A, REF)


def test_unusual_correct_answer_gets_full_marks():
    assert_full_marks(A, UNUSUAL)


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


@pytest.mark.parametrize("diagonal", [-1, 1])
def test_causal_mask_off_by_one_is_named_not_called_inverted(diagonal):
    code = mutate(REF, CAUSAL, f"return torch.ones(n, n, dtype=torch.bool, device=device).tril({diagonal})")
    results = run_suite(A, code)
    assert "off by one" in results["test_causal_mask"], results
    assert "inverted" not in results["test_causality"], results


def test_delegation_earns_nothing_for_that_part():
    code = REF + ("\nimport torch.nn.functional as F\ndef masked_attention(query, key, value, mask):\n"
                  "    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)\n    return out, None\n")
    results = assert_delegation_named(A, code, "masked_attention")
    assert results["test_causal_mask"] == "" and results["test_padding_mask"] == ""
