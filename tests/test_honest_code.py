"""Issue 34, the execution and engine half: honest code written in an unusual way keeps its points.

The engine's parts (a module that holds one parameter under two names, question answers in another reader's form,
question tolerances) are judged here with the same Runner the sandbox uses (``LocalBackend``); what concerns
running a notebook (a cell's statements one at a time, magics, ``%run``) is graded through the real sandbox in
``tests/test_grader_corpus.py`` and below.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autograder.in_sandbox.runner import Runner
from autograder.judging.checks import load_suite
from checking import mutate, run_checks, source_code

A07 = "07_transformer_block"

# The reference FeedForward, with the same two Linear modules registered a second time inside an nn.Sequential:
# linear1.weight and net.0.weight are one tensor.
SHARED_FF = """
        self.linear1 = nn.Linear(embed_dim, ff_dim)
        self.linear2 = nn.Linear(ff_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)
        self.net = nn.Sequential(self.linear1, nn.ReLU(), self.dropout, self.linear2)
"""


def test_a_module_holding_its_parameters_under_two_names_keeps_full_marks():
    """The copied-weights twin loads a tensor once, whatever names it has (it lost values and dropout)."""
    code = mutate(source_code(A07), """
        self.linear1 = nn.Linear(embed_dim, ff_dim)
        self.linear2 = nn.Linear(ff_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)
""", SHARED_FF)
    code = mutate(code, "return self.linear2(self.dropout(torch.relu(self.linear1(x))))", "return self.net(x)")
    suite = load_suite(A07)
    gids = [gid for gid, c in suite.checks.items() if not gid.startswith("test_q_")]
    results = run_checks(A07, code, gids)
    assert results and all(msg == "" for msg in results.values()), {k: v for k, v in results.items() if v}


def test_a_parameter_beyond_the_references_is_still_zeroed():
    """A genuine extra parameter (not one tensor with a wanted one) is zeroed as before: an extra bias added to the
    output cannot move the answer."""
    code = mutate(source_code(A07), "        self.dropout = nn.Dropout(dropout)\n",
                  "        self.dropout = nn.Dropout(dropout)\n        self.shift = nn.Parameter(torch.ones(embed_dim))\n")
    code = mutate(code, "return self.linear2(self.dropout(torch.relu(self.linear1(x))))",
                  "return self.linear2(self.dropout(torch.relu(self.linear1(x)))) + self.shift")
    assert run_checks(A07, code, ["test_feed_forward"]) == {"test_feed_forward": ""}


def test_loading_one_tensor_under_two_names_with_two_values_is_refused():
    ns: dict = {"__name__": "__main__"}
    exec("import torch.nn as nn\nlin = nn.Linear(2, 2)\nm = nn.ModuleDict({'a': lin, 'b': lin})\n", ns)
    runner = Runner(torch, ns)
    assert runner.handle({"op": "shared", "target": "m"})["value"] == [["a.weight", "b.weight"], ["a.bias", "b.bias"]]
    w = np.ones((2, 2), np.float32)
    same = runner.handle({"op": "load", "target": "m", "state": {"a.weight": w, "b.weight": w}})
    assert same["ok"] and torch.equal(ns["lin"].weight, torch.ones(2, 2)), same
    two = runner.handle({"op": "load", "target": "m", "state": {"a.weight": w, "b.weight": w * 2}})
    assert not two["ok"] and "one tensor in your module" in two["error"], two


ANSWERS = """
import math, numpy as np, torch
q_induction_position = 2                                     # ch09: the int for the option '2'
q_changed_rows = {2, 0}                                      # ch03: an order-free answer as a set
q_changed_rows_list = [2, 0]
keys = torch.tril(torch.ones(6, 6, dtype=torch.bool))[None] & (torch.arange(6) < 4)[None, None, :]
q_keys_seen = keys.sum(-1)                                   # ch04: a (1, 6) tensor from the student's own masks
q_keys_seen_array = keys.sum(-1).numpy()
q_keys_seen_set = {1, 2, 3, 4}                               # an ordered answer as a set: refused, order matters
q_ff_share = torch.tensor((2 * 512 * 2048 + 2048 + 512) / (4 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512 + 2048))
q_ff_share_np = np.float64(q_ff_share.item())
q_ff_share_bool = True
q_ff_share_nan = float("nan")
q_ff_share_inf = math.inf
q_block_params_tensor = torch.tensor([1, 2])
"""

# (chapter, check, the variable to read instead of the check's own, the message's words; "" when it passes)
VERDICTS = [
    ("09_tiny_gpt", "test_q_induction_position", "q_induction_position", ""),
    ("03_self_attention", "test_q_changed_rows", "q_changed_rows", ""),
    ("03_self_attention", "test_q_changed_rows", "q_changed_rows_list", ""),
    ("04_masked_attention", "test_q_keys_seen", "q_keys_seen", ""),
    ("04_masked_attention", "test_q_keys_seen", "q_keys_seen_array", ""),
    ("04_masked_attention", "test_q_keys_seen", "q_keys_seen_set", "in order: a set has no order"),
    ("07_transformer_block", "test_q_ff_share", "q_ff_share", ""),
    ("07_transformer_block", "test_q_ff_share", "q_ff_share_np", ""),
    ("07_transformer_block", "test_q_ff_share", "q_ff_share_bool", "should be a number (an int or a float"),
    ("07_transformer_block", "test_q_ff_share", "q_ff_share_nan", "should be a finite number"),
    ("07_transformer_block", "test_q_ff_share", "q_ff_share_inf", "should be a finite number"),
    ("07_transformer_block", "test_q_block_params", "q_block_params_tensor", "should be one number"),
]


class _Renamed:
    """A backend that reads ``name`` where the check asks for its own variable (one notebook, many answers)."""

    def __init__(self, backend, name: str) -> None:
        self.backend, self.name = backend, name

    def __getattr__(self, attr):
        return getattr(self.backend, attr)

    def value(self, name: str):
        return self.backend.value(self.name)


@pytest.mark.parametrize("where", ["sandbox", "local"])
def test_question_answers_in_the_form_a_reader_calls_the_same(where):
    """Issue 34: the int 2 for the option '2', a set (or a list in another order) for an order-free answer, a
    (1, 6) tensor or array for a 6-tuple, a one-number tensor or numpy float for a number; bools, NaN and
    infinities still refused, saying what form is expected. Read through the sandbox's ``value`` request."""
    from autograder.isolation.sandbox import Limits, Sandbox
    from autograder.judging.checks import CheckFailed, LocalBackend, StudentError
    from autograder.judging.judge import SandboxBackend

    if where == "local":
        ns: dict = {"__name__": "__main__"}
        exec(ANSWERS, ns)
        backend, box = LocalBackend(ns), None
    else:
        box = Sandbox(limits=Limits(cell_timeout=20, call_timeout=10, notebook_timeout=120)).__enter__()
        reply = box.request({"op": "exec", "code": ANSWERS, "label": "<answers>"}, timeout=20)
        assert reply["ok"], reply
        backend = SandboxBackend(box, box.limits)
    try:
        for chapter, gid, name, words in VERDICTS:
            try:
                load_suite(chapter).run(gid, _Renamed(backend, name), 0)
                message = ""
            except (CheckFailed, StudentError) as e:
                message = str(e)
            assert (words.lower() in message.lower()) if words else message == "", (chapter, name, message)
    finally:
        if box is not None:
            box.__exit__(None, None, None)


def test_a_cells_statements_run_one_at_a_time_as_one_cell():
    """The runner's exec (the sandbox's and the local one): a failing statement does not stop the ones after it;
    one that uses what a failed one would have made fails too; the cell reports its first error; a compound
    statement is one statement; line numbers and inspect see the cell; a future import governs what follows; a
    cell that does not parse runs nothing."""
    import inspect

    ns: dict = {"__name__": "__main__"}
    runner = Runner(torch, ns)
    cell = ("from __future__ import annotations\nimport torch\nfirst = undefined_name\nafter = first + 1\n"
            "def f(x: NotDefinedEither) -> int:\n    return x + 1\n\nfor i in range(2):\n    last = i\n"
            "    raise_here = 1 / 0 if i else None\nz = 3\n")
    reply = runner.handle({"op": "exec", "code": cell, "label": "<cell one>"})
    assert not reply["ok"] and reply["error"].startswith("NameError: name 'undefined_name'"), reply
    assert 'File "<cell one>", line 3' in reply["traceback"], reply["traceback"]
    assert "after" not in ns and "first" not in ns  # fails too: it uses what the failed statement would have made
    assert ns["f"](1) == 2 and ns["f"].__annotations__ == {"x": "NotDefinedEither", "return": "int"}
    assert inspect.getsource(ns["f"]).startswith("def f(x: NotDefinedEither)")
    assert ns["last"] == 1 and ns["z"] == 3  # the loop stopped at its own error (one statement), z still ran
    bad = runner.handle({"op": "exec", "code": "w = 1\ndef broken(:\n", "label": "<cell two>"})
    assert not bad["ok"] and bad["error"].startswith("SyntaxError") and "w" not in ns


def test_magics_jupyter_does_not_run_as_python_are_neither_run_nor_scanned():
    from autograder.in_sandbox.magics import strip_magics

    for magic in ("%%script false", "%%script bash", "%%bash", "%%sh", "%%html", "%%javascript", "%%js", "%%latex",
                  "%%markdown", "%%svg", "%%perl", "%%ruby", "%%python3", "%%unknown_magic"):
        assert strip_magics(f"\n{magic}\nfrom attnkit import softmax\n").strip() == "pass", magic
    for magic in ("%%time", "%%timeit", "%%capture out", "%%writefile helper.py"):
        assert "from attnkit import softmax" in strip_magics(f"{magic}\nfrom attnkit import softmax\n"), magic


def test_run_lines_are_read_as_ipython_reads_them(tmp_path):
    from autograder.notebook import MAX_RUN_BYTES, expand_runs, run_target

    assert run_target(" helpers.py") == run_target(" -i helpers") == run_target(' "helpers.py" a b') == "helpers.py"
    assert run_target(" -m pkg.mod") == "pkg/mod.py" and run_target(" 'my helpers.py'") == "my helpers.py"
    (tmp_path / "helpers.py").write_text("h = 1\n")
    (tmp_path / "big.py").write_text("#" * (MAX_RUN_BYTES + 1))
    (tmp_path / "link.py").symlink_to(tmp_path / "helpers.py")
    cells = expand_runs("a = 1\n%run helpers.py\nb = h\n", "your cell 'x'", tmp_path)
    assert [c for _, c in cells] == ["a = 1", "h = 1\n", "\n\nb = h\n"]  # b keeps its line number (3)
    assert cells[1][0] == "your file 'helpers.py' (%run in cell 'x')"
    for line, words in [("%run missing.py", "no file missing.py"), ("%run ../helpers.py", "no absolute path, no .."),
                        (f"%run {tmp_path}/helpers.py", "no absolute path"), ("%run link.py", "symbolic link"),
                        ("%run big.py", "over the grader's limit"), ("%run", "needs a file name")]:
        (label, code), = expand_runs(line + "\n", "your cell 'x'", tmp_path)
        assert code.startswith("raise FileNotFoundError(") and words in code, (line, code)
    assert expand_runs("%%bash\n%run helpers.py\n", "c", tmp_path) == [("c", "%%bash\n%run helpers.py\n")]
