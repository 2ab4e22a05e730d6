"""The graded tests, run by the trusted judge.

Each assignment has a module ``chNN_topic.py`` with a :class:`Suite` whose checks
are named after the notebook's test cells (``test_<name>...``); a check is worth
that cell's points. A check is ordinary Python that runs in the judge: it draws
inputs from a private generator, asks the student's process to run the
student's code on them (:meth:`Trial.call`, :meth:`Trial.new`, ...), gets back
plain tensors, and compares them with :mod:`attnkit` or torch's own primitives
here, where the student's code never ran. A failure raises :class:`CheckFailed`
with a message for the student, naming the misconception where the answer
matches a known mistake.

The same checks run inside a notebook kernel (the source notebooks' hidden tests
call :func:`run_local`) so an instructor can see them pass on the reference.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from autograder.in_sandbox.harness import Runner
from autograder.in_sandbox.wire import Ref, map_leaves

__all__ = ["CheckFailed", "Requirement", "requirement", "Suite", "Trial", "load_suite", "run_local", "expect_number", "expect_tuple", "expect_choice"]


class CheckFailed(AssertionError):
    """The student's answer is wrong; the message says how."""


class StudentError(CheckFailed):
    """The student's code raised, timed out or returned something unusable."""


@dataclass
class Check:
    grade_id: str
    fn: Callable[["Trial"], None]
    parts: tuple[str, ...]  # the solution cells (function or class names) this check exercises
    doc: str


@dataclass
class Suite:
    """The checks of one assignment, keyed by the test cell ``grade_id`` they grade."""

    assignment: str
    checks: dict[str, Check] = field(default_factory=dict)
    # part -> {attribute or imported name: what it is}: names that part's answer must not use
    forbidden: dict[str, dict[str, str]] = field(default_factory=dict)

    def check(self, grade_id: str, parts: Iterable[str]) -> Callable[[Callable[["Trial"], None]], Callable[["Trial"], None]]:
        def register(fn: Callable[["Trial"], None]) -> Callable[["Trial"], None]:
            if grade_id in self.checks:
                raise ValueError(f"check {grade_id!r} registered twice")
            self.checks[grade_id] = Check(grade_id, fn, tuple(parts), (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else grade_id)
            return fn

        return register

    def bans(self, parts: Iterable[str]) -> tuple[str, ...]:
        """The names banned while a check of ``parts`` runs: every ban of every part it exercises."""
        return tuple(sorted({name for p in parts for name in self.forbidden.get(p, {})}))

    def run(self, grade_id: str, backend: "Backend", seed: int) -> None:
        """Run the check of test cell ``grade_id`` on the student's code behind ``backend``.

        The one way a check is run, by the judge, by the source notebooks' hidden tests
        (:func:`run_local`) and by the tests: every call the check makes carries the bans of the
        parts it exercises. Returns when the check passes; raises :class:`CheckFailed` (or
        :class:`StudentError`) with the student-facing message when it does not."""
        check = self.checks[grade_id]
        check.fn(Trial(backend, seed, self.bans(check.parts)))


@dataclass(frozen=True)
class Requirement:
    """One requirement the exercise's text states, as data beside the checks (``STATED_REQUIREMENTS``).

    ``checks``: the check(s) that enforce it (an answer breaking only this requirement fails these and no
    other); ``message``: words of the message such an answer gets; ``phrase``: words of the student's
    notebook (markdown or docstrings) that state it; ``also``: checks that the same answer fails too, with
    their own words (a pair missing breaks every check that reads the pair). ``tests/test_stated_requirements.py``
    reads the phrases against the notebook, ``tests/chapter_checking.py`` breaks each requirement alone."""

    checks: tuple[str, ...]
    message: str
    phrase: str
    also: tuple[str, ...] = ()


def requirement(checks: str | Iterable[str], message: str, phrase: str, also: Iterable[str] = ()) -> Requirement:
    """A :class:`Requirement`; ``checks`` one grade id or several."""
    return Requirement((checks,) if isinstance(checks, str) else tuple(checks), message, phrase, tuple(also))


def load_suite(assignment: str) -> Suite:
    """The suite of ``assignment`` (``01_single_head`` -> ``autograder.judging.checks.ch01_single_head``)."""
    try:
        module = importlib.import_module(f"autograder.judging.checks.ch{assignment}")
    except ModuleNotFoundError as e:
        raise KeyError(f"no checks for assignment {assignment!r}") from e
    return module.SUITE


# -- backends: where the student's code runs ------------------------------------------------------


class Backend:
    """Sends the judge's requests to a :class:`autograder.in_sandbox.harness.Runner` that holds the student's code.

    Values in and out are wire values (numpy arrays, scalars, tuples, lists, dicts, refs). ``bans``
    (given by the :class:`Trial`, from :meth:`Suite.bans`): the names the parts under check may not use;
    the runner refuses the matching torch operators, and torch's attention, while each call runs.
    """

    def ask(self, request: dict[str, Any]) -> Any:
        """Send one request; the reply's value, or :class:`StudentError` saying what went wrong."""
        raise NotImplementedError

    def call(self, target: str | Ref, args: list, kwargs: dict, bans: tuple[str, ...], attr: str | None = None,
             keep: bool = False) -> Any:
        value = self.ask({"op": "call", "target": target, "attr": attr, "args": args, "kwargs": kwargs,
                          "keep": keep, "bans": list(bans)})
        if keep and not isinstance(value, Ref):
            raise StudentError("the object could not be created")
        return value

    def grad(self, target: str | Ref, args: list, kwargs: dict, wrt: int, probe: np.ndarray, bans: tuple[str, ...],
             attr: str | None = None) -> Any:
        return self.ask({"op": "call", "target": target, "attr": attr, "args": args, "kwargs": kwargs, "grad": wrt,
                         "probe": probe, "bans": list(bans)})

    def trusted(self, source: str, target: str, args: list, kwargs: dict) -> Ref:
        """Build ``target(*args, **kwargs)`` from the judge's ``source``, in a fresh namespace of its own in the
        student's process (:meth:`autograder.in_sandbox.harness.Runner.op_trusted`); a reference to it comes back."""
        value = self.ask({"op": "trusted", "source": source, "target": target, "args": args, "kwargs": kwargs})
        if not isinstance(value, Ref):
            raise StudentError("the grader's fixture could not be created")
        return value

    def value(self, name: str) -> Any:
        """The plain value (number, string, tuple, list, tensor as array) the student assigned to ``name``."""
        return self.ask({"op": "value", "target": name})

    def params(self, target: Ref) -> dict:
        value = self.ask({"op": "params", "target": target})
        if not isinstance(value, dict):
            raise StudentError("the module's parameters could not be read")
        return value

    def load(self, target: Ref, state: dict) -> None:
        self.ask({"op": "load", "target": target, "state": state})


def reply_value(reply: Mapping[str, Any]) -> Any:
    """The value of a runner's reply, or :class:`StudentError` with the student-facing sentence."""
    if not reply.get("ok"):
        raise StudentError(describe_error(str(reply.get("error", "an error"))))
    return reply.get("value")


class LocalBackend(Backend):
    """Runs the student's code in this process, from a namespace (a notebook's ``globals()``), with the
    same :class:`~autograder.in_sandbox.harness.Runner` the sandbox uses: same values, same errors, same bans."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.runner = Runner(torch, namespace)

    def ask(self, request: dict[str, Any]) -> Any:
        return reply_value(self.runner.handle(request))


def describe_error(error: str) -> str:
    """A student-facing sentence for an exception raised by their code."""
    name, _, detail = error.partition(":")
    if name.strip() == "NotImplementedError" and not detail.strip():  # the exercise's own placeholder
        return "not implemented yet: the cell still raises NotImplementedError"
    if error.startswith(("Delegated", "Tampered")):
        return "earns no points: " + error.split(":", 1)[1].strip()
    return f"your code raised {error}"


# -- the trial: what a check sees -------------------------------------------------------------------


class Obj:
    """A student's object (for example a module) living in the student's process."""

    def __init__(self, trial: "Trial", ref: Ref) -> None:
        self.trial, self.ref = trial, ref

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.trial._call(self.ref, args, kwargs)

    def method(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.trial._call(self.ref, args, kwargs, attr=name)

    def params(self) -> dict[str, Tensor]:
        return {k: torch.as_tensor(v) for k, v in self.trial.backend.params(self.ref).items()}

    def load(self, state: Mapping[str, Tensor]) -> None:
        self.trial.backend.load(self.ref, {k: v.detach().cpu().numpy() for k, v in state.items()})


def _sendable_leaf(v: Any) -> Any:
    if isinstance(v, Tensor):
        return v.detach().cpu().numpy().copy()
    return v.ref if isinstance(v, Obj) else v


def _sendable(v: Any) -> Any:
    """A check's argument as a wire value: tensors as arrays, the student's objects as refs."""
    return map_leaves(v, _sendable_leaf)


def _received(v: Any) -> Any:
    """A reply's value as a check sees it: arrays as tensors."""
    return map_leaves(v, lambda x: torch.from_numpy(x) if isinstance(x, np.ndarray) else x)


class Trial:
    """One run of one check: a private random generator and access to the student's code."""

    def __init__(self, backend: Backend, seed: int, bans: tuple[str, ...] = ()) -> None:
        self.backend, self.bans = backend, tuple(bans)
        self.gen = torch.Generator().manual_seed(seed)

    # inputs ---------------------------------------------------------------------------------
    def randn(self, *shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> Tensor:
        return (torch.randn(*shape, generator=self.gen, dtype=torch.float64) * scale).to(dtype)

    def randint(self, low: int, high: int, shape: tuple[int, ...]) -> Tensor:
        return torch.randint(low, high, shape, generator=self.gen)

    def rand_mask(self, *shape: int, p: float = 0.7) -> Tensor:
        return torch.rand(*shape, generator=self.gen) < p

    # the student's code ----------------------------------------------------------------------
    def _call(self, target: str | Ref, args: tuple, kwargs: dict, attr: str | None = None) -> Any:
        return _received(self.backend.call(target, list(_sendable(args)), _sendable(kwargs), self.bans, attr=attr))

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call the student's function ``name`` on copies of ``args``; tensors come back as tensors."""
        return self._call(name, args, kwargs)

    def new(self, name: str, *args: Any, **kwargs: Any) -> Obj:
        """Construct the student's class ``name``; the object stays in the student's process."""
        ref = self.backend.call(name, list(_sendable(args)), _sendable(kwargs), self.bans, keep=True)
        return Obj(self, ref)

    def trusted(self, source: str, name: str, *args: Any, **kwargs: Any) -> Obj:
        """``name(*args, **kwargs)`` built from ``source`` (the judge's code, a module's text) in a fresh namespace
        in the student's process, never looked up among the student's names: a fixture to hand to the student's
        code. It lives in the student's process, so anything it records there is the student's to rewrite."""
        return Obj(self, self.backend.trusted(source, name, list(_sendable(args)), _sendable(kwargs)))

    def value(self, name: str) -> Any:
        """The value the student assigned to ``name`` (a conceptual question's answer): numbers, strings,
        bools, tuples and lists come back as themselves, tensors and arrays as tensors."""
        return _received(self.backend.value(name))

    def grad(self, target: str | Obj, *args: Any, wrt: int, probe: Tensor, **kwargs: Any) -> Tensor:
        """Gradient of ``sum(f(*args)[0] * probe)`` with respect to ``args[wrt]``, computed by the student's code."""
        t = target.ref if isinstance(target, Obj) else target
        return _received(self.backend.grad(t, list(_sendable(args)), _sendable(kwargs), wrt, probe.detach().numpy(),
                                           self.bans))


# -- comparisons (run in the judge) ---------------------------------------------------------------


def expect_tensor(value: Any, shape: tuple[int, ...] | None, what: str, dtype: torch.dtype | None = None) -> Tensor:
    """``value`` must be a finite floating tensor of ``shape`` (and ``dtype`` when given)."""
    if not isinstance(value, Tensor):
        raise CheckFailed(f"{what} should be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise CheckFailed(f"{what} has dtype {value.dtype}: expected a floating-point tensor, like the inputs")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise CheckFailed(f"{what} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    if dtype is not None and value.dtype != dtype:
        raise CheckFailed(f"{what} has dtype {value.dtype}, expected {dtype} (the dtype of the inputs)")
    if value.is_floating_point() and not torch.isfinite(value).all():
        n = int((~torch.isfinite(value)).sum())
        raise CheckFailed(f"{what} contains {n} NaN or infinite value(s)")
    return value


def expect_value_error(call: Callable[[], Any], what: str, hint: str) -> None:
    """``call()`` must raise ValueError in the student's code (not another exception, and not return)."""
    try:
        result = call()
    except StudentError as e:
        msg = str(e)
        if msg.startswith("not implemented"):
            raise
        if msg.startswith("your code raised ValueError"):
            return
        raise CheckFailed(f"{what} should raise a ValueError that says why; {msg}. {hint}") from None
    shape = tuple(result.shape) if isinstance(result, Tensor) else type(result).__name__
    raise CheckFailed(f"{what} silently returned {shape}; it should raise a ValueError. {hint}")


def expect_pair(value: Any, what: str) -> tuple[Any, Any]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        got = f"a {type(value).__name__}" + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else "")
        raise CheckFailed(f"{what} should return a pair (output, weights), got {got}")
    return value[0], value[1]


def close(a: Tensor, b: Tensor, atol: float = 1e-4, rtol: float = 1e-4) -> bool:
    if tuple(a.shape) != tuple(b.shape):
        return False
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return bool(torch.isfinite(a64).all()) and bool(torch.allclose(a64, b64, atol=atol, rtol=rtol))


def expect_close(actual: Tensor, expected: Tensor, what: str, mistakes: Mapping[str, Tensor] | None = None,
                 atol: float = 1e-4, rtol: float = 1e-4) -> None:
    """``actual`` must equal ``expected``; if it equals one of ``mistakes`` instead, the message names it."""
    actual = expect_tensor(actual, tuple(expected.shape), what)
    if close(actual, expected, atol, rtol):
        return
    for message, wrong in (mistakes or {}).items():
        if close(actual, wrong, atol, rtol):
            raise CheckFailed(f"mistake in {what}: {message}")
    err = (actual.to(torch.float64) - expected.to(torch.float64)).abs().max().item()
    raise CheckFailed(f"{what} does not match the expected values (largest difference {err:.3g})")


# -- conceptual questions: the answer is a value the student assigned (read with Trial.value) -----------


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number (or bool) it is; anything else unchanged. The runner already
    sends numpy scalars as numbers (``harness._numbers``); this keeps the helpers right when called on
    values that did not travel (a check's own arithmetic, a test)."""
    return value.item() if isinstance(value, np.generic) else value


def _as_number(value: Any, what: str) -> float:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    value = _plain(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckFailed(f"{what} should be a number, got {type(value).__name__}")
    return float(value)


def expect_number(value: Any, expected: float, what: str, mistakes: Mapping[str, float] | None = None,
                  rel: float = 1e-3, abs_tol: float = 1e-6) -> None:
    """``value`` must be a number within ``rel`` (relative) or ``abs_tol`` of ``expected``; a known wrong
    value (``mistakes``: message -> value) is named. The expected value is not revealed."""
    import math

    v = _as_number(value, what)
    if math.isclose(v, expected, rel_tol=rel, abs_tol=abs_tol):
        return
    for message, wrong in (mistakes or {}).items():
        if math.isclose(v, wrong, rel_tol=rel, abs_tol=abs_tol):
            raise CheckFailed(f"mistake in {what}: {message}")
    raise CheckFailed(f"{what} is not right (you answered {v:.6g})")


def expect_tuple(value: Any, expected: tuple, what: str, mistakes: Mapping[str, tuple] | None = None) -> None:
    """``value`` must be a tuple (or list) equal to ``expected`` item by item (numbers compared exactly)."""
    if isinstance(value, Tensor) and value.dim() == 1:
        value = value.tolist()
    if not isinstance(value, (tuple, list)):
        raise CheckFailed(f"{what} should be a tuple like {tuple('.' * len(expected))!r}, got {type(value).__name__}")
    got = tuple(_plain(x) for x in value)
    if got == tuple(expected):
        return
    for message, wrong in (mistakes or {}).items():
        if got == tuple(wrong):
            raise CheckFailed(f"mistake in {what}: {message}")
    raise CheckFailed(f"{what} is not right (you answered {got!r})")


def expect_choice(value: Any, expected: str, what: str, choices: Iterable[str],
                  mistakes: Mapping[str, str] | None = None) -> None:
    """``value`` must name one of ``choices`` (case and surrounding spaces ignored) and be ``expected``;
    ``mistakes`` maps a wrong choice to the message that explains it."""
    options = [str(c) for c in choices]
    if not isinstance(value, str):
        raise CheckFailed(f"{what} should be one of {', '.join(repr(c) for c in options)} (a string), "
                          f"got {type(value).__name__}")
    got = value.strip().lower()
    if got not in [c.lower() for c in options]:
        raise CheckFailed(f"{what} should be one of {', '.join(repr(c) for c in options)}, got {value[:40]!r}")
    if got == expected.lower():
        return
    for wrong, message in (mistakes or {}).items():
        if got == wrong.lower():
            raise CheckFailed(f"mistake in {what}: {message}")
    raise CheckFailed(f"{what} is not right (you chose {value.strip()[:40]!r})")


def seed_for(secret: str, assignment: str, grade_id: str) -> int:
    digest = hashlib.sha256(f"{secret}\0{assignment}\0{grade_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


_SAID_UNCONFINED = False  # run_local's note, once per process


def run_local(assignment: str, grade_id: str, namespace: Mapping[str, Any], secret: str = "local") -> None:
    """Run one check against the functions in ``namespace`` (a notebook's ``globals()``).

    This is what the source notebooks' hidden tests call, so that the instructor sees them pass on the
    reference. Under plain ``nbgrader autograde`` it runs in the student's own kernel, with the
    grader's rights and no sandbox: a note says so, once per kernel, on stdout (nbgrader counts any
    output on stderr as a failed test)."""
    global _SAID_UNCONFINED
    if not _SAID_UNCONFINED:
        _SAID_UNCONFINED = True
        print("note: this check runs in this notebook's own kernel, not in the grader's sandbox; grade "
              "submissions with `python -m autograder grade` (autograder/README.md): plain `nbgrader "
              "autograde` runs student code unconfined, with your rights")
    backend = LocalBackend(dict(namespace) if not isinstance(namespace, dict) else namespace)
    load_suite(assignment).run(grade_id, backend, seed_for(secret, assignment, grade_id))
