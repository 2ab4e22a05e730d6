"""What a head does, measured: previous-token scores and repeated random tokens (chapter 09).

Shape legend: ``B`` batch, ``H`` heads, ``n`` positions.

* :func:`previous_token_scores`: how much each head looks one token back (Olsson et al., 2022);
* :func:`repeated_random_tokens`: random tokens followed by the same ones again, the input of the
  in-context loss curve (the second copy is predictable only by copying from the first).

The induction score, at offsets a positional look-up cannot fake, is
:func:`attnkit.induction.induction_score`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["previous_token_scores", "repeated_random_tokens"]


def previous_token_scores(weights: Tensor) -> Tensor:
    """Mean attention from each position ``i >= 1`` to ``i - 1``, per head: ``(B, H, n, n) -> (H,)`` (chapter 09).

    1 for a head that always looks one token back, about ``1 / i`` averaged for a uniform causal head.
    """
    if (
        weights.dim() != 4
        or weights.shape[-1] != weights.shape[-2]
        or weights.shape[-1] < 2
    ):
        raise ValueError(
            f"weights must be (B, H, n, n) with n >= 2, got {tuple(weights.shape)}"
        )
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(
        dim=(0, 2)
    )  # (B, H, n-1) -> (H,)


def repeated_random_tokens(
    batch: int, length: int, vocab_size: int, generator: torch.Generator | None = None
) -> Tensor:
    """``(batch, 2 length)`` int64: ``length`` uniformly random tokens, then the same ones again (chapter 09)."""
    first = torch.randint(
        0, vocab_size, (batch, length), generator=generator
    )  # (batch, length)
    return torch.cat([first, first], dim=1)
