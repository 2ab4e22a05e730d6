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

from autograder.wire import Ref

__all__ = ["CheckFailed", "Suite", "Trial", "load_suite", "run_local", "expect_number", "expect_tuple", "expect_choice"]


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


def load_suite(assignment: str) -> Suite:
    """The suite of ``assignment`` (``01_single_head`` -> ``autograder.checks.ch01_single_head``)."""
    try:
        module = importlib.import_module(f"autograder.checks.ch{assignment}")
    except ModuleNotFoundError as e:
        raise KeyError(f"no checks for assignment {assignment!r}") from e
    return module.SUITE


# -- backends: where the student's code runs ------------------------------------------------------


class Backend:
    """Runs the student's code. Values in and out are numpy arrays, scalars, tuples, lists, dicts and refs."""

    def call(self, target: str | Ref, args: list, kwargs: dict, attr: str | None = None, keep: bool = False) -> Any:
        raise NotImplementedError

    def grad(self, target: str | Ref, args: list, kwargs: dict, wrt: int, probe: np.ndarray, attr: str | None = None) -> Any:
        raise NotImplementedError

    def value(self, name: str) -> Any:
        """The plain value (number, string, tuple, list, tensor as array) the student assigned to ``name``."""
        raise NotImplementedError

    def params(self, target: Ref) -> dict:
        raise NotImplementedError

    def load(self, target: Ref, state: dict) -> None:
        raise NotImplementedError


class LocalBackend(Backend):
    """Calls functions from a namespace in this process (a notebook's ``globals()``); for authoring only."""

    def __init__(self, namespace: Mapping[str, Any]) -> None:
        self.ns, self.refs = namespace, {}

    def _resolve(self, target: str | Ref) -> Any:
        if isinstance(target, Ref):
            return self.refs[target.id]
        if target not in self.ns:
            raise StudentError(f"nothing named {target!r} is defined in the notebook")
        return self.ns[target]

    def _in(self, v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return torch.from_numpy(v.copy())
        if isinstance(v, Ref):
            return self.refs[v.id]
        if isinstance(v, (list, tuple)):
            return type(v)(self._in(x) for x in v)
        if isinstance(v, dict):
            return {k: self._in(x) for k, x in v.items()}
        return v

    def _out(self, v: Any) -> Any:
        if isinstance(v, Tensor):
            if type(v) not in (Tensor, torch.nn.Parameter):
                raise StudentError(f"returned a subclass of torch.Tensor ({type(v).__name__}); return a plain tensor")
            return v.detach().cpu().numpy().copy()
        if isinstance(v, (list, tuple)):
            return type(v)(self._out(x) for x in v)
        return v

    def _run(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except CheckFailed:
            raise
        except Exception as e:  # noqa: BLE001 - the student's error becomes a failure message
            raise StudentError(describe_error(f"{type(e).__name__}: {e}")) from e

    def call(self, target, args, kwargs, attr=None, keep=False):
        fn = self._resolve(target)
        if attr:
            fn = getattr(fn, attr)
        result = self._run(lambda: fn(*self._in(args), **self._in(kwargs)))
        if keep:
            self.refs[len(self.refs) + 1] = result
            return Ref(len(self.refs))
        return self._out(result)

    def grad(self, target, args, kwargs, wrt, probe, attr=None):
        fn = self._resolve(target)
        if attr:
            fn = getattr(fn, attr)
        targs = list(self._in(args))
        targs[wrt] = targs[wrt].requires_grad_(True)

        def go():
            out = fn(*targs, **self._in(kwargs))
            out = out[0] if isinstance(out, tuple) else out
            (g,) = torch.autograd.grad((out * torch.from_numpy(probe)).sum(), targs[wrt], allow_unused=True)
            return torch.zeros_like(targs[wrt]) if g is None else g

        return self._out(self._run(go))

    def value(self, name):
        if name not in self.ns:
            raise StudentError(f"nothing named {name!r} is defined: assign your answer to {name}")
        v = self.ns[name]
        if isinstance(v, np.ndarray):
            v = torch.from_numpy(v.copy())
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, tuple) and type(v) is not tuple:  # torch.Size, a namedtuple
            v = tuple(v)
        return self._out(v)

    def params(self, target):
        return {k: self._out(v) for k, v in self._resolve(target).state_dict().items()}

    def load(self, target, state):
        obj = self._resolve(target)
        own = obj.state_dict()
        with torch.no_grad():
            for k, v in state.items():
                if k not in own:
                    raise StudentError(f"your module has no parameter named {k!r} (it has: {', '.join(own)})")
                own[k].copy_(torch.from_numpy(v))


def describe_error(error: str) -> str:
    """A student-facing sentence for an exception raised by their code."""
    name, _, detail = error.partition(":")
    if name.strip() == "NotImplementedError" and not detail.strip():  # the exercise's own placeholder
        return "not implemented yet: the cell still raises NotImplementedError"
    if error.startswith("Delegated"):
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


def _to_wire(v: Any) -> Any:
    if isinstance(v, Tensor):
        return v.detach().cpu().numpy().copy()
    if isinstance(v, Obj):
        return v.ref
    if isinstance(v, (list, tuple)):
        return type(v)(_to_wire(x) for x in v)
    if isinstance(v, dict):
        return {k: _to_wire(x) for k, x in v.items()}
    return v


def _from_wire(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return torch.from_numpy(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_from_wire(x) for x in v)
    return v


class Trial:
    """One run of one check: a private random generator and access to the student's code."""

    def __init__(self, backend: Backend, seed: int) -> None:
        self.backend = backend
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
        return _from_wire(self.backend.call(target, list(_to_wire(args)), _to_wire(kwargs), attr=attr))

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call the student's function ``name`` on copies of ``args``; tensors come back as tensors."""
        return self._call(name, args, kwargs)

    def new(self, name: str, *args: Any, **kwargs: Any) -> Obj:
        """Construct the student's class ``name``; the object stays in the student's process."""
        ref = self.backend.call(name, list(_to_wire(args)), _to_wire(kwargs), keep=True)
        return Obj(self, ref)

    def value(self, name: str) -> Any:
        """The value the student assigned to ``name`` (a conceptual question's answer): numbers, strings,
        bools, tuples and lists come back as themselves, tensors and arrays as tensors."""
        return _from_wire(self.backend.value(name))

    def grad(self, target: str | Obj, *args: Any, wrt: int, probe: Tensor, **kwargs: Any) -> Tensor:
        """Gradient of ``sum(f(*args)[0] * probe)`` with respect to ``args[wrt]``, computed by the student's code."""
        t = target.ref if isinstance(target, Obj) else target
        return _from_wire(self.backend.grad(t, list(_to_wire(args)), _to_wire(kwargs), wrt, probe.detach().numpy()))


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
            raise CheckFailed(f"{what} is wrong: {message}")
    err = (actual.to(torch.float64) - expected.to(torch.float64)).abs().max().item()
    raise CheckFailed(f"{what} does not match the expected values (largest difference {err:.3g})")


# -- conceptual questions: the answer is a value the student assigned (read with Trial.value) -----------


def _as_number(value: Any, what: str) -> float:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
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
            raise CheckFailed(f"{what} is wrong: {message}")
    raise CheckFailed(f"{what} is not right (you answered {v:.6g})")


def expect_tuple(value: Any, expected: tuple, what: str, mistakes: Mapping[str, tuple] | None = None) -> None:
    """``value`` must be a tuple (or list) equal to ``expected`` item by item (numbers compared exactly)."""
    if isinstance(value, Tensor) and value.dim() == 1:
        value = value.tolist()
    if not isinstance(value, (tuple, list)):
        raise CheckFailed(f"{what} should be a tuple like {tuple('.' * len(expected))!r}, got {type(value).__name__}")
    got = tuple(value)
    if got == tuple(expected):
        return
    for message, wrong in (mistakes or {}).items():
        if got == tuple(wrong):
            raise CheckFailed(f"{what} is wrong: {message}")
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
            raise CheckFailed(f"{what} is wrong: {message}")
    raise CheckFailed(f"{what} is not right (you chose {value.strip()[:40]!r})")


def seed_for(secret: str, assignment: str, grade_id: str) -> int:
    digest = hashlib.sha256(f"{secret}\0{assignment}\0{grade_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def run_local(assignment: str, grade_id: str, namespace: Mapping[str, Any], secret: str = "local") -> None:
    """Run one check against the functions in ``namespace`` (a notebook's ``globals()``)."""
    check = load_suite(assignment).checks[grade_id]
    check.fn(Trial(LocalBackend(namespace), seed_for(secret, assignment, grade_id)))
