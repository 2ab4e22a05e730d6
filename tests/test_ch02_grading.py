"""Exercise 02's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest

from checking import assert_delegation_named, assert_full_marks, assert_mistake_named, mutate, source_code

A = "02_multi_head"
REF = source_code(A)
SETUP = REF.split("def split_heads")[0]  # the given setup cell (softmax, scaled_dot_product_attention)

LOOP_EINSUM = SETUP + '''
def split_heads(x, num_heads):
    heads = x.chunk(num_heads, dim=-1)  # H tensors (B, n, Dh)
    return torch.stack(heads, dim=1)

def merge_heads(x):
    return torch.cat(x.unbind(dim=1), dim=-1)

class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__()
        assert embed_dim % num_heads == 0, "embed_dim must be divisible by num_heads"
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
'''

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
'''


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
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
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
