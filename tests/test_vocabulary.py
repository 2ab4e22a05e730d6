"""One vocabulary per part (issue 34): the rule a student can read is the rule the judge enforces.

The table (``attnkit.vocabulary``) is printed into every exercise, checked by a visible test and enforced by the
grader: statically, every call a part reaches resolves to the student's own code or to the vocabulary (receivers
resolved); at run time, the topic's operators and the libraries outside are refused. The kinds tested here:
library routes the old name lists missed, names a reader cannot see (computed, reflected, star-imported), and
honest code the old scan caught (a local instance's method, a sub-module's method, an unused debugging method).
"""

from __future__ import annotations

import csv
import json
import textwrap

import pytest

from attnkit.vocabulary import (BASE, VOCABULARIES, Vocabulary, check_vocabulary, describe, outside, vocabulary)
from autograder.course import SOURCE
from autograder.judging.checks import load_suite
from autograder.notebook import nbgrader_meta

SETUP = ["import math\n\nimport torch\n\ndevice = torch.device('cpu')\n"]
STABLE = ("    e = torch.exp(x - x.amax(dim, keepdim=True).nan_to_num(0.0, neginf=0.0))\n"
          "    total = e.sum(dim, keepdim=True)\n    return e / torch.where(total > 0, total, torch.ones_like(total))\n")


def found(code: str | list[str], part: str = "softmax", assignment: str = "01_single_head", **kw) -> list[str]:
    cells = [textwrap.dedent(c) for c in ([code] if isinstance(code, str) else code)]
    return [f.sentence() for f in outside(cells, [part], assignment, setup=kw.pop("setup", SETUP), **kw).get(part, [])]


# Each of these reaches the softmax's topic by a route a list of names did not cover, or by a name the code does not
# show; each is outside the softmax's vocabulary, with the route named.
OUTSIDE = {
    "a distribution by a reversed string": ("def softmax(x, dim=-1):\n    D = getattr(__import__('torch'), "
                                            "'snoitubirtsid'[::-1])\n    return D.Categorical(logits=x).logits.exp()\n",
                                            "computed at run time"),
    "a star import, then an alias": ("from torch.distributions import *\nCategorical = Categorical\n"
                                     "def softmax(x, dim=-1):\n    return Categorical(logits=x).logits.exp()\n",
                                     "star import"),
    "a distribution imported in the function": ("def softmax(x, dim=-1):\n    import torch.distributions as D\n"
                                                "    return D.Categorical(logits=x).probs\n", "torch.distributions"),
    "Triton's softmax": ("import triton.language as tl\ndef softmax(x, dim=-1):\n    return tl.softmax(x)\n",
                         "triton.language.softmax"),
    "the log-sum-exp": ("def softmax(x, dim=-1):\n    return (x - x.logsumexp(dim, keepdim=True)).exp()\n", "logsumexp"),
    "cross-entropy": ("import torch.nn.functional as F\ndef softmax(x, dim=-1):\n"
                      "    return F.cross_entropy(x, x.argmax(dim), reduction='none')\n", "cross_entropy"),
    "a module alias": ("_f = torch.nn.functional\ndef softmax(x, dim=-1):\n    return _f.softmax(x, dim)\n",
                       "torch.nn.functional.softmax"),
    "torch's operators": ("def softmax(x, dim=-1):\n    return torch.ops.aten._softmax(x, dim, False)\n", "torch.ops"),
    "torch's references": ("def softmax(x, dim=-1):\n    return torch._refs.softmax(x, dim)\n", "torch._refs"),
    "the class's method": ("def softmax(x, dim=-1):\n    return torch.Tensor.softmax(x, dim)\n", "softmax"),
    "through type()": ("def softmax(x, dim=-1):\n    return type(x).softmax(x, dim)\n", "softmax"),
    "globals()": ("def softmax(x, dim=-1):\n    return globals()['torch'].special.softmax(x, dim)\n", "softmax"),
    "a method caller": ("import operator\ndef softmax(x, dim=-1):\n    return operator.methodcaller('softmax', dim)(x)\n",
                        "methodcaller"),
    "a module's __dict__": ("def softmax(x, dim=-1):\n    return torch.__dict__['softmax'](x, dim)\n", "__dict__"),
    "another library": ("import scipy.special\ndef softmax(x, dim=-1):\n"
                        "    return torch.tensor(scipy.special.softmax(x.numpy(), dim))\n", "scipy"),
    "the reference package": ("from attnkit import softmax as s\ndef softmax(x, dim=-1):\n    return s(x, dim)\n",
                              "attnkit"),
    "a lambda": ("sm = lambda x, d: x.softmax(d)\ndef softmax(x, dim=-1):\n    return sm(x, dim)\n", "calls sm"),
    "a helper class's method": ("class _T(torch.Tensor):\n    def probs(self):\n        return self.log_softmax(-1).exp()\n"
                                "def softmax(x, dim=-1):\n    return x.as_subclass(_T).probs()\n", "log_softmax"),
}


@pytest.mark.parametrize("name", list(OUTSIDE))
def test_a_route_outside_the_vocabulary_is_found_and_named(name):
    code, says = OUTSIDE[name]
    sentences = found(code)
    assert sentences and says in sentences[0] and "outside its vocabulary" in sentences[0], sentences


HONEST = {
    "a local instance's method named like torch's": "class H:\n    def softmax(self, x, dim):\n" + STABLE.replace(
        "    ", "        ") + "def softmax(x, dim=-1):\n    h = H()\n    return h.softmax(x, dim)\n",
    "a global instance's stable_softmax": "class H:\n    def stable_softmax(self, x, dim):\n" + STABLE.replace(
        "    ", "        ") + "_h = H()\ndef softmax(x, dim=-1):\n    return _h.stable_softmax(x, dim)\n",
    "numpy and math": "import numpy as np\ndef softmax(x, dim=-1):\n    e = torch.exp(x - x.amax(dim, keepdim=True))\n"
                      "    return e / e.sum(dim, keepdim=True) * float(np.float32(math.e) ** 0)\n",
    "an autograd.Function": "class S(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
                            "        e = (x - x.amax(-1, keepdim=True)).exp()\n        ctx.softmax_out = e / e.sum(-1, keepdim=True)\n"
                            "        return ctx.softmax_out\n    @staticmethod\n    def backward(ctx, g):\n"
                            "        s = ctx.softmax_out\n        return s * (g - (g * s).sum(-1, keepdim=True))\n"
                            "def softmax(x, dim=-1):\n    return S.apply(x.movedim(dim, -1)).movedim(-1, dim)\n",
    "a self-check at module level": "def softmax(x, dim=-1):\n" + STABLE +
                                    "torch.testing.assert_close(softmax(torch.ones(3)), torch.softmax(torch.ones(3), -1))\n",
    "torch.compile on one process": "def _sm(x, dim):\n" + STABLE +
                                    "softmax = torch.compile(_sm, backend='aot_eager_decomp_partition')\n",
    "a log-sum-exp by hand": "def softmax(x, dim=-1):\n    top = x.amax(dim, keepdim=True)\n"
                             "    return torch.exp(x - (torch.log(torch.exp(x - top).sum(dim, keepdim=True)) + top))\n",
}


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_code_is_inside(name):
    assert found(HONEST[name]) == []


MHA = '''
from torch import nn
import torch.nn.functional as F

class Core:
    def scaled_dot_product(self, q, k, v):
        w = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1)
        return w @ v, w

class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__()
        self.core = Core()
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, query, key, value, mask=None):
        return self.core.scaled_dot_product(self.q_proj(query), key, value)

    def debug_compare_with_torch(self, x):
        return F.scaled_dot_product_attention(x, x, x)
'''


def test_a_sub_modules_method_and_an_unused_debugging_method_are_the_students():
    """Receivers are resolved (``self.core`` is the student's ``Core``) and a class's methods are units of their own,
    read from its entry points: the debugging method nobody calls costs nothing, until forward calls it."""
    assert found(MHA, "MultiHeadAttention", "02_multi_head") == []
    calling = MHA.replace("return self.core.scaled_dot_product(self.q_proj(query), key, value)",
                          "return self.debug_compare_with_torch(query)")
    sentences = found(calling, "MultiHeadAttention", "02_multi_head")
    assert sentences and "scaled_dot_product_attention" in sentences[0], sentences


def test_the_exercises_own_helper_is_outside_only_where_the_table_says():
    setup = SETUP + ["MAX_SCORES = 2**16\ndef attention(q, k, v, mask=None):\n    return q\n"]
    chunks = ("def tiled_attention(q, k, v, mask=None, causal=False, block_k=4):\n"
              "    return torch.cat([attention(q[..., i:i + 1, :], k, v) for i in range(q.shape[-2])], -2)\n")
    assert "`attention`" in found(chunks, "tiled_attention", "08_efficient_attention", setup=setup)[0]
    cached = "def cached_attention(q, k, v, cache):\n    return attention(q, k, v), cache\n"
    assert found(cached, "cached_attention", "08_efficient_attention", setup=setup) == []


def test_chapter_06s_rotation_has_a_rule_and_chapter_10s_wrapper_no_matrix_product():
    onnx = "def apply_rotary_embedding(x, pos):\n    return torch.onnx.ops.rotary_embedding(x, pos, pos, pos, interleaved=True)\n"
    assert found(onnx, "apply_rotary_embedding", "06_positional_encoding")
    for body in ("torch.mm(q[0, 0], k[0, 0].T)", "q @ k.mT", "q.matmul(k.mT)", "torch.einsum('...nd,...md->...nm', q, k)"):
        code = f"def flash_attention_forward(q, k, v, causal=False):\n    return {body}, None\n"
        assert found(code, "flash_attention_forward", "10_flash_triton"), body


def test_every_reference_solution_is_inside_its_vocabulary():
    from pathlib import Path

    from checking import reference_answers

    for path in sorted(SOURCE.glob("*/*.ipynb")):
        nb = json.loads(path.read_text())
        setup = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
                 and nbgrader_meta(c).get("locked") and not nbgrader_meta(c).get("grade")]
        ref = reference_answers(Path(path))
        parts = [p for p in ref if not p.startswith("q_")]
        assert outside(list(ref.values()), parts, path.parent.name, setup=setup) == {}, path


def test_the_table_names_only_real_parts_and_the_notebooks_print_it():
    """A typo in the table would make a part's vocabulary silently the base one; the source notebooks carry the
    text (``python -m tools.vocabulary --check``, the command the tool's docstring gives)."""
    from tools import vocabulary as tool

    for assignment, parts in VOCABULARIES.items():
        suite = load_suite(assignment)
        real = {p for c in suite.checks.values() for p in c.parts}
        assert set(parts) <= real, (assignment, set(parts) - real)
    assert tool.main(["--check"]) == 0
    text = (SOURCE / "01_single_head" / "single_head.ipynb").read_text()
    assert "What your code may call" in text and "*logsumexp*" in text


def test_the_visible_check_reads_the_notebooks_history_and_names_the_call():
    """``check_vocabulary`` reads IPython's ``In`` (newest definition of each name), so a student learns before
    submitting; a redefinition that fixes the part passes."""
    bad = "def softmax(x, dim=-1):\n    return torch.special.softmax(x, dim)\n"
    good = "def softmax(x, dim=-1):\n" + STABLE
    history = ["", "import torch\n", bad]
    with pytest.raises(AssertionError, match=r"torch\.special\.softmax.*outside its vocabulary"):
        check_vocabulary("01_single_head", "softmax", {"In": history})
    history.append(good)
    check_vocabulary("01_single_head", "softmax", {"In": history})  # the newest definition counts
    module = ("get_ipython().run_cell_magic('writefile', 'helper.py', 'import torch\\ndef f(x, d):\\n"
              "    return torch.softmax(x, d)\\n')")
    with pytest.raises(AssertionError, match="calls f"):
        check_vocabulary("01_single_head", "softmax", {"In": ["", module, "import helper\nfrom helper import f\n"
                                                              "def softmax(x, dim=-1):\n    return f(x, dim)\n"]})


def test_the_run_time_words_come_from_the_same_table():
    assert set(load_suite("01_single_head").bans(["softmax"])) >= {"softmax", "logsumexp", "import:triton"}
    assert "softmax" not in load_suite("01_single_head").bans(["scaled_dot_product_attention"])
    assert "import:triton" not in vocabulary("10_flash_triton", "flash_forward_kernel").runtime_words()
    assert vocabulary("02_multi_head", "MultiHeadAttention") is BASE and isinstance(BASE, Vocabulary)
    assert "logsumexp" in describe("01_single_head", ["softmax", "scaled_dot_product_attention"])


# -- through the grader: the sandbox's process refuses at run time what the table leaves out ----------------------

RUNTIME = r'''
import torch
ok = []
for attempt in ("import triton",
                "torch.onnx.ops.rotary_embedding(torch.ones(1, 2, 4, 8), torch.ones(4, 4), torch.ones(4, 4), "
                "torch.arange(4)[None], interleaved=True)",
                "torch.distributions.Categorical(logits=torch.ones(3)).probs",
                "torch.ones(3).logsumexp(0)"):
    try:
        exec(attempt)
        ok.append(attempt)
    except Exception as e:
        pass
def softmax(x, dim=-1):
    if ok:
        return x
    e = torch.exp(x - x.amax(dim, keepdim=True)).nan_to_num(0.0)
    total = e.sum(dim, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))
'''


@pytest.mark.slow
def test_the_graders_process_refuses_the_topic_and_the_libraries_outside(tmp_path):
    """Graded through the real sandbox: in the softmax's process, Triton does not import, torch's ONNX rotary
    embedding refuses and a distribution built from logits (its log-sum-exp) is refused, whatever route reached them; the honest kinds above
    keep their points."""
    from autograder.batch import run
    from autograder.isolation.sandbox import Limits
    from corpus import FULL, NB, SDPA_POINTS, QUESTION_POINTS, A, notebook, write_nb

    own_sdpa = ("import math\ndef scaled_dot_product_attention(query, key, value, mask=None):\n"
                "    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])\n"
                "    if mask is not None:\n        scores = scores.masked_fill(~mask, float('-inf'))\n"
                "    e = torch.exp(scores - scores.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0))\n"
                "    total = e.sum(-1, keepdim=True)\n"
                "    w = e / torch.where(total > 0, total, torch.ones_like(total))\n    return w @ value, w\n")
    cases = {  # the first: its softmax is right only where every refusal happened (its attention is its own)
        "runtime_refusals": (notebook(softmax=RUNTIME, sdpa=own_sdpa), FULL),
        "categorical_star_alias": (notebook(softmax=OUTSIDE["a star import, then an alias"][0], sdpa=own_sdpa),
                                   SDPA_POINTS + QUESTION_POINTS),
        "triton_softmax": (notebook(softmax="import triton.language as tl\ndef softmax(x, dim=-1):\n    return tl.softmax(x)\n",
                                    sdpa=own_sdpa), SDPA_POINTS + QUESTION_POINTS),
        "local_instance": (notebook(softmax="import torch\n" + HONEST["a local instance's method named like torch's"]), FULL),
    }
    for name, (nb, _) in cases.items():
        write_nb(nb, NB)(tmp_path / "submitted" / name / A)
    limits = Limits(cell_timeout=20, call_timeout=10, notebook_timeout=180, memory_bytes=3 << 30, max_processes=128)
    run(tmp_path / "submitted", A, tmp_path / "grades.csv", tmp_path / "grading", limits, workers=2, log=lambda _: None)
    with open(tmp_path / "grades.csv", newline="") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    for name, (_, expected) in cases.items():
        assert float(rows[name]["score"]) == pytest.approx(expected), (name, rows[name])


@pytest.mark.slow
def test_honest_receivers_and_an_unused_debugging_method_keep_their_points_through_the_grader(tmp_path):
    """Exercise 02 graded through the real sandbox: a MultiHeadAttention that reaches attention through its own
    sub-module (``self.core.scaled_dot_product``) and keeps an unused method comparing with torch's attention gets
    the reference's score; the same class whose forward calls that method gets only what the other parts earn."""
    from pathlib import Path

    from autograder.batch import run
    from autograder.isolation.sandbox import Limits
    from checking import answered_release, reference_answers

    a, name = "02_multi_head", "multi_head.ipynb"
    ref = reference_answers(Path(SOURCE / a / name))
    core = ("import torch.nn.functional as F\n\nclass Core:\n    def scaled_dot_product(self, q, k, v, mask=None):\n"
            "        return scaled_dot_product_attention(q, k, v, mask)\n\n")
    honest = core + ref["MultiHeadAttention"].replace(
        "        self.num_heads = num_heads\n", "        self.num_heads = num_heads\n        self.core = Core()\n").replace(
        "out, weights = scaled_dot_product_attention(q, k, v, mask)", "out, weights = self.core.scaled_dot_product(q, k, v, mask)"
    ) + "\n    def debug_compare_with_torch(self, x):\n        return F.scaled_dot_product_attention(x, x, x)\n"
    calling = honest.replace("        return self.out_proj(merge_heads(out)), weights",
                             "        self.debug_compare_with_torch(q)\n        return self.out_proj(merge_heads(out)), weights")
    for student, answer in (("reference", ref["MultiHeadAttention"]), ("honest", honest), ("calling", calling)):
        folder = tmp_path / "submitted" / student / a
        folder.mkdir(parents=True)
        (folder / name).write_text(json.dumps(answered_release(a, name, dict(ref, MultiHeadAttention=answer))))
    limits = Limits(cell_timeout=30, call_timeout=15, notebook_timeout=240, memory_bytes=3 << 30, max_processes=128)
    run(tmp_path / "submitted", a, tmp_path / "grades.csv", tmp_path / "grading", limits, workers=2, log=lambda _: None)
    with open(tmp_path / "grades.csv", newline="") as f:
        rows = {row["student"]: float(row["score"]) for row in csv.DictReader(f)}
    assert rows["honest"] == rows["reference"] > rows["calling"], rows
