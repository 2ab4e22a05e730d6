"""Scaled dot-product attention, the core of every chapter (chapter 01).

Shape legend: ``...`` any leading batch dimensions, ``n`` queries, ``m`` keys
and values, ``d_k`` the query/key width, ``d_v`` the value width.

The conventions follow :func:`torch.nn.functional.scaled_dot_product_attention`:
a boolean ``mask`` broadcastable to ``(..., n, m)`` where ``True`` means "may
attend". A query row with no allowed key returns a zero output row and zero
weights instead of NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["softmax", "scaled_dot_product_attention", "check_inputs", "check_mask"]


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Numerically stable softmax along ``dim`` (chapter 01).

    Subtracting the maximum before exponentiating leaves the result unchanged
    (the factor ``exp(-max)`` cancels) but keeps ``exp`` from overflowing, so
    scores of size ``1e4`` are fine. A slice that is entirely ``-inf`` (every
    key masked) gives zeros, not NaN.

    Args:
        x: scores of any shape, floating point.
        dim: the axis to normalise over.

    Returns:
        A tensor of ``x``'s shape whose slices along ``dim`` sum to 1 (or are all
        zero where every entry was ``-inf``).
    """
    if not torch.is_floating_point(x):
        raise TypeError(f"softmax expects a floating-point tensor, got dtype {x.dtype}")
    if x.shape[dim] == 0:  # nothing to normalise (no keys at all): an empty result, like the all-masked case
        return x.clone()
    x_max = x.amax(dim=dim, keepdim=True)
    x_max = torch.where(torch.isfinite(x_max), x_max, torch.zeros_like(x_max))
    e = torch.exp(x - x_max)
    total = e.sum(dim=dim, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


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
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (..., n_queries, n_keys) = {target}"
        )


def _check_tensors(query: Tensor, key: Tensor, value: Tensor) -> None:
    """The checks of :func:`check_inputs` that cost next to nothing: everything but broadcasting."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., seq, dim), got {tuple(t.shape)}")
        if not torch.is_floating_point(t):
            raise TypeError(f"{name} must be floating point, got dtype {t.dtype}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"query and key must share their last dimension d_k: query {tuple(query.shape)}, key {tuple(key.shape)}"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"key and value must have the same number of positions m: key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    if query.device != key.device or key.device != value.device:
        raise ValueError(f"query, key and value are on different devices: {query.device}, {key.device}, {value.device}")


def check_inputs(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> tuple[int, ...]:
    """Raise an error naming what was expected and what came unless the inputs fit :func:`scaled_dot_product_attention`.

    ``query`` ``(..., n, d_k)``, ``key`` ``(..., m, d_k)``, ``value`` ``(..., m, d_v)``: floating point,
    one dtype, one device, batch dimensions that broadcast; ``mask`` as in :func:`check_mask`.
    Returns the broadcast batch shape ``...``.
    """
    _check_tensors(query, key, value)
    try:
        batch_shape = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"batch dimensions do not broadcast: query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        ) from None
    if mask is not None:
        check_mask(mask, query.shape[-2], key.shape[-2], tuple(batch_shape))
    return tuple(batch_shape)


def scaled_dot_product_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, need_weights: bool = True
) -> tuple[Tensor, Tensor | None]:
    """Attention ``softmax(Q K^T / sqrt(d_k)) V`` (Vaswani et al., 2017, eq. 1), chapter 01.

    Args:
        query: ``(..., n, d_k)``.
        key: ``(..., m, d_k)``.
        value: ``(..., m, d_v)``.
        mask: optional bool tensor broadcastable to ``(..., n, m)``; True = may attend.
        need_weights: ``True`` (the default) computes the weights explicitly, as the chapters
            teach. ``False`` takes the fast path (chapter 08): the same output from torch's fused
            kernel, which never stores the ``(n, m)`` weights, and ``None`` in their place.

    Returns:
        ``(output, weights)``: output ``(..., n, d_v)``, weights ``(..., n, m)`` (``None`` when
        ``need_weights=False``). Each row of ``weights`` sums to 1, or is all zero if its mask row is all False.
    """
    if not need_weights:
        return _fused_attention(query, key, value, mask), None  # (..., n, d_v), no weights
    check_inputs(query, key, value, mask)
    return _explicit_attention(query, key, value, mask)


def _explicit_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """The textbook path of :func:`scaled_dot_product_attention`, on inputs already checked."""
    if mask is not None:
        mask = mask.to(query.device)
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (..., n, m)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores, dim=-1)  # (..., n, m)
    return weights @ value, weights  # (..., n, d_v), (..., n, m)


def _fused_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> Tensor:
    """The fast path of :func:`scaled_dot_product_attention`: torch's fused kernel, our contract (chapter 08).

    Small calls are where Python's own cost shows (on a GPU most calls are small next to the
    launch cost), so the checks here are the cheap ones; broadcasting, the costly check, is left
    to torch's kernel, which refuses what it cannot broadcast. Only then does :func:`check_inputs`
    run: it replaces torch's message by ours, and where the inputs do fit the contract (a
    broadcast that our explicit path handles and the kernel does not) the explicit path answers.
    Two inputs torch would take but read differently are checked first: a mask that is not
    bool (an additive bias for torch), and no keys at all (torch then skips its own checks).

    ``F.scaled_dot_product_attention`` reads a bool mask the same way (True = may attend) but,
    depending on the version and the kernel it picks, may give NaN for a query row with no
    allowed key. Such rows are let see every key, which keeps the kernel and its gradients
    finite, and their output is then set to zero, as the contract asks.
    """
    _check_tensors(query, key, value)
    if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool):
        check_inputs(query, key, value, mask)  # raises: the mask must be bool
    if key.shape[-2] == 0:  # no keys: every row is empty, and torch's kernel skips its checks
        check_inputs(query, key, value, mask)
        return _explicit_attention(query, key, value, mask)[0]
    try:
        if mask is None:
            return F.scaled_dot_product_attention(query, key, value)  # (..., n, d_v)
        if mask.device != query.device:
            mask = mask.to(query.device)
        has_key = mask.any(dim=-1, keepdim=True)  # (..., n, 1): does the row allow any key?
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask | ~has_key)  # (..., n, d_v)
    except torch.OutOfMemoryError:
        raise
    except Exception:  # torch raises RuntimeError, IndexError, ... for inputs its kernel refuses
        check_inputs(query, key, value, mask)  # raises, naming what was expected and what came
        return _explicit_attention(query, key, value, mask)[0]  # legal inputs the kernel refused
    if out.shape[:-2] != query.shape[:-2]:  # a broadcast batch: make sure the mask did not enlarge it
        check_inputs(query, key, value, mask)
    return out.masked_fill(~has_key, 0.0)
