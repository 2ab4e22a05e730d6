"""Exercise 05's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest

import checking
from autograder.judging.checks.ch05_cross_attention import STATED_REQUIREMENTS
from chapter_checking import UNIFORM_LAYER, assert_earns_only, assert_requirement_broken_alone
from checking import assert_full_marks, assert_mistake_named, mutate, run_suite, source_code

A = "05_cross_attention"
REF = source_code(A)
SETUP = REF.split("class CrossAttention")[0]
REST = REF[REF.index("def source_padding_mask"):]  # parts 2 and 3 and the answers to the questions

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
        w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # an all-padding example: zeros, not NaN
        o = torch.einsum("bhnm,bmhd->bnhd", w, v).reshape(B, n, E)
        return a.out_proj(o), w
''' + REST

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
''' + REST


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


# Mixing up which sequence feeds the keys or values breaks every call with n != m: no CrossAttention check can pass.
CROSS_CHECKS = ["test_cross_attention_shapes", "test_cross_attention_values", "test_cross_attention_mask",
                "test_cross_attention_properties"]
NOTHING_WORKS = {"keys from x", "values from x", "queries from the context", "context ignored"}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    results = assert_mistake_named(A, name, *MISTAKES[name])
    if name in NOTHING_WORKS:  # every CrossAttention check says what went wrong in terms of the two sequences
        assert all("context" in results[g] for g in CROSS_CHECKS), results


def test_mask_on_the_query_axis_costs_only_the_mask_check():
    """The properties check must not blame the keys and values for a mask on the wrong axis."""
    results = run_suite(A, MISTAKES["mask on the query axis"][0])
    assert "wrong axis" in results["test_cross_attention_mask"], results
    assert results["test_cross_attention_properties"] == "", results


def test_a_module_without_self_attn_is_told_what_to_name_it():
    code = REF.replace("self.attn", "self.mha")
    results = run_suite(A, code)
    assert all("self.attn" in results[g] for g in CROSS_CHECKS), results


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
    assert all(results[g].startswith("earns no points") for g in CROSS_CHECKS), results


# -- stated requirements (issue 13): each one, broken alone, costs points on its check with a named message --

NAN_ROW = ".nan_to_num(0.0)  # an all-padding example: zeros, not NaN"
LENGTH_CHECK = ("    if (lengths < 0).any() or (lengths > m).any():\n"
                "        raise ValueError(f\"every length must lie in [0, m={m}], got {lengths.tolist()}\")\n")
COMPARE = "return positions[None, :] < lengths[:, None]  # (B, m)"
SUBLAYER = "out, weights = self.cross(self.norm(x), memory, mask)  # (B, n, E), (B, H, n, m)"
REQUIREMENTS = {
    # requirement (as in STATED_REQUIREMENTS, which names its check and message): a mutant of the reference
    # that breaks only it
    "CrossAttention holds self.attn": REF.replace("self.attn", "self.mha"),
    "n and m unrelated": MISTAKES["assumes n == m"][0],
    "keys and values from the context": MISTAKES["keys from x"][0],
    "context_mask on the keys axis": MISTAKES["mask on the query axis"][0],
    "context_mask True = real token": MISTAKES["mask polarity"][0],
    "fully padded context: zero weights, no NaN": mutate(EINSUM, NAN_ROW, ""),
    "source mask: True at the first lengths[b]": mutate(REF, COMPARE, "return positions[None, :] <= lengths[:, None]"),
    "source mask: True marks real tokens": mutate(REF, COMPARE, "return positions[None, :] >= lengths[:, None]"),
    "source mask: length 0 is all False": mutate(REF, COMPARE, "return positions[None, :] < lengths.clamp(min=1)[:, None]"),
    "source mask: shape (B, m)": mutate(REF, COMPARE, "return (positions[None, :] < lengths[:, None])[:, None, :]"),
    "source mask: bool dtype": mutate(REF, COMPARE, "return (positions[None, :] < lengths[:, None]).float()"),
    "source mask: ValueError for bad lengths": mutate(REF, LENGTH_CHECK, ""),
    "source mask: ValueError, not another exception": mutate(REF, LENGTH_CHECK, LENGTH_CHECK.replace("ValueError", "IndexError")),
    "sublayer: norm and cross attributes": REF.replace("self.norm", "self.ln"),
    "sublayer: the residual": mutate(REF, "return x + out, weights", "return out, weights"),
    "sublayer: only x is normalised": mutate(REF, SUBLAYER, "out, weights = self.cross(self.norm(x), self.norm(memory), mask)"),
    "sublayer: pre-norm": mutate(REF, SUBLAYER + "\n        return x + out, weights",
                                  "out, weights = self.cross(x, memory, mask)\n        return self.norm(x + out), weights"),
    "sublayer: memory_lengths hide padding": mutate(REF, SUBLAYER, "out, weights = self.cross(self.norm(x), memory)"),
    "sublayer: empty source, no NaN": mutate(EINSUM, NAN_ROW, ""),
}


@pytest.mark.parametrize("name", list(REQUIREMENTS))
def test_stated_requirement_broken_alone_loses_points_on_its_check(name):
    assert_requirement_broken_alone(A, STATED_REQUIREMENTS, REQUIREMENTS, name)


# -- conceptual questions (issue 14): the reference's answers pass; each named wrong answer gets its message --

QUESTIONS = {
    "q_cross_weights_shape": [("(2, 4, 7, 5)", "swapped"), ("(2, 4, 5, 5)", "keys come from the source"),
                              ("(2, 5, 7)", "heads are missing"), ("(2, 4, 7, 7)", "encoder's self-attention"),
                              ("(2, 4, 5)", "not right"), ('"(2, 4, 5, 7)"', "should be a tuple")],
    "q_keys_from": [('"decoder"', "supplies the queries"), ('"both"', "should be one of")],
    "q_output_shape": [("(2, 7, 16)", "one row per source token"), ("(2, 5, 7)", "weighted sum"),
                       ("(2, 4, 5, 4)", "heads are not merged")],
    "q_padded_weight": [("math.exp(2) / (math.exp(2) + 1 + math.exp(3))", "padded token attended"),
                        ("0.0", "polarity"), ("math.exp(2) / (math.exp(2) + 2)", "instead of -inf"),
                        ("1.0", "without the exponential"), ("0.5", "not right")],
}


@pytest.mark.parametrize("name, wrong, words", [(q, w, m) for q, cases in QUESTIONS.items() for w, m in cases])
def test_question_wrong_answer_is_named(name, wrong, words):
    checking.assert_only_question_named(A, checking.with_answer(REF, name, wrong), name, QUESTIONS, words)


# -- issue 34: every check anchored to the reference ------------------------------------------------------

UNIFORM = mutate(REF, CALL, "return _uniform(self.attn, x, context, context, mask)") + UNIFORM_LAYER


def test_an_answer_that_ignores_its_inputs_earns_only_the_shapes():
    """Issue 34: uniform weights earned the mask check (its own weights renormalised) and the properties check (a mean
    over the context ignores its order, and row i of the output depends on x's row i only)."""
    results = assert_earns_only(A, UNIFORM, {"CrossAttention", "DecoderCrossAttention"}, {"test_cross_attention_shapes"})
    assert all("not attention of its inputs" in results[g] for g in
               ("test_cross_attention_mask", "test_cross_attention_properties", "test_decoder_cross_attention_padding")), results
