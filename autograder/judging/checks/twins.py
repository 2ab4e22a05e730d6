"""The copied-weights twin: the student's module and the judge's reference holding the same freshly drawn
weights, so that the expected answer (and every classic mistake) is computed here from those weights."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from autograder.judging.checks.trial import Obj, Trial, build, label
from autograder.judging.checks.verdicts import CheckFailed

Params = dict[str, Tensor]


def draw_weights(t: Trial, shapes: Mapping[str, Any], scale: float = 0.5) -> Params:
    """A weight of ``shapes`` (name -> shape) drawn from the trial for each name, times ``scale``."""
    return {k: t.randn(*tuple(s), scale=scale) for k, s in shapes.items()}


def twin(t: Trial, name: str, *args: Any, reference: nn.Module | Mapping[str, Tensor],
         names: Callable[[str], str] = lambda k: k, draw: Callable[[Trial, Params], Params] = draw_weights,
         exact: bool = False, hint: str = "", **kwargs: Any) -> tuple[Obj, Params]:
    """The student's ``name(*args, **kwargs)`` loaded with the weights of ``reference``, drawn fresh.

    ``reference``: the judge's module (its ``state_dict`` names the parameters; it is loaded with the drawn
    weights) or the weights themselves (loaded as they are). ``names``: a reference's parameter name -> the
    student's. The student's module must hold every one of them with the same shape (``exact``: and nothing
    else; otherwise a parameter beyond them is zeroed, so the values are judged on their own; a name under which
    the module holds one of them again, the same tensor, is that parameter, not one beyond); ``hint`` ends the
    message that says which are missing. ``draw(t, shapes)``: the weights (by default N(0, 0.5^2))."""
    obj = build(t, name, *args, **kwargs)
    got = obj.params()
    module = reference if isinstance(reference, nn.Module) else None
    want = {names(k): v for k, v in (module.state_dict() if module is not None else reference).items()}
    missing = sorted(set(want) - set(got))
    # A tensor the module holds under several names (linear1 and net.0 the same nn.Linear) is one parameter:
    # a name of a wanted tensor is no extra (it is loaded with it), so only the truly extra ones are zeroed.
    shared = {k: g for g in _shared(obj) for k in g}
    covered = set(want) | {a for k in want for a in shared.get(k, ())}
    extra = sorted(set(got) - covered)
    if missing or (exact and extra):
        wrong = (f"is missing the parameters {', '.join(missing[:6])}" if missing else
                 f"has parameters the exercise does not ask for ({', '.join(extra[:6])})")
        raise CheckFailed(f"{label(name, *args, **kwargs)} {wrong}{hint}; its parameters are: "
                          f"{', '.join(sorted(got)) or 'none'}")
    for k, v in want.items():
        if tuple(got[k].shape) != tuple(v.shape):
            raise CheckFailed(f"{label(name, *args, **kwargs)}: parameter {k} has shape {tuple(got[k].shape)}, "
                              f"expected {tuple(v.shape)}")
    fresh = draw(t, {k: v.shape for k, v in want.items()}) if module is not None else dict(want)
    obj.load(fresh | {k: got[k] * 0 for k in extra})
    if module is not None:
        back = {names(k): k for k in module.state_dict()}
        module.load_state_dict({back[k]: v for k, v in fresh.items()})
    return obj, fresh


def _shared(obj: Obj) -> list[list[str]]:
    """The groups of the module's parameter names that are one tensor in the student's process (identity there:
    ``Runner.op_shared``); the judge checks each group's names are the module's own."""
    groups = obj.trial.backend.ask({"op": "shared", "target": obj.ref})
    if not isinstance(groups, list) or not all(isinstance(g, list) and all(isinstance(k, str) for k in g)
                                               for g in groups):
        raise CheckFailed("the module's shared parameters could not be read")
    return groups
