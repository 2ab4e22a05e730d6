"""The counting baseline a language model has to beat: character n-grams (chapter 09).

:func:`ngram_bits_per_char` counts every context of ``order - 1`` characters and the character
after it in the training text and scores the validation text with add-alpha smoothing, in bits
per character; :func:`attnkit.gpt.windowed_bits_per_char` scores a model on the same characters.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ngram_bits_per_char"]


def _context_codes(ids: Tensor, order: int, vocab_size: int) -> Tensor:
    # the previous order-1 tokens of each position >= order-1, as one integer in base V
    n = ids.shape[0] - (order - 1)
    code = torch.zeros(n, dtype=torch.long, device=ids.device)
    for j in range(order - 1):
        code = code * vocab_size + ids[j : j + n]
    return code  # (n,)


def ngram_bits_per_char(
    train_ids: Tensor, val_ids: Tensor, order: int, vocab_size: int, alpha: float = 0.1
) -> float:
    """Bits per character on ``val_ids`` of a character ``order``-gram model counted on ``train_ids`` (chapter 09).

    ``P(c | context) = (count(context, c) + alpha) / (count(context) + alpha V)``, the previous
    ``order - 1`` characters being the context (add-alpha smoothing, so an unseen pair still gets
    some probability). Scored on every validation position that has a full context.
    """
    if order < 1 or vocab_size**order >= 2**62:
        raise ValueError(
            f"order must be >= 1 with vocab_size ** order < 2**62, got order={order}"
        )
    if train_ids.dim() != 1 or val_ids.dim() != 1 or val_ids.shape[0] < order:
        raise ValueError(
            "train_ids and val_ids must be 1-D token id tensors, val_ids longer than order"
        )
    contexts = _context_codes(train_ids, order, vocab_size)  # (n - order + 1,)
    pair_keys, pair_counts = (contexts * vocab_size + train_ids[order - 1 :]).unique(
        return_counts=True
    )
    ctx_keys, ctx_counts = contexts.unique(return_counts=True)

    def lookup(keys: Tensor, counts: Tensor, query: Tensor) -> Tensor:
        at = torch.searchsorted(keys, query).clamp(max=len(keys) - 1)
        return torch.where(keys[at] == query, counts[at], 0).double()

    ctx = _context_codes(val_ids, order, vocab_size)  # (m - order + 1,)
    pair = lookup(pair_keys, pair_counts, ctx * vocab_size + val_ids[order - 1 :])
    total = lookup(ctx_keys, ctx_counts, ctx)
    prob = (pair + alpha) / (total + alpha * vocab_size)
    return float(-prob.log2().mean())
