"""Masks that say which keys each query may see (chapter 04).

Shape legend: ``B`` batch, ``n`` positions. Every mask is a bool tensor where
``True`` means "may attend", the convention of
:func:`torch.nn.functional.scaled_dot_product_attention`. Combine masks with
``&``: ``causal_mask(n) & padding_mask(lengths, n)`` is ``(B, n, n)``, and
``causal_mask(n) & sliding_window_mask(n, w)`` lets query ``i`` see keys
``i - w + 1 .. i``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_mask", "padding_mask", "sliding_window_mask"]


def causal_mask(n: int, device: torch.device | str | None = None) -> Tensor:
    """``(n, n)`` bool mask, True on and below the diagonal (chapter 04).

    Position ``i`` sees ``0..i``. Used by decoders, which must not look at the
    future they are trained to predict.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"causal_mask expects a sequence length n >= 0, got {n!r}")
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()  # (n, n)


def padding_mask(lengths: Tensor | list[int], max_len: int) -> Tensor:
    """``(B, 1, max_len)`` bool mask, True at the real tokens (chapter 04).

    Example ``b`` has ``lengths[b]`` real tokens, then padding. The singleton axis
    broadcasts over the queries, so every query of example ``b`` ignores its padding
    keys. The mask lives on ``lengths``' device.
    """
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(lengths)
        lengths = lengths.long() if lengths.numel() == 0 else lengths  # [] is float
    integer = not (lengths.dtype.is_floating_point or lengths.dtype == torch.bool)
    if lengths.dim() != 1 or not integer:
        raise ValueError(f"lengths must be a 1-D integer tensor (one length per "
                         f"example), got shape {tuple(lengths.shape)} and dtype "
                         f"{lengths.dtype}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"lengths must lie in [0, max_len={max_len}], "
                         f"got {lengths.tolist()}")
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    return (positions < lengths[:, None])[:, None, :]  # (B, 1, max_len)


def sliding_window_mask(
    n: int, window: int, device: torch.device | str | None = None
) -> Tensor:
    """``(n, n)`` bool mask, True where ``|i - j| < window`` (chapters 03 and 08).

    Restricted (local) self-attention (Vaswani et al., 2017, table 1; Beltagy et
    al., 2020): each query sees itself and ``window - 1`` neighbours on either side,
    at most ``2 window - 1`` keys instead of ``n``. Combined with ``&``,
    ``causal_mask(n) & sliding_window_mask(n, window)`` lets query ``i`` see keys
    ``i - window + 1 .. i``, the causal window of Mistral 7B (Jiang et al., 2023).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"sliding_window_mask expects a length n >= 0, got {n!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"sliding_window_mask expects a window >= 1 (1: each position "
                         f"sees only itself), got {window!r}")
    positions = torch.arange(n, device=device)  # (n,)
    return (positions[:, None] - positions[None, :]).abs() < window  # (n, n)
