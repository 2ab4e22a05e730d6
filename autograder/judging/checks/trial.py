"""What a check sees: a :class:`Trial` (a private random generator and access to the student's code) and
:class:`Obj`, a student's object living in the student's process; :func:`build` constructs one with a
message naming the constructor when it fails."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from autograder.in_sandbox.wire import Ref, map_leaves
from autograder.judging.checks.backends import Backend
from autograder.judging.checks.verdicts import StudentError, explained


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


def label(name: str, *args: Any, **kwargs: Any) -> str:
    """``name(1, 2, bias=False)``: how a message names a call."""
    return f"{name}({', '.join([*map(str, args), *(f'{k}={v}' for k, v in kwargs.items())])})"


def build(t: Trial, name: str, *args: Any, **kwargs: Any) -> Obj:
    """The student's ``name(*args, **kwargs)``; :class:`CheckFailed` naming the call when it raises (the
    exercise's NotImplementedError placeholder is passed on as it is)."""
    with explained(lambda err: f"{label(name, *args, **kwargs)} could not be created: {err}"):
        return t.new(name, *args, **kwargs)
