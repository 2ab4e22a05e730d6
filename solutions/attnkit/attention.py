"""Scaled dot-product attention, the core of every chapter (chapter 01).

Shape legend: ``...`` any leading batch dimensions, ``n`` queries, ``m`` keys
and values, ``d_k`` the query/key width, ``d_v`` the value width.

The conventions follow :func:`torch.nn.functional.scaled_dot_product_attention`:
a boolean ``mask`` broadcastable to ``(..., n, m)`` where ``True`` means "may
attend". A query row with no allowed key returns a zero output row and zero
weights instead of NaN. The input checks live in :mod:`attnkit.validation`; the
fused fast path, which never forms the weights, in :mod:`attnkit.efficient`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.validation import check_inputs

__all__ = ["softmax", "scaled_dot_product_attention"]


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
    if x.shape[dim] == 0:  # no keys at all: an empty result, like the all-masked case
        return x.clone()
    x_max = x.amax(dim=dim, keepdim=True)
    x_max = torch.where(torch.isfinite(x_max), x_max, torch.zeros_like(x_max))
    e = torch.exp(x - x_max)
    total = e.sum(dim=dim, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def scaled_dot_product_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Attention ``softmax(Q K^T / sqrt(d_k)) V`` (Vaswani et al., 2017, eq. 1), ch. 01.

    Args:
        query: ``(..., n, d_k)``.
        key: ``(..., m, d_k)``.
        value: ``(..., m, d_v)``.
        mask: optional bool tensor broadcastable to ``(..., n, m)``; True = may attend.

    Returns:
        ``(output, weights)``: output ``(..., n, d_v)``, weights ``(..., n, m)``.
        Each row of ``weights`` sums to 1, or is all zero if its mask row is all False.
    """
    check_inputs(query, key, value, mask)  # clear errors for wrong shapes and dtypes
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (..., n, m)
    if mask is not None:
        scores = scores.masked_fill(~mask.to(scores.device), float("-inf"))  # weight 0
    weights = softmax(scores, dim=-1)  # (..., n, m)
    return weights @ value, weights  # (..., n, d_v), (..., n, m)
