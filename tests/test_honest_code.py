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
