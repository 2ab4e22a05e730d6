"""The static authorship scan: delegation is found through helpers and globals, never through a shared local name.

Students often add a cell that checks their answer against torch's own attention. Those
cells bind names (``x``, ``out``, ``scores``) that the answer's functions also use as
locals or parameters; the scan follows Python's scopes, so only a real global reaches
the answer.
"""

from __future__ import annotations

import textwrap

import pytest

from autograder.authorship import delegations

PARTS = ["softmax", "scaled_dot_product_attention", "MultiHeadAttention", "online_softmax_update"]
FORBIDDEN = {"softmax": {"softmax": "torch's softmax"}}

ANSWERS = '''
import math
import torch
import torch.nn.functional as F

def softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)

def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    w = softmax(scores)
    return w @ v, w

class MultiHeadAttention(torch.nn.Module):
    def scaled_dot_product_attention(self, q, k, v):
        return scaled_dot_product_attention(q, k, v)[0]

    def forward(self, x):
        out = self.scaled_dot_product_attention(x, x, x)
        return out

def online_softmax_update(running_max, running_sum, acc, scores, values):
    return running_max, running_sum, acc
'''


def scan(*cells: str) -> dict[str, str]:
    return delegations("\n\n".join(textwrap.dedent(c) for c in (ANSWERS, *cells)), PARTS, FORBIDDEN)


@pytest.mark.parametrize("self_check", [
    # names the answers use as locals or parameters, bound at top level by a self-check
    "x = torch.randn(2, 3, 4)\nout = F.scaled_dot_product_attention(x, x, x)\n",
    "with torch.no_grad():\n    q = k = v = torch.randn(2, 3, 4)\n    w = F.scaled_dot_product_attention(q, k, v)\n",
    "for scores in [torch.randn(2, 3)]:\n    ref = F.scaled_dot_product_attention(scores, scores, scores)\n",
    "for num_heads in (1, 2):\n    mha = torch.nn.MultiheadAttention(8, num_heads, batch_first=True)\n",
    "if True:\n    e = torch.nn.TransformerEncoderLayer(8, 2)\n    x = e(torch.randn(3, 2, 8))\n",
    "try:\n    dim = F.scaled_dot_product_attention\nexcept Exception as mask:\n    pass\n",
])
def test_a_self_check_cell_taints_nothing(self_check):
    assert scan(self_check) == {}


def test_a_method_of_the_students_own_named_like_torchs_is_not_torchs():
    assert scan() == {}


@pytest.mark.parametrize("cells, part, says", [
    (["def scaled_dot_product_attention(q, k, v, mask=None):\n    return F.scaled_dot_product_attention(q, k, v), None\n"],
     "scaled_dot_product_attention", "torch's scaled_dot_product_attention"),
    # through a helper, and through a global value computed with torch's attention
    (["def helper(q):\n    return F.scaled_dot_product_attention(q, q, q)\n",
      "def scaled_dot_product_attention(q, k, v, mask=None):\n    return helper(q), None\n"],
     "scaled_dot_product_attention", "calls helper"),
    (["CACHE = F.scaled_dot_product_attention(torch.ones(1, 2, 2), torch.ones(1, 2, 2), torch.ones(1, 2, 2))\n",
      "def scaled_dot_product_attention(q, k, v, mask=None):\n    return CACHE, None\n"],
     "scaled_dot_product_attention", "calls CACHE"),
    # a global read inside a function that also has locals; `global` makes an assignment global
    (["def scaled_dot_product_attention(q, k, v, mask=None):\n    global out\n    out = q\n    return out, None\n",
      "out = F.scaled_dot_product_attention(torch.ones(1, 2, 2), torch.ones(1, 2, 2), torch.ones(1, 2, 2))\n"],
     "scaled_dot_product_attention", "calls out"),
    # definitions hidden in compound statements are still definitions
    (["try:\n    def softmax(x, dim=-1):\n        return torch.softmax(x, dim)\nexcept Exception:\n    pass\n"],
     "softmax", "torch's softmax"),
    (["if True:\n    class MultiHeadAttention(torch.nn.Module):\n        def forward(self, x):\n"
      "            return torch.nn.MultiheadAttention(4, 2)(x, x, x)[0]\n"],
     "MultiHeadAttention", "torch.nn.MultiheadAttention"),
    # `self.<name>` is only exempt when the student defined <name>
    (["class MultiHeadAttention(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
      "        self.inner = torch.nn.MultiheadAttention(4, 2)\n    def forward(self, x):\n"
      "        return self.inner(x, x, x)[0]\n"],
     "MultiHeadAttention", "torch.nn.MultiheadAttention"),
    (["def softmax(x, dim=-1):\n    return x.softmax(dim)\n"], "softmax", "torch's softmax"),
])
def test_delegation_is_still_found(cells, part, says):
    found = scan(*cells)
    assert part in found and says in found[part], found
