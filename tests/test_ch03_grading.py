"""Exercise 03's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest

from checking import assert_delegation_named, assert_full_marks, assert_mistake_named, mutate, source_code

A = "03_self_attention"
REF = source_code(A)
SETUP = REF.split("class SelfAttention")[0]  # the given setup cell

UNUSUAL = SETUP + '''
class SelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = MultiHeadAttention(embed_dim, num_heads)

    def forward(self, x, mask=None):
        if mask is None:
            return self.attn(x, x, x)
        return self.attn(query=x, key=x, value=x, mask=mask)


def design_weights(x, targets):
    # queries pick the target directly, keys are a scaled copy of the embeddings; float64 inside
    x64 = x.double()
    onehot = torch.nn.functional.one_hot(targets.long(), x.shape[0]).double()  # (n, n)
    W_q = (x64.T @ onehot @ x64) * 6.0                 # (d, d)
    W_k = x64.T @ x64 * 6.0 * x.shape[1] ** 0.5        # (d, d) projects onto the span of the rows
    return W_q.to(x.dtype), W_k.to(x.dtype)
'''

# The key side does the choosing instead: key j is the embedding of every position that targets j.
KEY_SIDE = SETUP + REF.split("def design_weights")[0].split(SETUP)[1] + '''
def design_weights(x, targets):
    n, d = x.shape
    S = torch.zeros(n, n)
    for i, t in enumerate(targets.tolist()):
        S[i, t] = 1.0
    W_q = torch.eye(d) * 5 * d ** 0.25
    W_k = x.cpu().T @ S.T @ x.cpu() * 5 * d ** 0.25
    return W_q.to(x.device), W_k.to(x.device)
'''


def test_reference_gets_full_marks():
    assert_full_marks(A, REF)


@pytest.mark.parametrize("code", [UNUSUAL, KEY_SIDE], ids=["keywords-onehot-float64", "key-side-loop"])
def test_unusual_correct_answers_get_full_marks(code):
    assert_full_marks(A, code)


FWD = "return self.attn(x, x, x, mask)  # (B, n, E), (B, H, n, n)"
DESIGN = "W_q = strength * math.sqrt(d) * x.T @ select @ x"
MISTAKES = {
    "mask ignored": (mutate(REF, FWD, "return self.attn(x, x, x)"), ["test_self_attention_mask"], "mask is ignored"),
    "attn built in forward": (mutate(REF, FWD, "self.attn = MultiHeadAttention(x.shape[-1], self.attn.num_heads)\n"
                                     "        return self.attn(x, x, x, mask)"),
                              ["test_self_attention_values"], "in __init__"),
    "only the output": (mutate(REF, FWD, "return self.attn(x, x, x, mask)[0]"),
                        ["test_self_attention_shapes", "test_self_attention_values"], "pair"),
    "wrong attribute name": (mutate(mutate(REF, "self.attn = MultiHeadAttention", "self.mha = MultiHeadAttention"),
                                    FWD, "return self.mha(x, x, x, mask)"), ["test_self_attention_shapes"], "attn"),
    "attends to itself": (mutate(REF, DESIGN, "W_q = strength * math.sqrt(d) * x.T @ x"), ["test_design_weights"],
                          "attends to itself"),
    "transposed pattern": (mutate(REF, DESIGN, "W_q = strength * math.sqrt(d) * x.T @ select.T @ x"),
                           ["test_design_weights"], "transposed"),
    "too weak": (mutate(REF, "strength = 12.0", "strength = 1.0"), ["test_design_weights"], "scale"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


def test_delegation_earns_nothing_for_that_part():
    code = REF + "\nclass SelfAttention(nn.Module):\n    def __init__(self, e, h):\n        super().__init__()\n" \
                 "        self.attn = nn.MultiheadAttention(e, h, batch_first=True)\n"
    results = assert_delegation_named(A, code, "SelfAttention")
    assert results["test_design_weights"] == ""
