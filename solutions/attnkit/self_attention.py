"""Self-attention: one sequence gives the queries, the keys and the values (chapter 03).

Shape legend: ``B`` batch, ``n`` positions, ``E`` the embedding width, ``H`` heads.

Without positional information self-attention is permutation equivariant:
shuffling the positions of ``x`` shuffles the rows of the output the same way
(chapter 06 adds positions).
"""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.attention import scaled_dot_product_attention
from attnkit.multihead import AttentionFn, MultiHeadAttention

__all__ = ["SelfAttention"]


class SelfAttention(nn.Module):
    """Multi-head attention of a sequence to itself (chapter 03).

    ``forward(x, mask=None) -> (output, weights)``: ``x`` ``(B, n, E)``, output
    ``(B, n, E)``, weights ``(B, H, n, n)``; ``mask`` as in
    :class:`~attnkit.multihead.MultiHeadAttention` (True = may attend). The
    keyword arguments go to the ``MultiHeadAttention``.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, *,
                 num_kv_heads: int | None = None, dropout: float = 0.0,
                 attention: AttentionFn = scaled_dot_product_attention) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(embed_dim, num_heads, bias,
                                       num_kv_heads=num_kv_heads, dropout=dropout,
                                       attention=attention)

    def forward(self, x: Tensor,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        return self.attn(x, x, x, mask)  # (B, n, E), (B, H, n, n)
