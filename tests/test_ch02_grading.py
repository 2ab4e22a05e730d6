"""Exercise 02's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest
import torch

from autograder.judging.checks.ch02_multi_head import STATED_REQUIREMENTS
from chapter_checking import (UNIFORM_LAYER, assert_answer_named, assert_earns_only, assert_questions_pass, assert_requirement_broken_alone, grade_answer,
                              question_answers)
from checking import assert_delegation_named, assert_full_marks, assert_mistake_named, mutate, run_suite, source_code

A = "02_multi_head"
REF = source_code(A)
SETUP = REF.split("def split_heads")[0]  # the given setup cell (softmax, scaled_dot_product_attention)
# the reference answers to the conceptual questions, appended to the unusual (otherwise complete) answers below
QUESTIONS = question_answers(A, "multi_head.ipynb")

LOOP_EINSUM = SETUP + '''
def split_heads(x, num_heads):
    heads = x.chunk(num_heads, dim=-1)  # H tensors (B, n, Dh)
    return torch.stack(heads, dim=1)

def merge_heads(x):
    return torch.cat(x.unbind(dim=1), dim=-1)

class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.h, self.d = num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias)

    def forward(self, query, key, value, mask=None):
        Q, K, V = self.q_proj(query).double(), self.k_proj(key).double(), self.v_proj(value).double()
        outs, weights = [], []
        for i in range(self.h):
            cols = slice(i * self.d, (i + 1) * self.d)
            s = torch.einsum("bnd,bmd->bnm", Q[..., cols], K[..., cols]) / self.d ** 0.5
            if mask is not None:
                m = mask[:, i] if mask.dim() == 4 else mask
                s = s.masked_fill(~m, float("-inf"))
            w = torch.softmax(s, dim=-1).nan_to_num(0.0)
            outs.append(w @ V[..., cols])
            weights.append(w)
        out = torch.cat(outs, dim=-1).to(query.dtype)
        return self.out_proj(out), torch.stack(weights, dim=1).to(query.dtype)
''' + QUESTIONS

# A wide head-batched version that permutes instead of transposing and never calls the given attention.
PERMUTE = SETUP + '''
def split_heads(x, num_heads):
    B, n, E = x.shape
    return x.reshape(B, n, num_heads, -1).permute(0, 2, 1, 3).contiguous()

def merge_heads(x):
    B, H, n, Dh = x.shape
    return x.permute(0, 2, 1, 3).flatten(2)

class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError("indivisible")
        self.num_heads = num_heads
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self, name, nn.Linear(embed_dim, embed_dim, bias=bias))

    def forward(self, query, key, value, mask=None):
        H = self.num_heads
        q, k, v = split_heads(self.q_proj(query), H), split_heads(self.k_proj(key), H), split_heads(self.v_proj(value), H)
        s = torch.matmul(q, k.mT) * q.shape[-1] ** -0.5
        if mask is not None:
            while mask.dim() < 4:
                mask = mask.unsqueeze(-3)
            s = torch.where(mask, s, float("-inf"))
        w = softmax(s)
        return self.out_proj(merge_heads(w @ v)), w
''' + QUESTIONS


def test_reference_gets_full_marks():
    assert_full_marks(A, REF)


@pytest.mark.parametrize("code", [LOOP_EINSUM, PERMUTE], ids=["loop-over-heads-einsum-float64", "permute-where"])
def test_unusual_correct_answers_get_full_marks(code):
    assert_full_marks(A, code)


SPLIT = "return x.view(B, n, num_heads, E // num_heads).transpose(1, 2)"
MERGE = "return x.transpose(1, 2).reshape(B, n, H * Dh)"
Q = "q = split_heads(self.q_proj(query), self.num_heads)"
K = "k = split_heads(self.k_proj(key), self.num_heads)"
V = "v = split_heads(self.v_proj(value), self.num_heads)"
ATTN = "out, weights = scaled_dot_product_attention(q, k, v, mask)"
MISTAKES = {
    # name: (mutated code, the checks that must fail, words each message must contain)
    "split without transpose": (mutate(REF, SPLIT, "return x.reshape(B, num_heads, n, E // num_heads)"),
                                ["test_split_heads", "test_mha_values"], "without the transpose"),
    "split interleaved": (mutate(REF, SPLIT, "return x.view(B, n, E // num_heads, num_heads).permute(0, 3, 1, 2)"),
                          ["test_split_heads"], "interleaved"),
    "split forgets transpose": (mutate(REF, SPLIT, "return x.view(B, n, num_heads, E // num_heads)"),
                                ["test_split_heads"], "transpose"),
    "merge without transpose": (mutate(REF, MERGE, "return x.reshape(B, n, H * Dh)"),
                                ["test_merge_heads", "test_mha_values"], "without the transpose"),
    "heads merged in reverse order": (mutate(REF, MERGE, "return x.flip(1).transpose(1, 2).reshape(B, n, H * Dh)"),
                                      ["test_merge_heads", "test_mha_values"], "reverse order"),
    "heads reversed before merging": (mutate(REF, "return self.out_proj(merge_heads(out)), weights",
                                             "return self.out_proj(merge_heads(out.flip(1))), weights"),
                                      ["test_mha_values"], "reverse order"),
    "no scaling": (mutate(REF, ATTN, "q = q * math.sqrt(q.shape[-1])\n        " + ATTN), ["test_mha_values"], "not scaled"),
    "scale by sqrt(embed_dim)": (mutate(REF, ATTN, "q = q * math.sqrt(q.shape[-1] / (q.shape[-1] * self.num_heads))\n"
                                        "        " + ATTN), ["test_mha_values"], "sqrt(head_dim)"),
    "no output projection": (mutate(REF, "return self.out_proj(merge_heads(out)), weights",
                                    "return merge_heads(out), weights"), ["test_mha_values"], "out_proj is missing"),
    "k_proj on value, v_proj on key": (mutate(mutate(REF, K, "k = split_heads(self.k_proj(value), self.num_heads)"),
                                              V, "v = split_heads(self.v_proj(key), self.num_heads)"),
                                       ["test_mha_values"], "wrong input"),
    "q_proj for keys": (mutate(REF, K, "k = split_heads(self.q_proj(key), self.num_heads)"),
                        ["test_mha_values"], "keys are projected with q_proj"),
    "v_proj on key": (mutate(REF, V, "v = split_heads(self.v_proj(key), self.num_heads)"), ["test_mha_values"],
                      "wrong input"),
    "mask ignored": (mutate(REF, ATTN, "out, weights = scaled_dot_product_attention(q, k, v)"),
                     ["test_mha_mask"], "mask is ignored"),
    "3-D mask without head axis": (mutate(REF, "mask = mask.unsqueeze(1)", "pass"), ["test_mha_mask"], "unsqueeze(1)"),
    "averaged weights": (mutate(REF, "return self.out_proj(merge_heads(out)), weights",
                                "return self.out_proj(merge_heads(out)), weights.mean(1)"),
                         ["test_mha_shapes", "test_mha_values"], "per-head"),
    "no divisibility check": (mutate(REF, '''        if embed_dim % num_heads:
            raise ValueError(
                f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
''', ""), ["test_mha_shapes"], "divisible"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


@pytest.mark.parametrize("code, part", [
    (REF + "\nclass MultiHeadAttention(nn.MultiheadAttention):\n    pass\n", "MultiHeadAttention"),
    (REF + "\nimport torch.nn.functional as F\n_sdpa = F.scaled_dot_product_attention\n"
           "def split_heads(x, num_heads):\n    _sdpa\n    B, n, E = x.shape\n"
           "    return x.view(B, n, num_heads, -1).transpose(1, 2)\n", "split_heads"),
    (REF + "\nfrom attnkit import merge_heads\n", "merge_heads"),
], ids=["subclass-torch-mha", "helper-torch-sdpa", "import-attnkit"])
def test_delegation_earns_nothing_for_that_part(code, part):
    assert_delegation_named(A, code, part)


# -- stated requirements (issue 13): each one broken alone loses points on its check, named -------------

OWN_SOFTMAX_NAN = '''s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, n, m)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(s, dim=-1)  # a fully masked row: 0/0 = NaN
        out = weights @ v'''
REQUIREMENTS = {
    # requirement (as in STATED_REQUIREMENTS, which names its check and message): a mutant of the reference
    # that breaks only it
    "split: head axis before the sequence axis": MISTAKES["split forgets transpose"][0],
    "split: contiguous feature blocks per head": MISTAKES["split interleaved"][0],
    "merge: inverse of split, heads in order": MISTAKES["heads merged in reverse order"][0],
    "four nn.Linear(E, E) projections": mutate(mutate(REF, "self.out_proj = nn.Linear", "self.o_proj = nn.Linear"),
                                                "return self.out_proj(", "return self.o_proj("),
    "bias flag": mutate(REF, "bias=bias)", "bias=True)"),
    "ValueError when E % H != 0": mutate(REF, '''        if embed_dim % num_heads:
            raise ValueError(
                f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")''',
                                          '''        assert embed_dim % num_heads == 0, "embed_dim must be divisible by num_heads"'''),
    "per-head weights (B, H, n, m), n != m": MISTAKES["averaged weights"][0],
    "each projection on its own input": MISTAKES["v_proj on key"][0],
    "scale 1/sqrt(head_dim)": MISTAKES["scale by sqrt(embed_dim)"][0],
    "out_proj on the merged heads": MISTAKES["no output projection"][0],
    "mask True means may attend": mutate(REF, ATTN, "out, weights = scaled_dot_product_attention(q, k, v, "
                                                     "None if mask is None else ~mask)"),
    "3-D mask applies to every head": MISTAKES["3-D mask without head axis"][0],
    "4-D mask per head": mutate(REF, ATTN, "if mask is not None and mask.dim() == 4:\n"
                                            "            mask = mask[:, :1]  # head 0's mask for every head\n        " + ATTN),
    "fully masked row gives zeros": mutate(REF, ATTN, OWN_SOFTMAX_NAN),
}


@pytest.mark.parametrize("name", list(REQUIREMENTS))
def test_stated_requirement_broken_alone_loses_points_on_its_check(name):
    assert_requirement_broken_alone(A, STATED_REQUIREMENTS, REQUIREMENTS, name)


def test_large_negative_fill_is_named_for_a_fully_masked_row():
    code = mutate(REF, ATTN, OWN_SOFTMAX_NAN.replace('float("-inf")', "-1e9").replace("  # a fully masked row: 0/0 = NaN", ""))
    assert_mistake_named(A, "large negative fill", code, "test_mha_mask", "equal weights")


# -- conceptual questions (issue 14) ------------------------------------------------------------------


def test_reference_answers_to_questions_get_full_marks():
    assert_questions_pass(A, SETUP + QUESTIONS)


@pytest.mark.parametrize("gid, value", [
    ("test_q_split_shape", [4, 8, 10, 12]), ("test_q_head_scale", 8), ("test_q_mha_params", 1050624.0),
    ("test_q_weights_shape", torch.Size([2, 4, 5, 7])),
])
def test_right_answers_in_other_forms_get_the_point(gid, value):
    assert grade_answer(A, gid, **{gid.removeprefix("test_"): value}) == ""


QUESTION_MISTAKES = [
    # (check, wrong value, words its message must contain)
    ("test_q_split_shape", (4, 10, 8, 12), "before the transpose"),
    ("test_q_split_shape", (4, 8, 10, 96), "all E = 96 features"),
    ("test_q_split_shape", (4, 12, 10, 8), "swaps the number of heads"),
    ("test_q_split_shape", (32, 10, 12), "folds the heads into the batch"),
    ("test_q_head_scale", 22.627, "sqrt(embed_dim)"),
    ("test_q_head_scale", 64, "head_dim itself"),
    ("test_q_head_scale", 512, "embed_dim"),
    ("test_q_head_scale", 2.828, "number of heads"),
    ("test_q_mha_params", 4 * 512 * 512, "bias"),
    ("test_q_mha_params", 3 * (512 * 512 + 512), "not out_proj"),
    ("test_q_mha_params", 25 * (512 * 512 + 512), "its own (E, E) projections"),
    ("test_q_mha_params", 25 * 512 * 512, "its own (E, E) projections"),
    ("test_q_mha_params", 4 * (512 * 64 + 64), "one head's"),
    ("test_q_weights_shape", (2, 5, 7), "averaged over the heads"),
    ("test_q_weights_shape", (2, 4, 5, 16), "before merging"),
    ("test_q_weights_shape", (2, 4, 7, 5), "one row per query"),
    ("test_q_weights_shape", (8, 5, 7), "folds the heads"),
    ("test_q_weights_shape", (2, 5, 64), "shape of the output"),
]


@pytest.mark.parametrize("gid, value, words", QUESTION_MISTAKES)
def test_usual_wrong_answer_is_named(gid, value, words):
    assert_answer_named(A, gid, value, words)


@pytest.mark.parametrize("gid, value", [("test_q_split_shape", (4, 8, 12, 10)), ("test_q_head_scale", 7.9),
                                        ("test_q_mha_params", 1050625), ("test_q_weights_shape", "(2, 4, 5, 7)")])
def test_other_wrong_answers_fail_without_giving_the_answer_away(gid, value):
    message = grade_answer(A, gid, **{gid.removeprefix("test_"): value})
    assert message and "(4, 8, 10, 12)" not in message and "1050624" not in message and "(2, 4, 5, 7)" not in message, message


def test_out_proj_bias_with_bias_false_is_charged_once():
    """The text states out_proj follows bias too (issue 23); an answer that forgets it loses test_mha_shapes only,
    with a message naming out_proj, and its values are still judged right."""
    code = mutate(REF, "self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)",
                  "self.out_proj = nn.Linear(embed_dim, embed_dim)")
    results = run_suite(A, code)
    assert "out_proj" in results["test_mha_shapes"], results
    assert [gid for gid, msg in results.items() if msg] == ["test_mha_shapes"], results


# -- issue 34: every check anchored to the reference ------------------------------------------------------

UNIFORM = mutate(REF, ATTN, "allowed = torch.ones(*q.shape[:-1], k.shape[-2], dtype=torch.bool)\n"
                 "        allowed = allowed if mask is None else allowed & mask\n"
                 "        weights = allowed.to(q.dtype) / allowed.sum(-1, keepdim=True).clamp_min(1).to(q.dtype)\n"
                 "        out = weights @ v  # weights uniform over the allowed keys, whatever q and k are")


def test_an_answer_that_ignores_its_inputs_earns_only_the_shapes():
    """Issue 34: uniform weights over the allowed keys earned test_mha_mask (its own unmasked weights renormalised)."""
    results = assert_earns_only(A, UNIFORM, "MultiHeadAttention", {"test_mha_shapes"})
    assert "not attention of its inputs" in results["test_mha_mask"], results["test_mha_mask"]
