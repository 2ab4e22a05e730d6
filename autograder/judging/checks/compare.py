"""Comparisons, run in the judge on the judge's tensors: a value's type, shape and dtype
(:func:`expect_tensor`, :func:`expect_pair`), its values against the expected ones (:func:`expect_close`),
the one rule that names a mistake (:func:`named_mistake`: the first known wrong answer the value equals), and
the error a bad input must raise (:func:`expect_value_error`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from autograder.judging.checks.verdicts import CheckFailed, StudentError


def named_mistake(actual: Any, mistakes: Mapping[str, Any] | Iterable[tuple[str, Any]] | None,
                  same: Callable[[Any, Any], bool]) -> str | None:
    """The message of the first of ``mistakes`` (message -> the wrong answer, or (message, wrong answer) pairs when
    two wrong answers share a message; tried in order) that ``actual`` is the ``same`` as, or None. Every check
    names mistakes this way."""
    pairs = (mistakes or {}).items() if isinstance(mistakes, Mapping) or mistakes is None else mistakes
    return next((message for message, wrong in pairs if same(actual, wrong)), None)


def fail_if_named(actual: Any, mistakes: Mapping[str, Any] | Iterable[tuple[str, Any]] | None, what: str,
                  same: Callable[[Any, Any], bool]) -> None:
    """:class:`CheckFailed` "mistake in {what}: {message}" when ``actual`` is one of ``mistakes``."""
    message = named_mistake(actual, mistakes, same)
    if message is not None:
        raise CheckFailed(f"mistake in {what}: {message}")


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
    if not torch.isfinite(value).all():
        n = int((~torch.isfinite(value)).sum())
        raise CheckFailed(f"{what} contains {n} NaN or infinite value(s)")
    return value


def expect_value_error(call: Callable[[], Any], what: str, hint: str) -> None:
    """``call()`` must raise ValueError in the student's code (not another exception, and not return)."""
    try:
        result = call()
    except StudentError as e:
        msg = str(e)
        if e.placeholder:
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
    if not isinstance(a, Tensor) or not isinstance(b, Tensor) or tuple(a.shape) != tuple(b.shape):
        return False
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return bool(torch.isfinite(a64).all()) and bool(torch.allclose(a64, b64, atol=atol, rtol=rtol))


def expect_close(actual: Tensor, expected: Tensor, what: str, mistakes: Mapping[str, Tensor] | None = None,
                 atol: float = 1e-4, rtol: float = 1e-4) -> None:
    """``actual`` must equal ``expected``; if it equals one of ``mistakes`` instead, the message names it (a
    mistake of another shape than ``expected`` is named too: a wrong shape can be a known mistake)."""
    if isinstance(actual, Tensor) and tuple(actual.shape) != tuple(expected.shape):
        fail_if_named(actual, mistakes, what, lambda a, b: close(a, b, atol, rtol))
    actual = expect_tensor(actual, tuple(expected.shape), what)
    if close(actual, expected, atol, rtol):
        return
    fail_if_named(actual, mistakes, what, lambda a, b: close(a, b, atol, rtol))
    err = (actual.to(torch.float64) - expected.to(torch.float64)).abs().max().item()
    raise CheckFailed(f"{what} does not match the expected values (largest difference {err:.3g})")


def expect_computes(actual: Any, expected: Tensor, what: str, mistakes: Mapping[str, Tensor] | None = None,
                    atol: float = 1e-4) -> None:
    """A contract check's anchor (issue 34: a part that computes nothing earns nothing): ``actual`` is the right value
    or one of the named ``mistakes`` (which the value checks charge), not a placeholder of the right shape."""
    if close(actual, expected, atol, atol) or named_mistake(actual, mistakes, lambda a, b: close(a, b, atol, atol)):
        return
    raise CheckFailed(f"{what} is not the expected value (nor a known mistake): this check of the contract is paid "
                      "only together with a value the part computes, and a placeholder of the right shape (zeros, "
                      "the identity, a copy of x) computes nothing")
