"""Cross-attention: one sequence asks, another answers (chapter 05).

Shape legend: ``B`` batch, ``n`` positions of ``x`` (the queries), ``m`` positions of
``context`` (the keys and values), ``E`` the embedding width, ``H`` heads.

Self-attention takes queries, keys and values from one sequence. Cross-attention
takes the queries from ``x`` and the keys and values from a second sequence,
``context``: the decoder reading the encoder's output in a translation model
(Vaswani et al., 2017, section 3.2.3), text reading image patches, and so on.
``n`` and ``m`` are unrelated, and so is the output's length (``n``) to the context's.
"""

from __future__ import annotations

from typing import Unpack

from torch import Tensor, nn

from attnkit.multihead import AttentionOptions, MultiHeadAttention
from attnkit.validation import ShapeError

__all__ = ["CrossAttention", "context_padding_mask"]


def context_padding_mask(context_mask: Tensor, n: int) -> Tensor:
    """A per-context-token mask made to broadcast over the ``n`` queries (chapter 05).

    ``context_mask`` ``(B, m)`` (True = a real context token) becomes ``(B, 1, m)``:
    every query of example ``b`` may attend to the same real tokens. A 3-D mask
    (``(B, 1, m)`` from :func:`attnkit.masks.padding_mask`, or a full ``(B, n, m)``)
    is returned unchanged. The padding lies along the *keys* axis; a ``(B, m, 1)``
    mask would mask queries instead.
    """
    if context_mask.dim() == 2:
        return context_mask[:, None, :]  # (B, 1, m)
    if context_mask.dim() == 3 and context_mask.shape[1] in (1, n):
        return context_mask  # (B, 1 or n, m)
    raise ShapeError(f"context_mask must be (B, m), (B, 1, m) or (B, n={n}, m), "
                     f"got shape {tuple(context_mask.shape)}")


class CrossAttention(nn.Module):
    """Multi-head attention from ``x`` to ``context`` (chapter 05).

    ``forward(x, context, context_mask=None) -> (output, weights)``: ``x``
    ``(B, n, E)`` gives the queries, ``context`` ``(B, m, E)`` the keys and the
    values. Output ``(B, n, E)``, one row per position of ``x``; weights
    ``(B, H, n, m)``, each row a distribution over the context. ``context_mask``
    (bool, True = may attend) is ``(B, m)`` (which context tokens are real) or a
    3-D mask broadcastable to ``(B, n, m)``. The keyword arguments
    (``num_kv_heads``, ``dropout``, ``attention``) go to the ``MultiHeadAttention``.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True,
                 **options: Unpack[AttentionOptions]) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(embed_dim, num_heads, bias, **options)

    def forward(self, x: Tensor, context: Tensor,
                context_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if x.dim() != 3 or context.dim() != 3 or x.shape[0] != context.shape[0]:
            raise ShapeError(f"x must be (B, n, E) and context (B, m, E) with the same "
                             f"B, got x {tuple(x.shape)} and context "
                             f"{tuple(context.shape)}")
        mask = None
        if context_mask is not None:
            mask = context_padding_mask(context_mask, x.shape[1])  # (B, 1 or n, m)
        return self.attn(x, context, context, mask)  # (B, n, E), (B, H, n, m)
