"""Positional information for attention, which on its own cannot see order (chapter 06).

Shape legend: ``n`` positions, ``d`` the model width (even), ``j`` a frequency index
``0 <= j < d / 2``, ``...`` any leading batch dimensions.

* :func:`sinusoidal_positional_encoding`: the fixed table of Vaswani et al. (2017,
  section 3.5), ``P[i, 2j] = sin(i w_j)``, ``P[i, 2j + 1] = cos(i w_j)`` with
  ``w_j = 10000^(-2j / d)``.
* :func:`position_shift_matrix`: the block-diagonal rotation ``M`` with
  ``P[i + delta] = P[i] @ M`` for every ``i``: a shift in position is one fixed
  linear map.
* :class:`SinusoidalPositionalEncoding`: adds the fixed table to a batch of embeddings.
* :class:`LearnedPositionalEmbedding`: one learned row per position, up to ``max_len``.
* :func:`apply_rotary_embedding`: rotary position embedding, RoPE (Su et al., 2021):
  rotates queries and keys so their dot product depends on the relative position only.
* :func:`alibi_slopes`, :func:`alibi_bias`, :func:`alibi_attention`: ALiBi (Press et
  al., 2022): no position vectors at all; each head adds ``-slope * |i - j|`` to its
  attention scores.

Both positional modules take ``(max_len, dim)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnkit.attention import softmax
from attnkit.validation import ShapeError, check_inputs

__all__ = [
    "sinusoidal_frequencies",
    "sinusoidal_positional_encoding",
    "position_shift_matrix",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "apply_rotary_embedding",
    "alibi_slopes",
    "alibi_bias",
    "alibi_attention",
]

Device = torch.device | str | None


def _check_dim(dim: int, what: str) -> None:
    if not isinstance(dim, int) or dim <= 0 or dim % 2:
        raise ValueError(f"{what} needs an even, positive dim (sin and cos fill the "
                         f"columns in pairs), got dim={dim!r}")


def sinusoidal_frequencies(dim: int, device: Device = None,
                           dtype: torch.dtype = torch.float64) -> Tensor:
    """The frequencies ``w_j = 10000^(-2j / dim)``, ``j < dim / 2``: ``(dim // 2,)``.

    Chapter 06. Column pair ``j`` turns by ``w_j`` radians per position: ``w_0 = 1``
    (fastest), then ever slower, down to ``10000^(-(dim - 2) / dim)``, a period of
    almost ``2 pi * 10000`` positions.
    """
    _check_dim(dim, "sinusoidal_frequencies")
    two_j = torch.arange(0, dim, 2, device=device, dtype=torch.float64)  # (d/2,)
    return torch.pow(10000.0, -two_j / dim).to(dtype)


def sinusoidal_positional_encoding(num_positions: int, dim: int, *,
                                   device: Device = None,
                                   dtype: torch.dtype = torch.float32) -> Tensor:
    """The sinusoidal table ``P``: ``(num_positions, dim)``, chapter 06.

    ``P[i, 2j] = sin(i w_j)`` and ``P[i, 2j + 1] = cos(i w_j)`` with
    ``w_j = 10000^(-2j / dim)`` (Vaswani et al., 2017). The angles are computed in
    float64 and rounded once to ``dtype``, so large positions stay accurate.

    Raises:
        ValueError: if ``dim`` is odd (the columns come in sin/cos pairs) or
            ``num_positions`` is negative.
    """
    _check_dim(dim, "sinusoidal_positional_encoding")
    if not isinstance(num_positions, int) or num_positions < 0:
        raise ValueError(f"num_positions must be a non-negative int, "
                         f"got {num_positions!r}")
    i = torch.arange(num_positions, device=device, dtype=torch.float64)  # (n,)
    angles = i[:, None] * sinusoidal_frequencies(dim, device=device)  # (n, d/2)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (n, d/2, 2)
    return table.reshape(num_positions, dim).to(dtype)  # (n, d): sin, cos, sin, ...


def position_shift_matrix(delta: int | float, dim: int, *, device: Device = None,
                          dtype: torch.dtype = torch.float32) -> Tensor:
    """``M`` ``(dim, dim)`` with ``P[i + delta] = P[i] @ M`` for every ``i`` (ch. 06).

    Column pair ``j`` of ``P[i]`` is ``(sin a, cos a)`` with ``a = i w_j``; shifting
    by ``delta`` adds ``b = delta w_j`` to the angle, and the addition formulas give,
    for row vectors, ``(sin(a + b), cos(a + b)) = (sin a, cos a) @ [[cos b, -sin b],
    [sin b, cos b]]``. ``M`` is block diagonal with that 2x2 rotation in block ``j``;
    it does not depend on ``i``. ``M.T`` is the inverse: it shifts by ``-delta``.
    """
    _check_dim(dim, "position_shift_matrix")
    b = delta * sinusoidal_frequencies(dim, device=device)  # (d/2,)
    cos, sin = b.cos(), b.sin()
    rows = [torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)]  # (d/2, 2) each
    blocks = torch.stack(rows, -2)  # (d/2, 2, 2)
    return torch.block_diag(*blocks).to(dtype)  # (d, d)


def _check_positions(x: Tensor, dim: int, max_len: int, who: str) -> int:
    if not isinstance(x, Tensor) or x.dim() < 2 or x.shape[-1] != dim:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ShapeError(f"{who} expects x of shape (..., n, {dim}), got {got}")
    n = x.shape[-2]
    if n > max_len:
        raise ShapeError(f"{who} was built for at most max_len={max_len} positions, "
                         f"got a sequence of length {n}")
    return n


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal table to embeddings ``x`` ``(..., n, dim)`` (chapter 06).

    The table for ``max_len`` positions is a non-persistent buffer: it follows
    ``.to(device)`` but is not saved in the ``state_dict`` (a formula, not a weight).
    """

    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        self.max_len, self.dim = max_len, dim
        table = sinusoidal_positional_encoding(max_len, dim)  # (max_len, d)
        self.register_buffer("table", table, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        n = _check_positions(x, self.dim, self.max_len, type(self).__name__)
        return x + self.table[:n].to(dtype=x.dtype)  # (..., n, d)


class LearnedPositionalEmbedding(nn.Module):
    """One learned vector per position, added to ``x`` ``(..., n, dim)`` (chapter 06).

    ``embedding.weight`` ``(max_len, dim)`` is trained with the rest of the model (as
    in BERT and GPT-2). Unlike a formula it has no row for positions ``>= max_len``:
    longer inputs raise.
    """

    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        self.max_len, self.dim = max_len, dim
        self.embedding = nn.Embedding(max_len, dim)

    def forward(self, x: Tensor) -> Tensor:
        n = _check_positions(x, self.dim, self.max_len, type(self).__name__)
        positions = torch.arange(n, device=x.device)  # (n,)
        return x + self.embedding(positions).to(dtype=x.dtype)  # (..., n, d)


def apply_rotary_embedding(x: Tensor, positions: Tensor | None = None,
                           base: float = 10000.0) -> Tensor:
    """Rotary position embedding, RoPE (Su et al., 2021), chapter 06.

    Rotates each column pair ``(x[..., 2j], x[..., 2j + 1])`` of the vector at
    position ``p`` by the angle ``p w_j``, ``w_j = base^(-2j / d)``. Applied to
    queries and keys (not values), it makes ``rope(q, p) . rope(k, r)`` depend on
    ``q``, ``k`` and ``p - r`` only, because rotations compose:
    ``R(p)^T R(r) = R(r - p)``.

    Args:
        x: ``(..., n, d)`` with ``d`` even.
        positions: ``(n,)`` positions of the rows (default ``0 .. n-1``), any numbers.
        base: the frequency base, 10000 as in the sinusoidal table.

    Returns:
        The rotated tensor, shape, dtype and device of ``x``.
    """
    if not isinstance(x, Tensor) or x.dim() < 2 or not torch.is_floating_point(x):
        raise TypeError("apply_rotary_embedding expects a floating-point tensor of "
                        "shape (..., n, d)")
    n, d = x.shape[-2], x.shape[-1]
    _check_dim(d, "apply_rotary_embedding")
    if positions is None:
        positions = torch.arange(n, device=x.device)
    if positions.shape != (n,):
        raise ShapeError(f"positions must have shape (n,) = ({n},), "
                         f"got {tuple(positions.shape)}")
    two_j = torch.arange(0, d, 2, device=x.device, dtype=torch.float64)  # (d/2,)
    w = torch.pow(base, -two_j / d)  # (d/2,)
    angles = positions.to(device=x.device, dtype=torch.float64)[:, None] * w  # (n, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., n, d/2) each
    pairs = [x_even * cos - x_odd * sin, x_even * sin + x_odd * cos]
    rotated = torch.stack(pairs, dim=-1)  # (..., n, d/2, 2)
    return rotated.flatten(-2)  # (..., n, d)


def alibi_slopes(num_heads: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> Tensor:
    """ALiBi's slope per head, shape ``(num_heads,)`` (Press et al., 2022), chapter 06.

    For ``H`` a power of two: the geometric sequence ``2^(-8 h / H)``, ``h = 1 .. H``
    (``1/2, 1/4, ..., 1/256`` for 8 heads). Otherwise the paper's rule: the slopes of
    the nearest smaller power of two, then every other slope of the next one.
    Steep heads look near, shallow ones far.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"alibi_slopes needs num_heads >= 1, got {num_heads!r}")

    def powers(h: int) -> list[float]:  # the geometric sequence for h a power of two
        return [2.0 ** (-8.0 * (k + 1) / h) for k in range(h)]

    below = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = powers(below) + powers(2 * below)[0::2][:num_heads - below]
    return torch.tensor(slopes, device=device, dtype=dtype)  # (H,)


def alibi_bias(slopes: Tensor, n: int, m: int | None = None) -> Tensor:
    """ALiBi's bias ``-slope_h * |j - i|``, head ``h``, query ``i``, key ``j``.

    Shape ``(H, n, m)``, chapter 06. The queries are the last ``n`` of ``m``
    positions (``m = n`` by default; ``m > n`` when decoding after a cache). The bias
    depends on the distance ``j - i`` only: relative positions, with nothing added
    to the tokens.
    The paper's models are causal (``j <= i``, bias ``slope * (j - i)``); the
    absolute value extends the bias to attention in both directions.
    """
    if slopes.dim() != 1:
        raise ShapeError(f"slopes must be (H,), one per head, got "
                         f"{tuple(slopes.shape)}")
    m = n if m is None else m
    i = torch.arange(m - n, m, device=slopes.device, dtype=slopes.dtype)  # (n,) queries
    j = torch.arange(m, device=slopes.device, dtype=slopes.dtype)  # (m,) keys
    return -slopes[:, None, None] * (j[None, :] - i[:, None]).abs()  # (H, n, m)


def alibi_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, *,
    slopes: Tensor,
) -> tuple[Tensor, Tensor]:
    """``softmax(Q K^T / sqrt(d_k) + bias) V`` with ALiBi's bias (chapter 06).

    Chapter 01's attention with one change: :func:`alibi_bias` is added to the
    scores. ``query`` ``(..., H, n, d_k)``, ``key`` ``(..., H, m, d_k)``, ``value``
    ``(..., H, m, d_v)``, ``slopes`` ``(H,)``; ``mask`` bool, True = may attend.
    Returns ``(output, weights)`` like every attention function, so
    ``attention=partial(alibi_attention, slopes=alibi_slopes(H))`` makes a
    :class:`~attnkit.multihead.MultiHeadAttention` use ALiBi.
    """
    check_inputs(query, key, value, mask)
    if query.dim() < 3 or slopes.shape != (query.shape[-3],):
        raise ShapeError(f"alibi_attention needs one slope per head: query "
                         f"{tuple(query.shape)} is (..., H, n, d_k), slopes "
                         f"{tuple(slopes.shape)}")
    slopes = slopes.to(device=query.device, dtype=query.dtype)
    bias = alibi_bias(slopes, query.shape[-2], key.shape[-2])  # (H, n, m)
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (.., H, n, m)
    scores = scores + bias  # the only change to chapter 01's formula
    if mask is not None:
        scores = scores.masked_fill(~mask.to(scores.device), float("-inf"))
    weights = softmax(scores, dim=-1)  # (..., H, n, m)
    return weights @ value, weights  # (..., H, n, d_v), (..., H, n, m)
