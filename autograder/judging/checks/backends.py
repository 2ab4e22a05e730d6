"""Where the student's code runs: a :class:`Backend` sends the judge's requests to a
:class:`autograder.in_sandbox.harness.Runner` that holds it (the sandbox's, or :class:`LocalBackend`'s in
this process for a notebook's hidden tests and the tests)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from autograder.in_sandbox.harness import Runner
from autograder.in_sandbox.wire import Ref
from autograder.judging.checks.verdicts import StudentError, reply_value


class Backend:
    """Sends the judge's requests to a :class:`autograder.in_sandbox.harness.Runner` that holds the student's code.

    Values in and out are wire values (numpy arrays, scalars, tuples, lists, dicts, refs). ``bans``
    (given by the :class:`~autograder.judging.checks.trial.Trial`, from ``Suite.bans``): the names the parts
    under check may not use; the runner refuses the matching torch operators, and torch's attention, while each
    call runs.
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


class LocalBackend(Backend):
    """Runs the student's code in this process, from a namespace (a notebook's ``globals()``), with the
    same :class:`~autograder.in_sandbox.harness.Runner` the sandbox uses: same values, same errors, same bans."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.runner = Runner(torch, namespace)

    def ask(self, request: dict[str, Any]) -> Any:
        return reply_value(self.runner.handle(request))
