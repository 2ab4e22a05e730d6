"""torch's own layers holding attnkit's weights: the oracles of the tests, the checks and the benchmark.

``to_torch_multihead(mha)`` returns an ``nn.MultiheadAttention`` (``batch_first=True``) that
computes what ``mha`` computes; ``to_torch_encoder_layer`` and ``to_torch_decoder_layer`` do the
same for the blocks of chapter 07 (relu, ``batch_first=True``). The twins are new modules, on the
device and dtype of the original, with copies of its weights (changing one does not change the
other). Two things differ by design and are the caller's to remember:

* masks: torch's layers read a bool mask the other way round (True = may *not* attend), so pass
  ``~mask`` (``attn_mask`` / ``key_padding_mask``);
* weights: ``nn.MultiheadAttention`` averages them over the heads unless called with
  ``average_attn_weights=False``.

Imports :mod:`attnkit.multihead` and :mod:`attnkit.transformer`, the modules it mirrors; nothing in
the package imports it.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from attnkit.multihead import MultiHeadAttention
from attnkit.transformer import TransformerDecoderBlock, TransformerEncoderBlock

__all__ = ["to_torch_multihead", "to_torch_encoder_layer", "to_torch_decoder_layer"]

Layer = TypeVar("Layer", nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


@torch.no_grad()
def _copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))  # (3E, E)
    if ours.q_proj.bias is not None:
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))  # (3E,)
    theirs.out_proj.load_state_dict(ours.out_proj.state_dict())


def to_torch_multihead(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention`` (``batch_first=True``) with ``mha``'s weights and attention dropout.

    torch packs the three input projections into one ``in_proj_weight`` ``(3E, E)``: queries, then
    keys, then values. Grouped-query attention has no twin there (torch's module has one key-value
    head per query head) and raises ``ValueError``.
    """
    if mha.num_kv_heads != mha.num_heads:
        raise ValueError(f"nn.MultiheadAttention has no grouped-query form: this module has num_heads="
                         f"{mha.num_heads} but num_kv_heads={mha.num_kv_heads}")
    w = mha.q_proj.weight
    theirs = nn.MultiheadAttention(mha.embed_dim, mha.num_heads, dropout=mha.dropout,
                                   bias=mha.q_proj.bias is not None, batch_first=True,
                                   device=w.device, dtype=w.dtype)
    _copy_attention(mha, theirs)
    return theirs.train(mha.training)


def _twin_block(block: TransformerEncoderBlock | TransformerDecoderBlock,
                layer: type[Layer]) -> Layer:
    """A ``layer`` with ``block``'s settings, self-attention, feed-forward and norm weights."""
    attn, w = block.self_attn.attn, block.norm1.weight
    theirs = layer(attn.embed_dim, attn.num_heads, block.feed_forward.linear1.out_features,
                   dropout=block.dropout1.p, batch_first=True, norm_first=block.norm_first,
                   device=w.device, dtype=w.dtype)
    _copy_attention(attn, theirs.self_attn)
    with torch.no_grad():
        theirs.linear1.load_state_dict(block.feed_forward.linear1.state_dict())
        theirs.linear2.load_state_dict(block.feed_forward.linear2.state_dict())
        for name in ("norm1", "norm2", "norm3"):
            if hasattr(theirs, name):  # the decoder layer has a third, for cross-attention
                getattr(theirs, name).load_state_dict(getattr(block, name).state_dict())
    return theirs.train(block.training)


def to_torch_encoder_layer(block: TransformerEncoderBlock) -> nn.TransformerEncoderLayer:
    """An ``nn.TransformerEncoderLayer`` (relu, ``batch_first=True``) with ``block``'s weights and settings."""
    return _twin_block(block, nn.TransformerEncoderLayer)


def to_torch_decoder_layer(block: TransformerDecoderBlock) -> nn.TransformerDecoderLayer:
    """An ``nn.TransformerDecoderLayer`` (relu, ``batch_first=True``) with ``block``'s weights and settings."""
    theirs = _twin_block(block, nn.TransformerDecoderLayer)
    _copy_attention(block.cross_attn.attn, theirs.multihead_attn)
    return theirs
