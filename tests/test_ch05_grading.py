"""Exercise 05's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest

from checking import assert_full_marks, assert_mistake_named, mutate, run_suite, source_code

A = "05_cross_attention"
REF = source_code(A)
SETUP = REF.split("class CrossAttention")[0]

# Uses only the given module's projections and writes the attention with einsum; mask expanded to (B, n, m).
EINSUM = SETUP + '''
class CrossAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = MultiHeadAttention(embed_dim, num_heads)

    def forward(self, x, context, context_mask=None):
        a = self.attn
        B, n, E = x.shape
        m = context.shape[1]
        H, D = a.num_heads, a.head_dim
        q = a.q_proj(x).reshape(B, n, H, D)
        k = a.k_proj(context).reshape(B, m, H, D)
        v = a.v_proj(context).reshape(B, m, H, D)
        s = torch.einsum("bnhd,bmhd->bhnm", q, k) / D ** 0.5
        if context_mask is not None:
            s = s.masked_fill(~context_mask.unsqueeze(1).unsqueeze(2).expand(B, H, n, m), float("-inf"))
        w = torch.softmax(s, dim=-1)
        o = torch.einsum("bhnm,bmhd->bnhd", w, v).reshape(B, n, E)
        return a.out_proj(o), w
'''

# Keyword arguments, a full (B, n, m) mask built with torch.where, a float64 round trip.
KEYWORDS = SETUP + '''
class CrossAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = MultiHeadAttention(embed_dim=embed_dim, num_heads=num_heads)

    def forward(self, x, context, context_mask=None):
        if context_mask is None:
            return self.attn(query=x, key=context, value=context)
        full = torch.where(context_mask[:, None, :], torch.ones(x.shape[1], 1, dtype=torch.bool, device=x.device), False)
        out, w = self.attn(query=x, key=context, value=context, mask=full)
        return out, w
'''


def test_reference_gets_full_marks():
    assert_full_marks(A, REF)


@pytest.mark.parametrize("code", [EINSUM, KEYWORDS], ids=["einsum-own-attention", "keywords-full-mask"])
def test_unusual_correct_answers_get_full_marks(code):
    assert_full_marks(A, code)


CALL = "return self.attn(x, context, context, mask)"
MASK = "mask = context_mask[:, None, :]"
MISTAKES = {
    # name: (mutated code, a check that must fail, words its message must contain)
    "keys from x": (mutate(REF, CALL, "return self.attn(x, x, context, mask)"), "test_cross_attention_values", "keys are taken from x"),
    "values from x": (mutate(REF, CALL, "return self.attn(x, context, x, mask)"), "test_cross_attention_values", "values are taken from x"),
    "queries from the context": (mutate(REF, CALL, "return self.attn(context, x, x, mask)"), "test_cross_attention_shapes", "queries come from x"),
    "context ignored": (mutate(REF, CALL, "return self.attn(x, x, x, mask)"), "test_cross_attention_shapes", "keys come from x"),
    "mask on the query axis": (mutate(REF, MASK, "mask = context_mask[:, :, None]"), "test_cross_attention_mask", "wrong axis"),
    "mask ignored": (mutate(REF, CALL, "return self.attn(x, context, context)"), "test_cross_attention_mask", "mask is ignored"),
    "mask polarity": (mutate(REF, MASK, "mask = ~context_mask[:, None, :]"), "test_cross_attention_mask", "polarity"),
    "assumes n == m": (mutate(REF, MASK, "mask = context_mask[:, None, :].expand(-1, x.shape[1], x.shape[1])"),
                       "test_cross_attention_mask", "different lengths"),
    "mask reshaped with n": (mutate(REF, MASK, "mask = context_mask.reshape(x.shape[0], 1, x.shape[1])"),
                             "test_cross_attention_mask", "x's length n"),
}


# Mixing up which sequence feeds the keys or values breaks every call with n != m: no check can pass then.
NOTHING_WORKS = {"keys from x", "values from x", "queries from the context", "context ignored"}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    results = assert_mistake_named(A, name, *MISTAKES[name], partial=name not in NOTHING_WORKS)
    if name in NOTHING_WORKS:  # every check says what went wrong in terms of the two sequences
        assert all("context" in m for m in results.values()), results


def test_mask_on_the_query_axis_costs_only_the_mask_check():
    """The properties check must not blame the keys and values for a mask on the wrong axis."""
    results = run_suite(A, MISTAKES["mask on the query axis"][0])
    assert "wrong axis" in results["test_cross_attention_mask"], results
    assert results["test_cross_attention_properties"] == "", results


def test_a_module_without_self_attn_is_told_what_to_name_it():
    code = REF.replace("self.attn", "self.mha")
    results = run_suite(A, code)
    assert all("self.attn" in msg for msg in results.values()), results


def test_torch_multihead_attention_earns_nothing():
    code = SETUP + '''
class CrossAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

    def forward(self, x, context, context_mask=None):
        return self.attn(x, context, context, key_padding_mask=None if context_mask is None else ~context_mask)
'''
    results = run_suite(A, code)
    assert all(msg.startswith("earns no points") for msg in results.values()), results
