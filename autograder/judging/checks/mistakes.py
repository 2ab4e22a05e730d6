"""The classic mistakes of scaled dot-product attention, computed once for the checks of 01, 02 and 04.

``wrong_attention(q, k, v, mask)``: for each known-wrong variant of ``softmax(Q K^T / sqrt(d_k)) V`` that applies to
these inputs, the ``(output, weights)`` it computes. A chapter words them with ``named`` (key -> message, in the order
tried) and hands ``outputs`` / ``weights`` of the result to ``expect_close``: chapter 01 on the student's attention, 04
on the masked attention, 02 head by head (``(B, H, n, Dh)`` inputs, a 4-D mask). ``expect_no_nan`` names the mistake
that shows before any value is compared: NaN where a query has no allowed key (a softmax over a row of -inf is 0/0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnkit import softmax as ref_softmax
from autograder.judging.checks.verdicts import CheckFailed

# the variants, by key (a chapter's message table maps these to its words)
NOT_SCALED = "not scaled"  # softmax(Q K^T) V
BY_D_K = "divided by d_k"  # softmax(Q K^T / d_k) V
TIMES_SQRT_D_K = "multiplied by sqrt(d_k)"  # softmax(Q K^T * sqrt(d_k)) V
BY_SQRT_D_V = "divided by sqrt(d_v)"  # the value width instead of the key width (only when they differ)
OVER_QUERIES = "softmax over the queries"  # softmax along dim=-2
WEIGHTS_ON_KEYS = "weights times the keys"  # softmax(S) K (only when d_v == d_k)
MASK_IGNORED = "mask ignored"
MASK_INVERTED = "mask inverted"  # -inf where the mask is True
MASK_AFTER = "mask after the softmax"  # softmax(S) * mask: the kept weights no longer sum to 1
FINITE_FILL = "finite fill"  # a large negative number instead of -inf: a row with no allowed key is uniform

Pairs = dict[str, tuple[Tensor, Tensor]]


def wrong_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Pairs:
    """key -> ``(output, weights)`` of each classic mistake that applies to ``q`` (..., n, d_k), ``k`` (..., m, d_k),
    ``v`` (..., m, d_v) and ``mask`` (bool, broadcastable to (..., n, m), True = may attend): the mask variants only
    with a mask, ``FINITE_FILL`` only when some query has no allowed key (elsewhere it equals the right answer)."""
    d_k, d_v = q.shape[-1], v.shape[-1]
    raw = q @ k.transpose(-2, -1)  # (..., n, m) unscaled scores
    scaled = raw / math.sqrt(d_k)
    masked = raw if mask is None else raw.masked_fill(~mask, float("-inf"))  # the unscaled scores, masked
    found = {
        NOT_SCALED: ref_softmax(masked),
        BY_D_K: ref_softmax(masked / d_k),
        TIMES_SQRT_D_K: ref_softmax(masked * math.sqrt(d_k)),
        **({BY_SQRT_D_V: ref_softmax(masked / math.sqrt(d_v))} if d_v != d_k else {}),
        OVER_QUERIES: ref_softmax(masked / math.sqrt(d_k), dim=-2),
    }
    if mask is not None:
        # (masking after the softmax and renormalising is no mistake where a query has an allowed key: the
        # ratios of the kept weights are the softmax's; and where none has, it is NaN, which expect_no_nan names)
        found |= {
            MASK_IGNORED: ref_softmax(scaled),
            MASK_INVERTED: ref_softmax(scaled.masked_fill(mask, float("-inf"))),
            MASK_AFTER: ref_softmax(scaled) * mask,
        }
        if not bool(mask.expand_as(raw).any(-1).all()):  # some query has no allowed key
            found[FINITE_FILL] = ref_softmax(scaled.double().masked_fill(~mask, -1e30))
    pairs = {key: (w @ v.to(w.dtype), w) for key, w in found.items()}  # FINITE_FILL's are float64
    if d_v == d_k:
        right = ref_softmax(masked / math.sqrt(d_k))
        pairs[WEIGHTS_ON_KEYS] = (right @ k, right)
    return pairs


def named(pairs: Pairs, messages: Mapping[str, str]) -> Pairs:
    """message -> ``(output, weights)`` for the variants in ``messages`` that apply, in its order."""
    return {message: pairs[key] for key, message in messages.items() if key in pairs}


def outputs(pairs: Pairs) -> dict[str, Tensor]:
    """message -> output, for ``expect_close`` on an output."""
    return {message: out for message, (out, _) in pairs.items()}


def weights(pairs: Pairs) -> dict[str, Tensor]:
    """message -> weights, for ``expect_close`` on the attention weights."""
    return {message: w for message, (_, w) in pairs.items()}


def expect_no_nan(tensors: Mapping[str, Any], what: str, why: str) -> None:
    """Fails with "the {name}{what} contain NaN{why}" for the first floating-point tensor that holds NaN."""
    for name, value in tensors.items():
        if isinstance(value, Tensor) and value.is_floating_point() and bool(torch.isnan(value).any()):
            raise CheckFailed(f"the {name}{what} contain NaN{why}")
