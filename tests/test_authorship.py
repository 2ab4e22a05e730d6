"""The static authorship scan: delegation is found through helpers and globals, never through a shared local name.

Students often add a cell that checks their answer against torch's own attention. Those
cells bind names (``x``, ``out``, ``scores``) that the answer's functions also use as
locals or parameters; the scan follows Python's scopes, so only a real global reaches
the answer.
"""

from __future__ import annotations

import textwrap

from pathlib import Path

import pytest

from autograder.judging.authorship import delegations
from corpus import AUTOGRAD_CTX

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
     "scaled_dot_product_attention", "`torch.nn.functional.scaled_dot_product_attention`"),
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
     "softmax", "`torch.softmax`"),
    (["if True:\n    class MultiHeadAttention(torch.nn.Module):\n        def forward(self, x):\n"
      "            return torch.nn.MultiheadAttention(4, 2)(x, x, x)[0]\n"],
     "MultiHeadAttention", "torch.nn.MultiheadAttention"),
    # `self.<name>` is only exempt when the student defined <name>
    (["class MultiHeadAttention(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
      "        self.inner = torch.nn.MultiheadAttention(4, 2)\n    def forward(self, x):\n"
      "        return self.inner(x, x, x)[0]\n"],
     "MultiHeadAttention", "torch.nn.MultiheadAttention"),
    (["def softmax(x, dim=-1):\n    return x.softmax(dim)\n"], "softmax", "the method `.softmax`"),
])
def test_delegation_is_still_found(cells, part, says):
    found = scan(*cells)
    assert part in found and says in found[part], found


# -- the whole notebook is read, whatever one cell holds (IPython syntax, a syntax error) ------------------

DELEGATING_SOFTMAX = "def softmax(x, dim=-1):\n    return torch.softmax(x, dim).nan_to_num(0.0)\n"


@pytest.mark.parametrize("other", [
    "%matplotlib inline\n",
    "!pip install einops\n",
    "%%time\nx = 1\n",
    "x?\n",
    "def oops(:\n    pass\n",
    "y = (1,\n",
    's = """never closed\n',
    "    indented = 1\n",
    "x = 1\0\n",
])
def test_a_cell_that_is_not_python_does_not_hide_the_others(other):
    # joined in one string (what the judge passes) and cell by cell, before and after the answer
    assert "softmax" in scan(other, DELEGATING_SOFTMAX)
    assert "softmax" in scan(DELEGATING_SOFTMAX, other)
    cells = [textwrap.dedent(ANSWERS), other, DELEGATING_SOFTMAX]
    assert "softmax" in delegations(cells, PARTS, FORBIDDEN)


def test_a_cell_magic_at_the_top_does_not_hide_its_body():
    assert "softmax" in scan("%%time\n" + DELEGATING_SOFTMAX)
    assert "softmax" in delegations([textwrap.dedent(ANSWERS), "%%capture\n%%time\n" + DELEGATING_SOFTMAX], PARTS, FORBIDDEN)


def test_cells_are_read_one_by_one():
    # A string opened in one broken cell and closed in another would swallow the cell between them
    # if the cells were joined; the harness runs that middle cell, so the scan reads it.
    cells = [textwrap.dedent(ANSWERS), 's = """\n', DELEGATING_SOFTMAX, '"""\n']
    assert "softmax" in delegations(cells, PARTS, FORBIDDEN)
    # a cell that does not parse never runs: what it holds taints nothing
    assert delegations([textwrap.dedent(ANSWERS), "def softmax(x, dim=-1):\n    return torch.softmax(x dim)\n"],
                       PARTS, FORBIDDEN) == {}


def test_ipython_syntax_in_correct_answers_costs_nothing():
    honest = ("%matplotlib inline\n"
              "def softmax(x, dim=-1):\n    dim = (dim\n           % x.dim())\n"
              "    e = torch.exp(x - x.amax(dim=dim, keepdim=True))\n    return e / e.sum(dim=dim, keepdim=True)\n")
    assert scan(honest) == {}
    assert delegations([textwrap.dedent(ANSWERS), honest, "!ls\n"], PARTS, FORBIDDEN) == {}


# -- a part's own bans reach its helpers, aliases and classes, not the other parts -------------------------

@pytest.mark.parametrize("cells, says", [
    (["from torch import softmax as _sm\ndef softmax(x, dim=-1):\n    return _sm(x, dim)\n"], "uses `torch.softmax`"),
    (["import torch.nn.functional as G\n_f = G.softmax\n", "def softmax(x, dim=-1):\n    return _f(x, dim)\n"],
     "calls _f, which uses `torch.nn.functional.softmax`"),
    (["def _inner(x, dim):\n    return x.softmax(dim)\n", "def _outer(x, dim):\n    return _inner(x, dim)\n",
      "def softmax(x, dim=-1):\n    return _outer(x, dim)\n"], "calls _outer, which calls _inner, which uses the method `.softmax`"),
    (["class _Impl:\n    @staticmethod\n    def run(x, dim):\n        return torch.softmax(x, dim)\n",
      "def softmax(x, dim=-1):\n    return _Impl.run(x, dim)\n"], "calls _Impl, which uses `torch.softmax`"),
])
def test_a_parts_bans_follow_its_helpers(cells, says):
    found = scan(*cells)
    assert "softmax" in found and says in found["softmax"] and "*softmax*" in found["softmax"], found


def test_a_parts_bans_do_not_reach_other_parts():
    # torch's softmax is allowed in the attention, even through a helper it shares with the softmax
    cells = ["from torch import softmax as _sm\ndef _weights(s, dim=-1):\n    return _sm(s, dim)\n",
             "def softmax(x, dim=-1):\n    return _weights(x, dim)\n",
             "def scaled_dot_product_attention(q, k, v, mask=None):\n"
             "    w = _weights(q @ k.transpose(-2, -1))\n    return w @ v, w\n"]
    found = scan(*cells)
    assert list(found) == ["softmax"] and "calls _weights, which uses `torch.softmax`" in found["softmax"], found


# -- every route to torch's softmax, for chapter 01's real bans ---------------------------------------

CH01 = ["softmax", "scaled_dot_product_attention"]


def ch01_scan(code: str) -> dict[str, str]:
    from autograder.judging.checks import load_suite

    return delegations(textwrap.dedent(code), CH01, load_suite("01_single_head").forbidden, assignment="01_single_head")


@pytest.mark.parametrize("body", [
    "F.softmin(-x, dim)",
    "torch.nn.Softmin(dim)(-x)",
    "torch.nn.LogSoftmax(dim)(x).exp()",
    "torch._softmax(x, dim, False)",
    "torch.ops.aten._softmax(x, dim, False)",
    "torch.ops.aten._safe_softmax(x, dim)",
    "torch.nn.functional.gumbel_softmax(x * 1e9, tau=1e9)",
    "getattr(torch, 'soft' + 'max')(x, dim)",
    "getattr(torch, ''.join(['so', 'ft', 'min']))(-x, dim)",
    "torch.distributions.Categorical(logits=x.movedim(dim, -1)).probs.movedim(-1, dim)",
])
def test_every_route_to_torchs_softmax_is_found(body):
    found = ch01_scan(f"import torch\nimport torch.nn.functional as F\ndef softmax(x, dim=-1):\n    return {body}\n")
    assert "softmax" in found, found


# -- torch's attention through the dispatcher ----------------------------------------------------------

@pytest.mark.parametrize("body", [
    "torch.ops.aten._scaled_dot_product_attention_math(q, k, v)",
    "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0], None",
    "getattr(torch.ops.aten, 'scaled_dot_' + 'product_attention')(q, k, v), None",
    "torch.ops.aten.__getattr__(f'scaled_dot_{\"product\"}_attention')(q, k, v), None",
    "vars(F)[_NAME](q, k, v), None",
    "operator.methodcaller('scaled_dot_product_attention', q, k, v)(F), None",
])
def test_torchs_attention_through_the_dispatcher_is_found(body):
    code = ("import operator\nimport torch\nimport torch.nn.functional as F\n"
            "_NAME = ''.join(['scaled', '_dot', '_product', '_attention'])\n"
            f"def scaled_dot_product_attention(q, k, v, mask=None):\n    return {body}\n")
    found = ch01_scan(code)
    assert "scaled_dot_product_attention" in found and "softmax" not in found, found


def test_the_harness_refuses_torchs_attention_at_the_dispatcher():
    import subprocess
    import sys

    probe = textwrap.dedent('''
        import torch
        from autograder.in_sandbox import harness
        guard = harness.Runner(torch, {}).guard
        q = torch.randn(1, 2, 3, 4)
        mha = torch.nn.MultiheadAttention(4, 2, batch_first=True).eval()
        routes = {
            "math": lambda: torch.ops.aten._scaled_dot_product_attention_math(q, q, q),
            "getattr": lambda: getattr(torch.ops.aten, "scaled_dot_" + "product_attention")(q, q, q),
            "flash": lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q),
            "nested C": lambda: torch._C._VariableFunctions._native_multi_head_attention(
                q[0], q[0], q[0], 4, 2, torch.randn(12, 4), torch.randn(12), torch.randn(4, 4), torch.randn(4)),
            "fast path": lambda: torch.nn.MultiheadAttention.__mro__[1].__call__(mha, q[0], q[0], q[0]),
            "encoder": lambda: torch._transformer_encoder_layer_fwd,
        }
        refused = []
        for name, route in routes.items():
            try:
                with guard.judged(()), torch.inference_mode():
                    out = route()
                if callable(out):
                    continue
            except harness.Delegated:
                refused.append(name)
        print(sorted(refused))
        # outside a judged call (a self-check cell), torch's attention runs as in Jupyter
        assert torch.ops.aten._scaled_dot_product_attention_math(q, q, q)[0].shape == q.shape
        # everything else still runs
        assert torch.allclose(torch.softmax(q, -1).sum(-1), torch.ones(1, 2, 3))
    ''')
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == str(sorted(["math", "getattr", "flash", "nested C", "fast path"])), out.stdout


# -- IPython syntax in the harness: only real magics are touched --------------------------------------

def test_the_harness_transforms_only_real_magics():
    from autograder.in_sandbox.magics import strip_magics as _strip_magics

    plain = ("def softmax(x, dim=-1):\n    dim = (dim\n           % x.dim())\n"
             '    """Docs.\n%notamagic\n!nor this\n    """\n    return x\n')
    assert _strip_magics(plain) == plain
    both = "%matplotlib inline\n" + plain + "!echo hi\n"
    ns: dict = {"get_ipython": lambda: type("Stub", (), {"__getattr__": lambda self, name: lambda *a, **k: None})()}
    python = _strip_magics(both)
    assert plain in python and "%matplotlib" not in python.replace(plain, "")
    exec(compile(python, "<cell>", "exec"), ns)
    assert callable(ns["softmax"])
    ns = {}
    exec(compile(_strip_magics("%%time\ny = (7\n     % 4)\n"), "<cell>", "exec"), ns)
    assert ns["y"] == 3


# -- a method of the student's own class is the student's, whatever its name ---------------------------

HONEST_CLASSES = [
    ["class _Soft:\n    def softmax(self, x, dim=-1):\n        e = torch.exp(x - x.amax(dim, keepdim=True))\n"
     "        return e / e.sum(dim, keepdim=True)\n", "softmax = _Soft().softmax\n"],
    ["class _Soft:\n    def softmax(self, x, dim=-1):\n        e = torch.exp(x - x.amax(dim, keepdim=True))\n"
     "        return e / e.sum(dim, keepdim=True)\n", "_impl = _Soft()\n", "softmax = _impl.softmax\n"],
    ["class _Soft:\n    @staticmethod\n    def softmax(x, dim=-1):\n        e = torch.exp(x - x.amax(dim, keepdim=True))\n"
     "        return e / e.sum(dim, keepdim=True)\n", "def softmax(x, dim=-1):\n    return _Soft.softmax(x, dim)\n"],
]
HOSTILE_CLASSES = [
    # the class's method itself delegates
    ["class _Soft:\n    def softmax(self, x, dim=-1):\n        return torch.softmax(x, dim)\n", "softmax = _Soft().softmax\n"],
    # a tensor subclass that hands over to torch's
    ["class _T(torch.Tensor):\n    def softmax(self, dim):\n        return super().softmax(dim)\n",
     "def softmax(x, dim=-1):\n    return x.as_subclass(_T).softmax(dim)\n"],
    # the class's name is rebound to something else
    ["class _Soft:\n    def softmax(self, x, dim=-1):\n        return x\n", "_Soft = torch\n",
     "def softmax(x, dim=-1):\n    return _Soft.softmax(x, dim)\n"],
    # a local that shares the class's name
    ["class _Soft:\n    def softmax(self, x, dim=-1):\n        return x\n",
     "def softmax(x, dim=-1):\n    _Soft = x\n    return _Soft.softmax(dim)\n"],
]


@pytest.mark.parametrize("honest, hostile", list(zip(HONEST_CLASSES, HOSTILE_CLASSES)) + [(HONEST_CLASSES[0], HOSTILE_CLASSES[3])])
def test_a_method_of_the_students_own_class_is_not_torchs(honest, hostile):
    assert ch01_scan(textwrap.dedent(ANSWERS) + "\n" + "\n".join(honest)) == {}
    # ... but torch's softmax behind a class, or a name that only looks like the class, is still found
    found = ch01_scan(textwrap.dedent(ANSWERS) + "\n" + "\n".join(hostile))
    assert "softmax" in found, found


def test_self_attribute_is_exempt_only_when_the_class_defines_it():
    """A dummy function of the same name elsewhere does not make ``self.log_softmax`` the student's own."""
    loophole = ("def log_softmax(x):\n    return x\n\n"
                "class T(torch.Tensor):\n    def probs(self):\n        return self.log_softmax(-1).exp()\n\n"
                "def softmax(x, dim=-1):\n    return x.as_subclass(T).probs()\n")
    found = scan(loophole)
    assert "softmax" in found and "calls T, which uses the method `.log_softmax`" in found["softmax"], found
    inherited = ("class Base(torch.nn.Module):\n    def scaled_dot_product_attention(self, q, k, v):\n"
                 "        return scaled_dot_product_attention(q, k, v)[0]\n\n"
                 "class MultiHeadAttention(Base):\n    def forward(self, x):\n"
                 "        return self.scaled_dot_product_attention(x, x, x)\n")
    assert scan(inherited) == {}


# -- run-time bans: during a judged call, a part's banned operators refuse to run, by any route ----------

FORGED_SOFTMAX = {
    "star import alias": "from torch.nn.functional import *\n_f = softmax\n"
                         "def softmax(x, dim=-1):\n    return _f(x, dim=dim)\n",
    "name built at run time": "def softmax(x, dim=-1):\n"
                              "    return getattr(torch, ''.join(map(chr, [115, 111, 102, 116, 109, 97, 120])))(x, dim)\n",
    "unpickled": "import pickle\n_f = pickle.loads(b'ctorch\\nsoftmax\\n.')\n"
                 "def softmax(x, dim=-1):\n    return _f(x, dim)\n",
    "TorchScript from a string": "import base64\n_cu = torch.jit.CompilationUnit(base64.b64decode("
                                 "'ZGVmIGYoeDogVGVuc29yLCBkOiBpbnQpOgogICAgcmV0dXJuIHRvcmNoLnNvZnRtYXgoeCwgZCkK').decode())\n"
                                 "def softmax(x, dim=-1):\n    return _cu.f(x, dim)\n",
    "evaluated encoded string": "import base64\n"
                                "def softmax(x, dim=-1):\n    return eval(base64.b64decode('dG9yY2guc29mdG1heA==').decode())(x, dim)\n",
    "distribution from logits": "def softmax(x, dim=-1):\n"
                                "    return getattr(torch.distributions, 'Cat' + 'egorical')(logits=x.movedim(dim, -1))"
                                ".probs.movedim(-1, dim)\n",
    "another part allowed torch's softmax": "def scaled_dot_product_attention(q, k, v, mask=None):\n"
                                            "    w = torch.softmax(q @ k.transpose(-2, -1), -1)\n    return w @ v, w\n"
                                            "def softmax(x, dim=-1):\n    x = x.movedim(dim, -1)\n"
                                            "    eye = torch.eye(x.shape[-1], dtype=x.dtype)\n"
                                            "    return scaled_dot_product_attention(x.unsqueeze(-2), eye, eye)[1].squeeze(-2)"
                                            ".movedim(-1, dim)\n",
    "log_softmax then exp": "def softmax(x, dim=-1):\n    return torch.log_softmax(x, dim).exp()\n",
    "torch's Python reference": "import torch._refs as R\ndef softmax(x, dim=-1):\n    return getattr(R, 'soft' + 'max')(x, dim)\n",
    "a decomposition": "import torch._decomp as D\n"
                       "def softmax(x, dim=-1):\n    return D.decomposition_table[torch.ops.aten._softmax.default](x, dim, False)\n",
    "mkldnn layout": "def softmax(x, dim=-1):\n    return getattr(x.float().to_mkldnn(), 'soft' + 'max')(dim).to_dense().to(x.dtype)\n",
    # issue 20: the function a wrapper holds, taken from its closure or its __wrapped__ (guarded in place now)
    "torch's Python reference from its closure": (
        "import torch._refs\n_inner = [c.cell_contents for c in torch._refs.softmax.__closure__\n"
        "          if getattr(c.cell_contents, '__name__', '') == 'softmax'][0]\n"
        "def softmax(x, dim=-1):\n    return _inner(x, dim)\n"),
    "a decomposition's inner function": (
        "import torch._decomp as D\n"
        "def _held(f, seen):\n    if id(f) in seen or not callable(f):\n        return []\n    seen.add(id(f))\n"
        "    found = [f] if getattr(getattr(f, '__code__', None), 'co_filename', '').endswith('decompositions.py') else []\n"
        "    for c in getattr(f, '__closure__', None) or ():\n        found += _held(c.cell_contents, seen)\n"
        "    return found + _held(getattr(f, '__wrapped__', None), seen)\n"
        "_inner = _held(D.decomposition_table[torch.ops.aten._softmax.default], set())[0]\n"
        "def softmax(x, dim=-1):\n    return _inner(x, dim, False)\n"),
    "refusal swallowed": "def softmax(x, dim=-1):\n    try:\n        return torch.softmax(x, dim)\n"
                         "    except Exception:\n        e = (x - x.amax(dim, keepdim=True)).exp()\n"
                         "        return e / e.sum(dim, keepdim=True)\n",
}


def _local(code: str, bans=("softmax", "log_softmax", "Categorical")):
    from autograder.judging.checks import LocalBackend

    ns: dict = {"__name__": "__main__"}
    exec(compile("import torch\n" + code, "<answer>", "exec"), ns)
    backend = LocalBackend(ns)
    backend.bans = tuple(bans)  # what Suite.run would pass with every call
    return backend


@pytest.mark.parametrize("route", list(FORGED_SOFTMAX))
def test_a_parts_ban_holds_at_run_time_by_any_route(route):
    import numpy as np

    from autograder.judging.checks import StudentError

    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    with pytest.raises(StudentError, match="earns no points: .*torch's own implementation"):
        backend = _local(FORGED_SOFTMAX[route])
        backend.call("softmax", [x], {"dim": -1}, backend.bans)
    # the same code runs when the part under check allows torch's softmax (another part's check) ...
    if route not in ("mkldnn layout",):
        out = _local(FORGED_SOFTMAX[route], bans=()).call("softmax", [x], {"dim": -1}, ())
        assert np.allclose(out, __import__("torch").softmax(__import__("torch").from_numpy(x), -1).numpy(), atol=1e-5)
    # ... and outside a judged call, as in Jupyter (a self-check cell)
    import torch
    import torch._refs

    from autograder.in_sandbox import ban

    # torch's own Python softmax, however reached (here through its decorator's __wrapped__), is guarded in
    # place: its code starts with the guard's check (a bound C method in its constants: nothing in it can be
    # rebound, unlike the functools.partial of issue 20, which __setstate__ rewrites), and no unguarded copy of
    # it is kept anywhere (issues 20 and 29).
    inner = getattr(torch._refs.softmax, "__wrapped__", torch._refs.softmax)
    check = ban._STATE["checks"]["softmax"][0]
    assert any(c is check for c in inner.__code__.co_consts)

    assert torch.allclose(torch.softmax(torch.from_numpy(x), -1).sum(-1), torch.ones(2))


TAMPERING = {
    "attention after destroying the guard (gc)": (
        "import gc\nimport torch.nn.functional as F\n"
        "def scaled_dot_product_attention(q, k, v, mask=None):\n"
        "    for o in gc.get_objects():\n"
        "        if isinstance(o, torch.library.Library):\n            o._destroy()\n"
        "    return F.scaled_dot_product_attention(q, k, v), q\n", "scaled_dot_product_attention", ()),
    "softmax after destroying the guard (gc)": (
        "import gc\n"
        "def softmax(x, dim=-1):\n"
        "    for o in gc.get_objects():\n"
        "        if isinstance(o, torch.library.Library):\n            o._destroy()\n"
        "    return torch.softmax(x, dim)\n", "softmax", ("softmax",)),
    "a kernel registered over the guard's": (
        "_lib = torch.library.Library('aten', 'IMPL')\n"
        "_lib.impl('_scaled_dot_product_attention_math', lambda q, k, v, *a, **kw: (q, q), 'AutogradCPU')\n"
        "def scaled_dot_product_attention(q, k, v, mask=None):\n"
        "    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v)\n", "scaled_dot_product_attention", ()),
}


@pytest.mark.parametrize("attack", list(TAMPERING))
def test_a_tampered_guard_is_found_and_earns_nothing(attack):
    """Run in a fresh interpreter: the attacks destroy every torch.library.Library of the process, torch's
    own meta registrations included, which in the sandbox costs only the student's process but here would
    break every later test that uses the meta device."""
    import subprocess
    import sys

    here = Path(__file__).resolve().parent
    code = (f"import sys\nsys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]\n"
            f"import test_authorship\ntest_authorship._tampering_is_found({attack!r})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _tampering_is_found(attack: str) -> None:
    import numpy as np

    from autograder.judging.checks import StudentError

    code, target, bans = TAMPERING[attack]
    q = np.ones((1, 2, 4), np.float32)
    args = [q, q, q] if target != "softmax" else [q]
    backend = _local(code, bans)
    try:
        with pytest.raises(StudentError, match="earns no points: .*(guard|own implementation)"):
            backend.call(target, args, {}, backend.bans)
    finally:
        lib = backend.runner.ns.get("_lib")
        if lib is not None:
            lib._destroy()
    # the next call has a fresh, working guard
    x = __import__("torch").zeros(1, 1, 1)
    with pytest.raises(Exception, match="own implementation"):
        with backend.runner.guard.judged(()):
            __import__("torch").ops.aten._scaled_dot_product_attention_math(x, x, x)


# -- reaching into the grader's process (issue 20) ---------------------------------------------------------

REACHING_IN = {
    "the stack, in the part": "import sys\ndef softmax(x, dim=-1):\n    sys._getframe(1).f_locals\n    return x\n",
    "a frame's f_back": "import inspect\ndef softmax(x, dim=-1):\n    inspect.currentframe().f_back\n    return x\n",
    "every object, at module level": "import gc\nfor o in gc.get_objects():\n    pass\n",
    "a closure's original": "import torch._refs\n_f = torch._refs.softmax.__closure__[0].cell_contents\n",
    "a name built from pieces": "def softmax(x, dim=-1):\n    getattr(softmax, '__clo' + 'sure__')\n    return x\n",
    "ctypes at module level": "import ctypes\nctypes.memmove(0, 0, 0)\n",
    "ctypes imported by a name built from pieces": "_c = __import__('c' + 'types')\n",
    "the dispatcher": "_lib = torch.library.Library('aten', 'IMPL')\n",
    "the harness's module": "import harness\n",
    "a helper called at module level": "import sys\ndef _patch():\n    sys._getframe(2)\n_patch()\n",
    "a function's code replaced": "def softmax(x, dim=-1):\n    return x\nsoftmax.__code__ = (lambda x, dim=-1: x).__code__\n",
    "every class": "_all = object.__subclasses__()\n",
}


@pytest.mark.parametrize("how", list(REACHING_IN))
def test_code_that_reaches_into_the_graders_process_earns_nothing(how):
    """The run-time guard lives in the student's process: the scan flags what reaches it (frames, object walks,
    closures, code, ctypes, the dispatcher, the harness); at module level it costs every part."""
    found = scan(REACHING_IN[how])
    assert found, how
    assert all("grader's own process" in why for why in found.values()), found
    if how in ("every object, at module level", "ctypes at module level", "a helper called at module level",
               "ctypes imported by a name built from pieces",
               "the harness's module", "every class", "a closure's original"):
        assert set(found) == set(PARTS), found


def test_honest_code_that_looks_around_is_not_flagged():
    """Threads, paths, gc.collect, inspect.signature, torch.stack, a student's own attribute named like a frame's."""
    honest = ("import os, gc, inspect, threading, traceback\n"
              "print(os.getcwd(), os.path.join('a', 'b'), inspect.signature(softmax))\ngc.collect()\n"
              "t = threading.Thread(target=lambda: None)\nt.start()\nt.join()\n"
              "class Node:\n    def __init__(self):\n        self.f_back = None\n"
              "    def walk(self):\n        return self.f_back\n"
              "x = torch.stack([torch.zeros(2), torch.ones(2)])\n"
              "try:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()\n")
    assert scan(honest) == {}


# -- grader-side analysis of student code is bounded -------------------------------------------------

def test_a_long_chain_of_helpers_is_scanned_in_linear_work_and_named_briefly():
    """Taint flows once per name: the message does not grow with the chain (it did, quadratically)."""
    n = 3000
    cells = [f"def h{i}(x):\n    return h{i + 1}(x)\n" for i in range(n)]
    cells += [f"def h{n}(x):\n    return torch.nn.functional.scaled_dot_product_attention(x, x, x)\n",
              "def softmax(x, dim=-1):\n    return h0(x)\n"]
    found = delegations(cells, ["softmax"], {})
    assert found["softmax"].startswith("softmax calls h0, which calls h1, which calls h2, which calls ")
    assert f"{n - 3} more helpers, then h{n}" in found["softmax"] and "scaled_dot_product_attention" in found["softmax"]
    assert len(found["softmax"]) < 300


def test_the_scan_has_a_size_cap_and_a_time_budget():
    from autograder.judging.authorship import MAX_SCAN_CHARS, ScanLimit

    with pytest.raises(ScanLimit, match="more than the grader reads"):
        delegations(["x = 1\n" * (MAX_SCAN_CHARS // 6 + 1)], ["softmax"], {})
    with pytest.raises(ScanLimit, match="budget"):
        delegations([f"def h{i}(x):\n    return h{i + 1}(x)\n" for i in range(200)], ["softmax"], {}, budget_s=0.0)


def test_many_magics_are_rewritten_line_by_line_not_by_ipythons_transformer(monkeypatch):
    """IPython's transformer re-tokenises the cell once per magic (minutes for hundreds): past a few
    magics the cell is rewritten in one linear pass, and still runs as Jupyter would run it."""
    import IPython.core.inputtransformer2 as it2

    from autograder.in_sandbox import magics

    calls = []
    monkeypatch.setattr(it2.TransformerManager, "transform_cell", lambda self, code: calls.append(code) or code)
    cell = "\n".join(f"x{i} = {i}\n%time y = 1" for i in range(magics.MAX_TRANSFORMED_MAGICS * 30))
    python = magics.strip_magics(cell)
    assert not calls
    ns: dict = {}
    exec(compile(python, "<cell>", "exec"), ns)
    assert ns["x599"] == 599
    magics.strip_magics("%time y = 1\nz = 2\n")
    assert calls  # a cell with a few magics still goes through IPython's own transformer


def test_honest_helpers_named_softmax_are_the_students():
    """A helper module written with %%writefile, whose function's name contains "softmax", is the student's."""
    from autograder.judging.checks import load_suite

    forbidden = load_suite("01_single_head").forbidden
    cells = ["%%writefile helpers.py\nimport torch\ndef stable_softmax(x, dim):\n"
             "    e = (x - x.amax(dim, keepdim=True)).exp()\n    return e / e.sum(dim, keepdim=True)\n",
             "import helpers\nfrom helpers import stable_softmax\n",
             "def softmax(x, dim=-1):\n    return stable_softmax(x, dim) + 0 * helpers.stable_softmax(x, dim)\n"]
    assert delegations(cells, ["softmax"], forbidden, assignment="01_single_head") == {}
    # a module the notebook did not write is not the student's: it is a library outside the vocabulary
    assert "softmax" in delegations(cells[1:], ["softmax"], forbidden, assignment="01_single_head")


# -- issue 29: bare names, star imports, sys.modules; attributes stored, the student's own modules -------------------


CH01_PARTS = ["softmax", "scaled_dot_product_attention"]


def _ch01(cells: list[str]) -> dict[str, str]:
    from autograder.judging.checks import load_suite

    return delegations(cells, CH01_PARTS, load_suite("01_single_head").forbidden, assignment="01_single_head")


AUTOGRAD_SOFTMAX = "import torch\n" + AUTOGRAD_CTX  # the corpus's honest answer, graded there too


def test_an_attribute_stored_on_an_object_is_never_torchs():
    """``ctx.softmax_out = ...`` in an autograd.Function, and reading it back, is the student's own (issue 29)."""
    assert _ch01([AUTOGRAD_SOFTMAX]) == {}
    # a name stored on one object does not make torch's attribute of that name the student's
    assert "softmax" in _ch01(["import torch\nclass B:\n    pass\nb = B()\nb.softmax = 1\n"
                               "def softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n"])


WRITTEN = "%%writefile my_softmax.py\nimport torch\n\ndef softmax(x, dim=-1):\n    e = (x - x.amax(dim, keepdim=True)).exp()\n" \
          "    return e / e.sum(dim, keepdim=True)\n"


@pytest.mark.parametrize("use", [
    "import my_softmax\ndef softmax(x, dim=-1):\n    return my_softmax.softmax(x, dim)\n",
    "import my_softmax as ms\ndef softmax(x, dim=-1):\n    return ms.softmax(x, dim)\n",
    "from my_softmax import softmax as _s\ndef softmax(x, dim=-1):\n    return _s(x, dim)\n",
    "from my_softmax import *\n_mine = softmax\ndef softmax(x, dim=-1):\n    return _mine(x, dim)\n",
    "import importlib\n_m = importlib.import_module('my_softmax')\ndef softmax(x, dim=-1):\n    return _m.softmax(x, dim)\n",
])
def test_the_students_own_module_is_theirs_in_every_import_form(use):
    assert _ch01([WRITTEN, use]) == {}
    # and what that module does is read as the student's code: torch's softmax in it still counts
    cheat = WRITTEN.replace("    e = (x", "    return torch.softmax(x, dim)\n    e = (x")
    assert "softmax" in _ch01([cheat, use]), use


@pytest.mark.parametrize("cells, part, says", [
    (["from torch.ao.nn.quantizable import *\n"
      "def scaled_dot_product_attention(q, k, v, mask=None):\n    m = MultiheadAttention(q.shape[-1], 1)\n"
      "    return m(q, k, v)\n"], "scaled_dot_product_attention", "star import"),
    (["from torch.nn.functional import *\n_f = log_softmax\n"
      "def softmax(x, dim=-1):\n    return _f(x, dim).exp()\n"], "softmax", "star import"),
])
def test_bare_names_from_a_star_import_are_read(cells, part, says):
    found = _ch01(cells)
    assert part in found and says in found[part], found


@pytest.mark.parametrize("cell", [
    "import sys\n_g = sys.modules['harness']\n",
    "import sys\n_g = sys.modules.get('ban')\n",
    "import sys\n_n = 'har' + 'ness'\n_g = sys.modules[_n]\n",
])
def test_a_grader_module_looked_up_in_sys_modules_is_reflective(cell):
    found = _ch01([cell, "def softmax(x, dim=-1):\n    return x\n"])
    assert "grader's own process" in found.get("softmax", ""), found
