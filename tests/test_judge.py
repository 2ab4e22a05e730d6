"""The judge's own faults stay local: a check that breaks on an odd answer fails that check alone."""

from __future__ import annotations

import json

import pytest

from autograder.judging.checks import load_suite
from autograder.course import RELEASE, SOURCE
from autograder.judging.judge import grade_notebook
from autograder.notebook import SourceNotebook
from autograder.isolation.sandbox import Limits
from corpus import A, FULL, NB, notebook

pytestmark = pytest.mark.slow


def test_a_check_that_raises_fails_alone(tmp_path, monkeypatch):
    suite = load_suite(A)
    gid = "test_sdpa_values"
    points = {c.grade_id: c.points for c in SourceNotebook.load(SOURCE / A / NB, RELEASE / A / NB).tests()}

    def broken(trial):
        raise ZeroDivisionError("the check tripped over the answer")

    monkeypatch.setattr(suite.checks[gid], "fn", broken)
    path = tmp_path / NB
    path.write_text(json.dumps(notebook()))
    result = grade_notebook(path, SourceNotebook.load(SOURCE / A / NB, RELEASE / A / NB), A, files=RELEASE / A,
                            limits=Limits(cell_timeout=20, call_timeout=10, notebook_timeout=120), secret="t")
    by_id = {t.grade_id: t for t in result.tests}
    assert by_id[gid].points == 0 and "could not be checked (ZeroDivisionError" in by_id[gid].message
    assert sum(t.points for t in result.tests) == FULL - points[gid]  # every other check still counted
    assert any("the check itself failed" in line for line in result.log)


@pytest.mark.parametrize("error, says", [
    ("NotImplementedError: ", "not implemented yet"),
    ("NotImplementedError", "not implemented yet"),
    ("NotImplementedError: Cannot copy out of meta tensor; no data!", "your code raised NotImplementedError: Cannot copy"),
    ("ValueError: bad", "your code raised ValueError: bad"),
])
def test_error_sentences_name_the_real_error(error, says):
    from autograder.judging.checks import describe_error

    assert describe_error(error).startswith(says)


@pytest.mark.parametrize("local", [True, False])
def test_a_conceptual_answer_is_read_as_a_plain_value(local):
    """``Trial.value`` reads what the student assigned, the same in the sandbox and in a notebook kernel."""
    from autograder.judging.checks import LocalBackend, StudentError, Trial
    from autograder.judging.judge import SandboxBackend
    from autograder.isolation.sandbox import Sandbox

    code = "import numpy as np, torch\nq1 = 0.25\nq2 = (3, 4)\nq3 = 'b'\nq4 = np.float64(2.5)\nq5 = torch.ones(2)\n"
    if local:
        ns: dict = {}
        exec(code, ns)
        trial = Trial(LocalBackend(ns), 0)
        check = lambda: None  # noqa: E731
    else:
        box = Sandbox(limits=Limits(cell_timeout=20, call_timeout=10, notebook_timeout=120)).__enter__()
        assert box.request({"op": "exec", "code": code, "label": "<t>"}, timeout=20)["ok"]
        trial = Trial(SandboxBackend(box, box.limits), 0)
        check = lambda: box.__exit__(None, None, None)  # noqa: E731
    try:
        assert trial.value("q1") == 0.25 and tuple(trial.value("q2")) == (3, 4) and trial.value("q3") == "b"
        assert trial.value("q4") == 2.5 and trial.value("q5").tolist() == [1.0, 1.0]
        with pytest.raises(StudentError, match="assign your answer to q9"):
            trial.value("q9")
    finally:
        check()


def test_conceptual_answer_helpers_name_wrong_answers_and_hide_the_right_one():
    from autograder.judging.checks import CheckFailed, expect_choice, expect_number, expect_tuple

    expect_number(0.2500001, 0.25, "q")
    expect_number(torch_scalar := __import__("torch").tensor(0.25), 0.25, "q")  # a 0-d tensor is a number
    with pytest.raises(CheckFailed, match="that is Var without the scaling"):
        expect_number(16, 1.0, "q", mistakes={"that is Var without the scaling": 16.0})
    with pytest.raises(CheckFailed, match="not right") as err:
        expect_number(3, 1.0, "q")
    assert "1.0" not in str(err.value) or "3" in str(err.value)
    with pytest.raises(CheckFailed, match="should be a number"):
        expect_number(True, 1.0, "q")
    expect_tuple([2, 4, 8], (2, 4, 8), "shape")
    with pytest.raises(CheckFailed, match="heads first"):
        expect_tuple((4, 2, 8), (2, 4, 8), "shape", mistakes={"heads first": (4, 2, 8)})
    expect_choice(" B ", "b", "pattern", "abc")
    with pytest.raises(CheckFailed, match="should be one of"):
        expect_choice("z", "b", "pattern", "abc")
    with pytest.raises(CheckFailed, match="that is the causal one"):
        expect_choice("a", "b", "pattern", "abc", mistakes={"a": "that is the causal one"})
    del torch_scalar


# -- one runner: the sandbox and a notebook kernel run student code the same way -----------------------

RUNNER_CODE = '''
import collections, torch
Pair = collections.namedtuple("Pair", "output weights")

def softmax(x, dim=-1):
    e = (x - x.amax(dim, keepdim=True)).exp()
    return e / e.sum(dim, keepdim=True)

def cheat(x, dim=-1):
    return torch.distributions.Categorical(logits=x.movedim(dim, -1)).probs.movedim(-1, dim)

def swallow(x, dim=-1):
    try:
        return torch.softmax(x, dim)
    except Exception:
        return softmax(x, dim)

def named(x):
    return Pair(x * 2, softmax(x))

def half(x):
    return x.to(torch.bfloat16)

def odd(x):
    raise ValueError(f"odd input of shape {tuple(x.shape)}")

class Lin(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.proj = torch.nn.Linear(n, n)

    def forward(self, x):
        return torch.nn.functional.scaled_dot_product_attention(x, x, x)
'''


def _runner_requests():
    import numpy as np

    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    bans = ["softmax", "Categorical"]
    return [
        {"op": "call", "target": "softmax", "args": [x], "kwargs": {"dim": 0}, "bans": bans},
        {"op": "call", "target": "softmax", "args": [x], "kwargs": {}, "grad": 0, "probe": x, "bans": bans},
        {"op": "call", "target": "cheat", "args": [x], "kwargs": {}, "bans": bans},
        {"op": "call", "target": "cheat", "args": [x], "kwargs": {}, "bans": []},
        {"op": "call", "target": "swallow", "args": [x], "kwargs": {}, "bans": bans},
        {"op": "call", "target": "named", "args": [x], "kwargs": {}},
        {"op": "call", "target": "half", "args": [x], "kwargs": {}},
        {"op": "call", "target": "odd", "args": [x], "kwargs": {}},
        {"op": "call", "target": "missing", "args": [], "kwargs": {}},
        {"op": "value", "target": "Pair"},
    ]


def test_the_sandbox_and_a_notebook_kernel_run_student_code_the_same_way():
    """Same values and same errors for the same requests, through the sandbox and through LocalBackend."""
    import numpy as np

    from autograder.judging.checks import LocalBackend, StudentError
    from autograder.judging.judge import SandboxBackend
    from autograder.isolation.sandbox import Sandbox
    from autograder.in_sandbox.wire import Ref

    ns: dict = {"__name__": "__main__"}
    exec(compile(RUNNER_CODE, "<answers>", "exec"), ns)
    local = LocalBackend(ns)
    from autograder.in_sandbox.torch_names import runtime_fragments

    # A sandbox is banned for life for the bans of the parts it answers: one per set of bans, as the judge does.
    limits = Limits(cell_timeout=20, call_timeout=10, notebook_timeout=120)
    boxes = {bans: Sandbox(limits=limits, bans=bans).__enter__() for bans in [(), ("softmax",)]}
    box = boxes[()]
    try:
        for b in boxes.values():
            assert b.request({"op": "exec", "code": RUNNER_CODE, "label": "<answers>"}, timeout=20)["ok"]

        class Routed(SandboxBackend):
            def ask(self, request):
                self.box = boxes[tuple(runtime_fragments(request.get("bans") or ()))]
                return super().ask(request)

        remote = Routed(box, box.limits)

        def outcome(backend, request):
            try:
                return "value", backend.ask(dict(request))
            except StudentError as e:
                return "error", str(e)

        seen = []
        for request in _runner_requests():
            a, b = outcome(local, request), outcome(remote, request)
            assert a[0] == b[0], (request["target"], a, b)
            if a[0] == "error":
                assert a[1] == b[1], (request["target"], a, b)
            else:
                assert type(a[1]) is type(b[1])
                flat_a = a[1] if isinstance(a[1], tuple) else (a[1],)
                flat_b = b[1] if isinstance(b[1], tuple) else (b[1],)
                for u, v in zip(flat_a, flat_b, strict=True):
                    assert u.dtype == v.dtype and np.allclose(u, v), request["target"]
            seen.append((request["target"], a[0], a[1] if a[0] == "error" else ""))
        kinds = {(t, k) for t, k, _ in seen}
        # the answers in the table above cover every kind: values, gradients, bans, namedtuple, bf16, errors
        assert ("softmax", "value") in kinds and ("named", "value") in kinds and ("half", "value") in kinds
        assert [m for t, k, m in seen if t == "cheat"][0].startswith("earns no points")
        assert [k for t, k, _ in seen if t == "cheat"][1] == "value"  # no ban: the same call runs
        assert [m for t, k, m in seen if t == "swallow"][0].startswith("earns no points")
        # parameters: same names, same shape errors, same refusal of torch's attention in a method
        refs = [b.call("Lin", [3], {}, (), keep=True) for b in (local, remote)]
        assert all(isinstance(r, Ref) for r in refs)
        for backend, ref in zip((local, remote), refs):
            assert sorted(backend.params(ref)) == ["proj.bias", "proj.weight"]
        errors = []
        for backend, ref in zip((local, remote), refs):
            for request in ({"op": "load", "target": ref, "state": {"proj.weight": np.zeros((2, 2), np.float32)}},
                            {"op": "call", "target": ref, "args": [np.zeros((1, 2, 3), np.float32)], "kwargs": {}}):
                with pytest.raises(StudentError) as err:
                    backend.ask(request)
                errors.append(str(err.value))
        assert errors[:2] == errors[2:], errors
        assert "has shape (3, 3), expected (2, 2)" in errors[0] and "earns no points" in errors[1]
        # a fixture from the judge's source: built in a namespace of its own, not the student's Pair (a namedtuple)
        source = "class Pair:\n    def __init__(self, n):\n        self.n = n\n\n    def __call__(self, x):\n" \
                 "        return x * self.n\n"
        x = np.ones((2, 2), np.float32)
        for backend in (local, remote):
            ref = backend.trusted(source, "Pair", [3], {})
            assert np.array_equal(backend.call(ref, [x], {}, ()), 3 * x)
    finally:
        for b in boxes.values():
            b.__exit__(None, None, None)


def test_the_install_cell_is_the_students_setting_never_run_by_the_grader():
    """Exercise 10's first code cell installs the course package where it is missing (tools/install_cell.py): the
    plan never runs it in the sandbox (it would fail there, where attnkit is hidden), whatever the student did to it."""
    import json

    from autograder.course import RELEASE, SOURCE
    from autograder.notebook import INSTALL_CELL, SourceNotebook, plan_cells

    source = SourceNotebook.load(SOURCE / "10_flash_triton" / "flash_triton.ipynb",
                                 RELEASE / "10_flash_triton" / "flash_triton.ipynb")
    assert any(c.kind == "install" for c in source.cells)
    release = json.loads((RELEASE / "10_flash_triton" / "flash_triton.ipynb").read_text())
    plan = plan_cells(source, release)
    assert not any("%pip install" in code for _, code in plan.cells), [label for label, _ in plan.cells]
    for cell in release["cells"]:  # renamed, or its grade_id removed: still not run
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == INSTALL_CELL:
            cell["metadata"] = {}
    assert not any("%pip install" in code for _, code in plan_cells(source, release).cells)
