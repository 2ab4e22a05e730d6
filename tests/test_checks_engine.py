"""The checks engine's helpers (autograder/judging/checks/): what every chapter's checks build on, tested on
their own so a chapter author can rely on them (issue 30)."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit import softmax
from autograder.judging.checks import (Args, CheckFailed, LocalBackend, Suite, Trial, args, fail_if_named,
                                       named_mistake, number, twin)
from autograder.judging.checks.common import expect_masked, fitted_scale, renormalised


def trial(namespace: dict) -> Trial:
    return Trial(LocalBackend({"__name__": "__main__", **namespace}), seed=1)


def test_named_mistake_names_the_first_match_in_order_and_takes_pairs():
    wrong = {"first": 1.0, "second": 1.0, "third": 3.0}
    assert named_mistake(1.0, wrong, lambda a, b: a == b) == "first"
    assert named_mistake(2.0, wrong, lambda a, b: a == b) is None
    assert named_mistake(5.0, [("same words", 4.0), ("same words", 5.0)], lambda a, b: a == b) == "same words"
    with pytest.raises(CheckFailed, match="mistake in x: third"):
        fail_if_named(3.0, wrong, "x", lambda a, b: a == b)


def test_question_table_row_names_a_nan_and_keeps_the_answer_secret():
    q = number(0.25, "a weight", {"NaN is 0/0": math.nan, "0 is the contract": 0.0})
    q.judge(0.25, "q")
    with pytest.raises(CheckFailed, match="NaN is 0/0"):
        q.judge(float("nan"), "q")
    with pytest.raises(CheckFailed) as e:
        q.judge(0.3, "q")
    assert "0.25" not in str(e.value)


def test_a_check_description_is_its_docstrings_whole_first_paragraph():
    """A first sentence that wraps is shown whole beside the score, not cut at the line's end."""
    suite = Suite("xx_test")

    @suite.check("test_wrapped", parts=["f"])
    def wrapped(t):
        """f keeps the sum of the values it is given,
        whatever their order.

        How it is checked: not shown."""

    assert suite.checks["test_wrapped"].doc == "f keeps the sum of the values it is given, whatever their order."


def test_oracle_runs_each_case_and_names_the_mistake():
    suite = Suite("xx_test")
    suite.oracle("test_double", "double", "double(x) is 2 x.", cases=[(2, 3), (4,)],
                 draw=lambda t, *shape: args(t.randn(*shape)), reference=lambda x: 2 * x,
                 mistakes=lambda x: {"it squares": x * x, "it adds one": x + 1})
    assert suite.checks["test_double"].doc == "double(x) is 2 x." and isinstance(args(1), Args)
    suite.run("test_double", LocalBackend({"double": lambda x: x + x}), seed=0)
    with pytest.raises(CheckFailed, match="it adds one"):
        suite.run("test_double", LocalBackend({"double": lambda x: x + 1}), seed=0)


def test_twin_loads_the_same_weights_names_missing_parameters_and_zeroes_extra_ones():
    class Student(torch.nn.Module):
        def __init__(self, extra=False):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)
            if extra:
                self.more = torch.nn.Parameter(torch.ones(2))

        def forward(self, x):
            return self.lin(x) + (self.more if hasattr(self, "more") else 0)

    t = trial({"Student": Student})
    ref = torch.nn.Module()
    ref.lin = torch.nn.Linear(3, 2)
    obj, weights = twin(t, "Student", reference=ref)
    x = t.randn(4, 3)
    assert torch.allclose(obj(x), ref.lin(x).detach())
    assert torch.equal(weights["lin.weight"], ref.lin.weight.detach())
    obj, _ = twin(t, "Student", True, reference=ref)
    assert torch.allclose(obj(x), ref.lin(x).detach())  # the parameter the reference lacks is zeroed
    with pytest.raises(CheckFailed, match="does not ask for"):
        twin(t, "Student", True, reference=ref, exact=True)
    renamed = torch.nn.Module()
    renamed.proj = torch.nn.Linear(3, 2)
    with pytest.raises(CheckFailed, match="missing the parameters proj.bias, proj.weight: call it proj"):
        twin(t, "Student", reference=renamed, hint=": call it proj")


@pytest.mark.parametrize("c", [1.0, 0.125, 0.5, 8.0])
def test_the_students_own_scale_is_recovered_from_their_weights(c):
    s = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    mask = torch.rand(5, 7) < 0.7
    mask[:, 0] = True
    w = softmax((c * s).masked_fill(~mask, float("-inf")))
    assert fitted_scale(s, w, mask) == pytest.approx(c, rel=1e-6)
    assert fitted_scale(s, torch.full_like(w, 1 / 7)) is None  # weights that ignore the scores


def test_the_mask_is_judged_on_the_students_own_weights_whatever_their_scale():
    s = torch.randn(2, 4, 6, dtype=torch.float64)
    full = torch.rand(2, 4, 6) < 0.6
    full[..., 0], full[1, 2] = True, False  # every row but one has a key; row (1, 2) has none
    for c in (1.0, 0.3):  # the right scale and a wrong one: the mask's property holds for both
        w0 = softmax(c * s)
        expect_masked(softmax((c * s).masked_fill(~full, float("-inf"))), w0, full, "w")
    w0 = softmax(s)
    assert torch.equal(renormalised(w0, full)[1, 2], torch.zeros(6, dtype=torch.float64))
    with pytest.raises(CheckFailed, match="after the softmax"):
        expect_masked(w0 * full, w0, full, "w")
    with pytest.raises(CheckFailed, match="self_mask is ignored"):
        expect_masked(w0, w0, full, "w", name="self_mask")
