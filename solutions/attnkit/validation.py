"""Input checks shared by every attention function: one place, one exception type for bad shapes.

The chapters show the formulas bare; the checks live here so that a wrong input
still gets an error naming what was expected and what came. Shapes that do not
fit raise :class:`ShapeError` (a ``ValueError``), dtypes ``TypeError``, inputs on
different devices ``ValueError``. Imports nothing from the rest of the package.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ShapeError", "check_tensors", "check_mask", "check_inputs", "check_embeddings"]


class ShapeError(ValueError):
    """A tensor's shape does not fit what the function expects; the message names both."""


def check_tensors(query: Tensor, key: Tensor, value: Tensor) -> None:
    """The checks of :func:`check_inputs` that cost next to nothing: everything but broadcasting."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ShapeError(f"{name} must have shape (..., seq, dim), got {tuple(t.shape)}")
        if not torch.is_floating_point(t):
            raise TypeError(f"{name} must be floating point, got dtype {t.dtype}")
    if query.shape[-1] != key.shape[-1]:
        raise ShapeError(
            f"query and key must share their last dimension d_k: query {tuple(query.shape)}, key {tuple(key.shape)}"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ShapeError(
            f"key and value must have the same number of positions m: key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if query.device != key.device or key.device != value.device:
        raise ValueError(f"query, key and value are on different devices: {query.device}, {key.device}, {value.device}")


def check_mask(mask: Tensor, n: int, m: int, batch_shape: tuple[int, ...]) -> None:
    """Raise a clear error unless ``mask`` is a bool tensor broadcastable to ``(*batch_shape, n, m)``."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool tensor (True = may attend), got {got}")
    target = (*batch_shape, n, m)
    try:
        ok = torch.broadcast_shapes(mask.shape, target) == target  # the mask may not enlarge the batch
    except RuntimeError:
        ok = False
    if not ok:
        raise ShapeError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (..., n_queries, n_keys) = {target}"
        )


def check_inputs(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> tuple[int, ...]:
    """Raise an error naming what was expected and what came unless the inputs fit attention.

    ``query`` ``(..., n, d_k)``, ``key`` ``(..., m, d_k)``, ``value`` ``(..., m, d_v)``: floating point,
    one dtype, one device, batch dimensions that broadcast; ``mask`` as in :func:`check_mask`.
    Returns the broadcast batch shape ``...``.
    """
    check_tensors(query, key, value)
    try:
        batch_shape = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ShapeError(
            f"batch dimensions do not broadcast: query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        ) from None
    if mask is not None:
        check_mask(mask, query.shape[-2], key.shape[-2], tuple(batch_shape))
    return tuple(batch_shape)


def check_embeddings(query: Tensor, key: Tensor, value: Tensor, weight: Tensor) -> None:
    """Raise a clear error unless ``query``, ``key``, ``value`` are ``(B, seq, E)`` for a module
    whose weights ``weight`` are ``(*, E)``: one dtype and one device with them, ``key`` and
    ``value`` of one ``(B, m)``. The check of :class:`attnkit.multihead.MultiHeadAttention`."""
    embed_dim = weight.shape[-1]
    given = (("query", query),) if query is key is value else (
        ("query", query), ("key", key), ("value", value))
    for name, t in given:
        if not isinstance(t, Tensor) or t.dim() != 3 or t.shape[-1] != embed_dim:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ShapeError(f"{name} must have shape (B, seq, embed_dim={embed_dim}), got {got}")
        if t.dtype != weight.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but the module's weights are {weight.dtype}: "
                            f"call .to({t.dtype}) on the module")
        if t.device != weight.device:
            raise ValueError(f"{name} is on {t.device} but the module's weights are on {weight.device}: "
                             f"call .to({str(t.device)!r}) on the module")
    if key is not value and key.shape[:2] != value.shape[:2]:
        raise ShapeError(f"key and value must have the same (B, m): key {tuple(key.shape)}, "
                         f"value {tuple(value.shape)}")
