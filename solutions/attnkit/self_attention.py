"""Self-attention: one sequence gives the queries, the keys and the values (chapter 03).

Shape legend: ``B`` batch, ``n`` positions, ``E`` the embedding width, ``H`` heads.

Without positional information self-attention is permutation equivariant:
shuffling the positions of ``x`` shuffles the rows of the output the same way
(chapter 06 adds positions).
"""

from __future__ import annotations

from typing import Unpack

from torch import Tensor, nn

from attnkit.multihead import AttentionOptions, MultiHeadAttention

__all__ = ["SelfAttention"]


class SelfAttention(nn.Module):
    """Multi-head attention of a sequence to itself (chapter 03).

    ``forward(x, mask=None) -> (output, weights)``: ``x`` ``(B, n, E)``, output
    ``(B, n, E)``, weights ``(B, H, n, n)``; ``mask`` as in
    :class:`~attnkit.multihead.MultiHeadAttention` (True = may attend). The
    keyword arguments (``num_kv_heads``, ``dropout``, ``attention``) go to the
    ``MultiHeadAttention``.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True,
                 **options: Unpack[AttentionOptions]) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(embed_dim, num_heads, bias, **options)

    def forward(self, x: Tensor,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        return self.attn(x, x, x, mask)  # (B, n, E), (B, H, n, n)
