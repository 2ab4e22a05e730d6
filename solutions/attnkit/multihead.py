"""Multi-head attention: several learned perspectives on the same sequence (chapter 02).

Shape legend: ``B`` batch, ``n`` queries, ``m`` keys and values, ``E`` the
embedding width ``embed_dim``, ``H`` heads, ``Dh = E // H`` the width of one head.

Each head projects queries, keys and values with its own slice of one wide
``E x E`` projection, attends with :func:`attnkit.attention.scaled_dot_product_attention`,
and the heads' outputs are concatenated and mixed by ``out_proj``
(Vaswani et al., 2017, section 3.2.2).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.attention import scaled_dot_product_attention

__all__ = ["split_heads", "merge_heads", "MultiHeadAttention"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """Cut the last axis into ``num_heads`` heads and move the head axis forward (chapter 02).

    ``(B, n, H * Dh) -> (B, H, n, Dh)``: head ``h`` gets features ``h * Dh`` to
    ``(h + 1) * Dh - 1``. Any leading dimensions work: ``(..., n, H * Dh) -> (..., H, n, Dh)``.
    """
    if not isinstance(x, Tensor) or x.dim() < 2:
        raise ValueError(f"split_heads expects a tensor of shape (..., n, num_heads * head_dim), got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    if num_heads < 1 or x.shape[-1] % num_heads:
        raise ValueError(f"the last dimension {x.shape[-1]} of {tuple(x.shape)} is not divisible by num_heads={num_heads}")
    return x.unflatten(-1, (num_heads, -1)).transpose(-3, -2)  # (..., n, H, Dh) -> (..., H, n, Dh)


def merge_heads(x: Tensor) -> Tensor:
    """The inverse of :func:`split_heads`: ``(B, H, n, Dh) -> (B, n, H * Dh)``, heads concatenated (chapter 02)."""
    if not isinstance(x, Tensor) or x.dim() < 3:
        raise ValueError(f"merge_heads expects a tensor of shape (..., num_heads, n, head_dim), got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    return x.transpose(-3, -2).flatten(-2)  # (..., n, H, Dh) -> (..., n, H * Dh)


class MultiHeadAttention(nn.Module):
    """``num_heads`` attention heads in parallel, concatenated and projected (chapter 02).

    ``forward(query, key, value, mask=None) -> (output, weights)`` with query
    ``(B, n, E)``, key and value ``(B, m, E)``, output ``(B, n, E)`` and the
    per-head weights ``(B, H, n, m)``. A bool ``mask`` (True = may attend)
    broadcastable to ``(B, n, m)`` applies to every head; a 4-D mask is
    ``(B, H, n, m)``, one per head. The module follows its inputs' device once
    moved there with ``.to(...)``. ``need_weights=False`` returns ``(output, None)``
    from torch's fused attention kernel (the fast path, chapter 08).
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True) -> None:
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads} "
                             f"(each head gets embed_dim // num_heads features)")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def _check(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        w = self.q_proj.weight
        given = (("query", query),) if query is key is value else (("query", query), ("key", key), ("value", value))
        for name, t in given:
            if not isinstance(t, Tensor) or t.dim() != 3 or t.shape[-1] != self.embed_dim:
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name} must have shape (B, seq, embed_dim={self.embed_dim}), got {got}")
            if t.dtype != w.dtype:
                raise TypeError(f"{name} has dtype {t.dtype} but the module's weights are {w.dtype}: "
                                f"call .to({t.dtype}) on the module")
            if t.device != w.device:
                raise ValueError(f"{name} is on {t.device} but the module's weights are on {w.device}: "
                                 f"call .to({str(t.device)!r}) on the module")
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key and value must have the same (B, m): key {tuple(key.shape)}, value {tuple(value.shape)}")

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None,
                need_weights: bool = True) -> tuple[Tensor, Tensor | None]:
        # need_weights=False: the fused fast path of scaled_dot_product_attention (chapter 08), weights None
        self._check(query, key, value)
        q = split_heads(self.q_proj(query), self.num_heads)  # (B, H, n, Dh)
        k = split_heads(self.k_proj(key), self.num_heads)  # (B, H, m, Dh)
        v = split_heads(self.v_proj(value), self.num_heads)  # (B, H, m, Dh)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, 1, n, m): the same mask for every head
        out, weights = scaled_dot_product_attention(q, k, v, mask, need_weights)  # (B, H, n, Dh), (B, H, n, m)
        return self.out_proj(merge_heads(out)), weights  # (B, n, E), (B, H, n, m)
