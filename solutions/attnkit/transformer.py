"""The Transformer: attention, feed-forward, residuals and layer norms (chapter 07).

Shape legend: ``B`` batch, ``n`` target (decoder) positions, ``m`` source (encoder)
positions, ``E`` the model width ``embed_dim``, ``F`` the feed-forward width
``ff_dim``, ``H`` heads, ``V`` a vocabulary size.

Each block wraps every sublayer in a residual connection and a layer norm
(Vaswani et al., 2017, section 3.1). Post-norm (the paper, ``norm_first=False``):
``x = norm(x + sublayer(x))``. Pre-norm (``norm_first=True``; used by GPT-2, Radford
et al., 2019, and analysed by Xiong et al., 2020): ``x = x + sublayer(norm(x))``. Both
match ``torch.nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer``
(``batch_first=True``, relu) with the same weights
(:mod:`attnkit.torch_twins` makes those twins).

The blocks are built from chapter 03's :class:`~attnkit.self_attention.SelfAttention`
(``self_attn``) and chapter 05's :class:`~attnkit.cross_attention.CrossAttention`
(``cross_attn``), so their projections are ``self_attn.attn.q_proj`` and so on.
The encoder's output, which the decoder reads, is called ``memory`` throughout.
Masks are bool with True = may attend, as everywhere in the course (torch's
layers use the opposite). Blocks keep no state between calls: the encoder block
returns ``(output, weights)``, the decoder block ``(output, self_weights,
cross_weights)``. The attention function is a constructor argument passed down to
every attention layer (``attention=fused_attention`` runs chapter 08's fast path;
its weights are ``None``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnkit.attention import scaled_dot_product_attention
from attnkit.cross_attention import CrossAttention
from attnkit.masks import causal_mask
from attnkit.multihead import AttentionFn
from attnkit.positional import SinusoidalPositionalEncoding
from attnkit.self_attention import SelfAttention

__all__ = ["FeedForward", "TransformerEncoderBlock", "TransformerDecoderBlock",
           "Transformer"]

Weights = Tensor | None  # None from an attention function that never forms them


class _Dropout(nn.Dropout):
    """``nn.Dropout`` that hands its input back without calling into torch where it drops
    nothing (eval mode, or ``p = 0``). Where small calls cost their Python (on a GPU most do),
    an encoder block in eval mode spends three calls fewer (``attnkit.bench``, chapter 08)."""

    def forward(self, input: Tensor) -> Tensor:
        return super().forward(input) if self.training and self.p > 0 else input


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``linear2(relu(linear1(x)))`` (chapter 07).

    ``(..., E) -> (..., F) -> (..., E)`` with ``F = ff_dim``: the same two-layer
    network applied to every position on its own (Vaswani et al., 2017, eq. 2). The
    ReLU between the layers makes the block non-linear; without it the two layers
    would collapse into one matrix.
    """

    def __init__(self, embed_dim: int, ff_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(embed_dim, ff_dim)
        self.linear2 = nn.Linear(ff_dim, embed_dim)
        self.dropout = _Dropout(dropout)  # nn.Dropout, free where it drops nothing

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))  # (..., E)


class _ResidualBlock(nn.Module):
    """What both blocks are made of (chapter 07): ``self_attn``, ``cross_attn`` (the
    decoder's only), ``feed_forward``, and per sublayer ``i`` a layer norm ``norm{i}``
    and a dropout ``dropout{i}`` on its output. Their forward passes differ."""

    def __init__(self, embed_dim: int, num_heads: int, ff_dim: int, dropout: float,
                 norm_first: bool, attention: AttentionFn, *, cross: bool) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = SelfAttention(embed_dim, num_heads, dropout=dropout,
                                       attention=attention)
        if cross:
            self.cross_attn = CrossAttention(embed_dim, num_heads, dropout=dropout,
                                             attention=attention)
        self.feed_forward = FeedForward(embed_dim, ff_dim, dropout)
        self.norm1, self.dropout1 = nn.LayerNorm(embed_dim), _Dropout(dropout)
        self.norm2, self.dropout2 = nn.LayerNorm(embed_dim), _Dropout(dropout)
        if cross:
            self.norm3, self.dropout3 = nn.LayerNorm(embed_dim), _Dropout(dropout)


class TransformerEncoderBlock(_ResidualBlock):
    """Self-attention, then a feed-forward network, each with residual and norm (07).

    ``forward(x, mask=None) -> (output, weights)``: ``x`` and ``output``
    ``(B, n, E)``, the self-attention weights ``(B, H, n, n)``. ``mask`` (True = may
    attend) broadcasts to ``(B, n, n)``, for example ``padding_mask(lengths, n)``.
    ``dropout`` applies to the attention weights, to each sublayer's output and
    inside the feed-forward network, as in ``nn.TransformerEncoderLayer``.
    """

    def __init__(self, embed_dim: int, num_heads: int, ff_dim: int,
                 dropout: float = 0.0, norm_first: bool = False, *,
                 attention: AttentionFn = scaled_dot_product_attention) -> None:
        super().__init__(embed_dim, num_heads, ff_dim, dropout, norm_first, attention,
                         cross=False)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Weights]:
        if self.norm_first:
            out, weights = self.self_attn(self.norm1(x), mask)  # (B, H, n, n) weights
            x = x + self.dropout1(out)
            x = x + self.dropout2(self.feed_forward(self.norm2(x)))
        else:
            out, weights = self.self_attn(x, mask)  # (B, H, n, n) weights
            x = self.norm1(x + self.dropout1(out))
            x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x, weights  # (B, n, E), (B, H, n, n)


class TransformerDecoderBlock(_ResidualBlock):
    """Masked self-attention, cross-attention to ``memory``, feed-forward (chapter 07).

    ``forward(x, memory, self_mask=None, memory_mask=None)`` returns ``(output,
    self_weights, cross_weights)``: ``x`` and ``output`` ``(B, n, E)``, ``memory``
    (the encoder's output) ``(B, m, E)``, ``self_weights`` ``(B, H, n, n)``,
    ``cross_weights`` ``(B, H, n, m)``. ``self_mask`` broadcasts to ``(B, n, n)``
    (usually ``causal_mask(n)``), ``memory_mask`` to ``(B, n, m)`` (usually the
    source's padding mask ``(B, 1, m)``). ``cross_attn`` takes its queries from
    ``x``, its keys and values from ``memory`` (chapter 05).
    """

    def __init__(self, embed_dim: int, num_heads: int, ff_dim: int,
                 dropout: float = 0.0, norm_first: bool = False, *,
                 attention: AttentionFn = scaled_dot_product_attention) -> None:
        super().__init__(embed_dim, num_heads, ff_dim, dropout, norm_first, attention,
                         cross=True)

    def forward(self, x: Tensor, memory: Tensor, self_mask: Tensor | None = None,
                memory_mask: Tensor | None = None) -> tuple[Tensor, Weights, Weights]:
        if memory_mask is not None and memory_mask.dim() == 2:
            memory_mask = memory_mask.unsqueeze(0)  # (1, n, m): one (n, m) mask for all
        if self.norm_first:
            out, self_weights = self.self_attn(self.norm1(x), self_mask)  # (B, H, n, n)
            x = x + self.dropout1(out)
            out, cross_weights = self.cross_attn(self.norm2(x), memory, memory_mask)
            x = x + self.dropout2(out)  # cross_weights (B, H, n, m)
            x = x + self.dropout3(self.feed_forward(self.norm3(x)))
        else:
            out, self_weights = self.self_attn(x, self_mask)  # (B, H, n, n)
            x = self.norm1(x + self.dropout1(out))
            out, cross_weights = self.cross_attn(x, memory, memory_mask)  # (B, H, n, m)
            x = self.norm2(x + self.dropout2(out))
            x = self.norm3(x + self.dropout3(self.feed_forward(x)))
        return x, self_weights, cross_weights  # (B, n, E), (B, H, n, n), (B, H, n, m)


class Transformer(nn.Module):
    """A small encoder-decoder Transformer for sequence-to-sequence tasks (chapter 07).

    Token embeddings (scaled by ``sqrt(E)``) plus the sinusoidal positional encoding
    (chapter 06), ``num_layers`` encoder blocks, ``num_layers`` decoder blocks and a
    linear read-out to target-token logits. With ``norm_first=True`` each stack ends
    with a layer norm, as pre-norm models need.

    ``src_mask`` (optional, True = a real source token) is ``(B, 1, m)``, e.g.
    ``padding_mask(lengths, m)``; it hides source padding from the encoder's
    self-attention and from the decoder's cross-attention.
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, embed_dim: int = 64,
                 num_heads: int = 4, ff_dim: int = 128, num_layers: int = 2,
                 dropout: float = 0.0, norm_first: bool = False,
                 max_len: int = 256) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.src_embed = nn.Embedding(src_vocab, embed_dim)
        self.tgt_embed = nn.Embedding(tgt_vocab, embed_dim)
        self.positions = SinusoidalPositionalEncoding(max_len, embed_dim)
        block = (embed_dim, num_heads, ff_dim, dropout, norm_first)
        layers = range(num_layers)
        self.encoder = nn.ModuleList(TransformerEncoderBlock(*block) for _ in layers)
        self.decoder = nn.ModuleList(TransformerDecoderBlock(*block) for _ in layers)
        self.encoder_norm = nn.LayerNorm(embed_dim) if norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(embed_dim) if norm_first else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.readout = nn.Linear(embed_dim, tgt_vocab)

    def _embed(self, embedding: nn.Embedding, tokens: Tensor) -> Tensor:
        x = embedding(tokens) * math.sqrt(self.embed_dim)  # (B, len, E)
        return self.dropout(self.positions(x))  # (B, len, E)

    def encode(self, src: Tensor,
               src_mask: Tensor | None = None) -> tuple[Tensor, list[Weights]]:
        """``src`` ``(B, m)`` -> memory ``(B, m, E)``, and each encoder block's
        weights ``(B, H, m, m)``."""
        x = self._embed(self.src_embed, src)  # (B, m, E)
        weights = []
        for block in self.encoder:
            x, w = block(x, src_mask)
            weights.append(w)
        return self.encoder_norm(x), weights

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None
               ) -> tuple[Tensor, list[Weights], list[Weights]]:
        """``tgt`` ``(B, n)`` -> logits ``(B, n, V)``, each block's self, cross weights.

        Self weights ``(B, H, n, n)``, cross weights ``(B, H, n, m)``. Position ``i``
        sees target positions ``0..i`` only (a causal mask), so the logits at ``i``
        predict token ``i + 1`` and training needs one pass per batch (teacher forcing).
        """
        x = self._embed(self.tgt_embed, tgt)  # (B, n, E)
        self_mask = causal_mask(tgt.shape[1], device=tgt.device)  # (n, n)
        self_weights, cross_weights = [], []
        for block in self.decoder:
            x, ws, wc = block(x, memory, self_mask, src_mask)
            self_weights.append(ws)
            cross_weights.append(wc)
        logits = self.readout(self.decoder_norm(x))  # (B, n, V)
        return logits, self_weights, cross_weights

    def forward(self, src: Tensor, tgt: Tensor,
                src_mask: Tensor | None = None) -> tuple[Tensor, list[Weights]]:
        """Teacher-forced logits ``(B, n, V)`` for target inputs ``tgt`` ``(B, n)``, and
        each decoder block's cross weights ``(B, H, n, m)`` (the alignment)."""
        memory, _ = self.encode(src, src_mask)
        logits, _, cross_weights = self.decode(tgt, memory, src_mask)
        return logits, cross_weights

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, bos_id: int, steps: int,
                      src_mask: Tensor | None = None) -> Tensor:
        """``steps`` tokens ``(B, steps)`` for ``src`` ``(B, m)``, each the arg max.

        The source is encoded once; the decoder runs once per step on the tokens
        generated so far, starting from ``bos_id`` (not part of the result).
        """
        memory, _ = self.encode(src, src_mask)  # (B, m, E)
        out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long,
                         device=src.device)  # (B, 1)
        for _ in range(steps):
            logits, _, _ = self.decode(out, memory, src_mask)  # (B, t, V)
            next_token = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            out = torch.cat([out, next_token], dim=1)  # (B, t + 1)
        return out[:, 1:]  # (B, steps)
