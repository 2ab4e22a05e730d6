"""Induction heads, grown and proven: the data, the scores, the model and the ablation (chapter 09).

Shape legend: ``B`` batch, ``n`` positions, ``H`` heads, ``L`` layers, ``V`` the vocabulary size.

An induction head (Olsson et al., 2022) completes ``... a b ... a`` with ``b``: at a token it
attends to the position just *after* an earlier occurrence of the same token and copies what it
finds there. It needs a **previous-token head** in an earlier layer, which writes into each
position which token preceded it, so that the induction head's query (the current token) can
match the key "preceded by the current token". The machinery:

* :func:`repeated_block_batch`: random tokens with one block of random length at a random
  offset, immediately repeated; the second copy is predictable only by copying.
* :func:`induction_score`: each sequence's own offset and length decide which key an induction
  head attends to, so a head that looks up absolute positions cannot score by luck;
  :func:`fixed_offset_induction_score` is the fixed-offset score such a head *can* fool.
* :func:`second_copy_bits`: the loss on the predictable tokens of the second copy.
* :func:`attention_only_gpt`: the :class:`~attnkit.gpt.GPT` without feed-forward networks and
  with PyTorch's default initialisation, the model in which the circuit forms in seconds.
* :func:`head_mask`, :func:`measure`, :func:`train_on_repeats`: ablate heads, score a model,
  train one while recording its scores (an :class:`InductionHistory`).
* :func:`complete_copies`: the circuit at work, writing: prompted with a block and the start of
  its copy, the model completes the copy greedily (a :class:`Completion`), with or without a head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.gpt import GPT
from attnkit.probes import previous_token_scores

__all__ = [
    "RepeatedBatch",
    "repeated_block_batch",
    "second_copy_queries",
    "induction_score",
    "fixed_offset_induction_score",
    "second_copy_bits",
    "attention_only_gpt",
    "head_mask",
    "measure",
    "InductionHistory",
    "train_on_repeats",
    "Completion",
    "complete_copies",
]


@dataclass(frozen=True)
class RepeatedBatch:
    """Token sequences ``tokens`` ``(B, n)`` whose block ``first[b] .. first[b] + length[b] - 1`` is
    repeated at ``first[b] + length[b]``; ``first`` and ``length`` are ``(B,)`` int64."""

    tokens: Tensor
    first: Tensor
    length: Tensor


def repeated_block_batch(
    batch: int,
    n: int = 24,
    vocab_size: int = 32,
    lengths: tuple[int, int] = (3, 10),
    start: int | None = None,
    generator: torch.Generator | None = None,
) -> RepeatedBatch:
    """``batch`` sequences of ``n`` tokens with one block repeated (chapter 09).

    Position 0 holds the start token ``vocab_size`` (so a model needs ``vocab_size + 1`` ids);
    the others are uniform over ``0 .. vocab_size - 1``, except that a block of length drawn
    uniformly from ``lengths`` (inclusive), starting at a uniform offset ``first >= 1`` (or at
    ``start`` for every sequence), is copied right after itself. Random tokens mean that nothing
    but the copy makes the second half of the block predictable.
    """
    low, high = lengths
    if not 1 <= low <= high or 1 + 2 * high > n:
        raise ValueError(
            f"lengths must satisfy 1 <= low <= high with 1 + 2 high <= n = {n}, got {lengths}"
        )
    if start is not None and not 1 <= start <= n - 2 * high:
        raise ValueError(f"start must lie in 1..{n - 2 * high} for n={n}, lengths={lengths}")
    tokens = torch.randint(0, vocab_size, (batch, n), generator=generator)  # (B, n)
    tokens[:, 0] = vocab_size
    length = torch.randint(low, high + 1, (batch,), generator=generator)  # (B,)
    if start is None:  # uniform over 1 .. n - 2 length, per sequence
        room = (n - 2 * length).double()  # (B,) offsets available
        first = 1 + (torch.rand(batch, generator=generator, dtype=torch.float64) * room).long()
    else:
        first = torch.full((batch,), start, dtype=torch.long)
    pos = torch.arange(n)  # (n,)
    in_copy = (pos >= (first + length)[:, None]) & (pos < (first + 2 * length)[:, None])
    source = (pos - length[:, None]).clamp(min=0)  # (B, n): where each copied token comes from
    tokens = torch.where(in_copy, tokens.gather(1, source), tokens)
    return RepeatedBatch(tokens, first, length)


def second_copy_queries(first: Tensor, length: Tensor, n: int) -> Tensor:
    """``(B, n)`` bool: the positions ``i`` of the second copy whose next token is the copy's.

    ``i`` runs over ``first + length .. first + 2 length - 2``: there token ``i`` repeats token
    ``i - length`` and token ``i + 1`` repeats token ``i - length + 1``, so copying predicts it.
    """
    pos = torch.arange(n, device=first.device)  # (n,)
    lo, hi = (first + length)[:, None], (first + 2 * length - 2)[:, None]
    return (pos >= lo) & (pos <= hi)  # (B, n)


def _check_weights(weights: Tensor, first: Tensor, length: Tensor) -> None:
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be (B, H, n, n), got {tuple(weights.shape)}")
    B, n = weights.shape[0], weights.shape[-1]
    if first.shape != (B,) or length.shape != (B,):
        raise ValueError(
            f"first and length must be (B,) = ({B},) like the weights' batch, got "
            f"{tuple(first.shape)} and {tuple(length.shape)}"
        )
    if bool((length < 2).any()) or bool((first + 2 * length > n).any()):
        raise ValueError(f"every block must have length >= 2 and fit twice in n = {n}")


def induction_score(weights: Tensor, first: Tensor, length: Tensor) -> Tensor:
    """Induction score per head, each sequence at its own offset (chapter 09).

    ``weights`` ``(B, H, n, n)``, ``first`` and ``length`` ``(B,)`` -> ``(H,)``: the
    mean weight, over the :func:`second_copy_queries` ``i`` of every sequence, on the
    key ``i - length + 1``, the token that followed the earlier occurrence of token
    ``i`` (Olsson et al., 2022). As ``first`` and ``length`` differ from sequence to
    sequence, a head that attends to a fixed position or a fixed distance back scores
    little; only one that finds the earlier occurrence by its content scores near 1.
    """
    _check_weights(weights, first, length)
    B, H, n, _ = weights.shape
    first, length = first.to(weights.device), length.to(weights.device)
    queries = second_copy_queries(first, length, n)  # (B, n) bool
    keys = torch.arange(n, device=weights.device) - length[:, None] + 1  # (B, n)
    index = keys.clamp(min=0)[:, None, :, None].expand(B, H, n, 1)
    picked = weights.gather(-1, index).squeeze(-1)  # (B, H, n): query i on its key
    q = queries[:, None].to(picked.dtype)  # (B, 1, n)
    return (picked * q).sum(dim=(0, 2)) / q.sum()  # (H,)


def fixed_offset_induction_score(weights: Tensor, first: int, length: int) -> Tensor:
    """The same score with one offset and length for every sequence: ``(B, H, n, n) -> (H,)``.

    This is what a score computed on sequences laid out identically measures; a head that has
    learnt the *positions* of the layout (with learned absolute positions) scores high on it
    without looking at the tokens. Compare it with :func:`induction_score` on random offsets.
    """
    B = weights.shape[0]
    return induction_score(
        weights,
        torch.full((B,), first, dtype=torch.long),
        torch.full((B,), length, dtype=torch.long),
    )


def second_copy_bits(logits: Tensor, data: RepeatedBatch) -> float:
    """Mean loss in bits on the tokens of the second copy that copying predicts (chapter 09).

    ``logits`` ``(B, n, V)`` on ``data.tokens``; position ``i`` of
    :func:`second_copy_queries` predicts token ``i + 1``. ``log2(vocab)`` is chance.
    """
    tokens = data.tokens.to(logits.device)
    B, n, _ = logits.shape
    queries = second_copy_queries(data.first, data.length, n).to(logits.device)[:, :-1]
    losses = F.cross_entropy(
        logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none"
    )  # (B, n - 1) nats
    return float(losses[queries].mean() / math.log(2))


def attention_only_gpt(
    vocab_size: int = 33,
    num_layers: int = 2,
    embed_dim: int = 64,
    num_heads: int = 2,
    max_len: int = 24,
    position: str = "rope",
) -> GPT:
    """A :class:`~attnkit.gpt.GPT` with attention only and PyTorch's default initialisation.

    No feed-forward networks, no dropout, a read-out of its own (tied to an N(0, 1) embedding
    it would start with logits far too large); with GPT-2's N(0, 0.02) initialisation instead,
    no induction head formed in 500 steps on two seeds (second-copy loss still 3.8-4.0 bits).
    """
    return GPT(
        vocab_size,
        embed_dim=embed_dim,
        num_heads=num_heads,
        num_layers=num_layers,
        max_len=max_len,
        position=position,
        dropout=0.0,
        tie_weights=False,
        feed_forward=False,
        init="torch",
    )


def head_mask(
    model: GPT, ablate: list[tuple[int, int]] | tuple[int, int] = (), device=None
) -> Tensor:
    """``(L, H)`` ones with a zero at each ``(layer, head)`` of ``ablate``: for ``head_mask=``."""
    L, H = len(model.blocks), model.num_heads
    pairs = [ablate] if ablate and isinstance(ablate[0], int) else list(ablate)
    mask = torch.ones(L, H, device=device)
    for layer, head in pairs:
        if not (0 <= layer < L and 0 <= head < H):
            raise ValueError(f"no head ({layer}, {head}) in a model of {L} layers x {H} heads")
        mask[layer, head] = 0
    return mask


@torch.no_grad()
def measure(
    model: GPT, data: RepeatedBatch, mask: Tensor | None = None
) -> dict[str, Tensor | float]:
    """Second-copy loss (bits) and the ``(L, H)`` previous-token and induction scores on ``data``.

    The previous-token score is :func:`~attnkit.probes.previous_token_scores` on the same random
    sequences; ``mask`` ``(L, H)`` ablates heads (their weights are still the ones they compute).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    tokens = data.tokens.to(device)
    mask = None if mask is None else mask.to(device)
    logits, weights = model(tokens, need_weights=True, head_mask=mask)  # L x (B, H, n, n)
    model.train(was_training)
    return {
        "second_copy_bits": second_copy_bits(logits, data),
        "previous_token": torch.stack([previous_token_scores(w) for w in weights]).cpu(),
        "induction": torch.stack(
            [induction_score(w, data.first, data.length) for w in weights]
        ).cpu(),
    }


@dataclass
class InductionHistory:
    """What :func:`train_on_repeats` recorded every ``eval_every`` steps."""

    steps: list[int] = field(default_factory=list)
    second_copy_bits: list[float] = field(default_factory=list)
    previous_token: list[Tensor] = field(default_factory=list)  # each (L, H)
    induction: list[Tensor] = field(default_factory=list)  # each (L, H)


def train_on_repeats(
    model: GPT,
    steps: int = 600,
    batch: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    eval_every: int = 25,
    eval_data: RepeatedBatch | None = None,
    **data_kwargs,
) -> InductionHistory:
    """Train ``model`` with Adam on :func:`repeated_block_batch` data, scoring it as it learns.

    Every ``eval_every`` steps (and at step 0) :func:`measure` runs on ``eval_data`` (default:
    256 fresh sequences from a generator seeded ``seed + 1``, laid out as the training data);
    ``data_kwargs`` (``n``, ``lengths``, ``start``) go to :func:`repeated_block_batch`, whose
    ``vocab_size`` is the model's less the start token.
    """
    device = next(model.parameters()).device
    data_kwargs.setdefault("vocab_size", model.vocab_size - 1)
    if eval_data is None:
        eval_data = repeated_block_batch(
            256, generator=torch.Generator().manual_seed(seed + 1), **data_kwargs
        )
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = InductionHistory()

    def record(step: int) -> None:
        m = measure(model, eval_data)
        history.steps.append(step)
        history.second_copy_bits.append(m["second_copy_bits"])
        history.previous_token.append(m["previous_token"])
        history.induction.append(m["induction"])

    record(0)
    model.train()
    for step in range(1, steps + 1):
        tokens = repeated_block_batch(batch, generator=gen, **data_kwargs).tokens.to(device)
        logits, _ = model(tokens)  # (B, n, V)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % eval_every == 0:
            record(step)
    return history


@dataclass(frozen=True)
class Completion:
    """What :func:`complete_copies` wrote: ``prompt`` ``(B, p)``, the greedy ``written`` tokens and
    the ``expected`` ones (the rest of the block) ``(B, k)``, and the share of written tokens that
    are right, ``accuracy``."""

    prompt: Tensor
    written: Tensor
    expected: Tensor
    accuracy: float


@torch.no_grad()
def complete_copies(
    model: GPT,
    batch: int = 200,
    noise: int = 3,
    length: int = 8,
    given: int = 2,
    mask: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Completion:
    """Prompt ``model`` with a block and the first ``given`` tokens of its copy; it writes the rest (chapter 09).

    Each prompt is the start token, ``noise`` random tokens, a block of ``length`` random tokens
    and the block's first ``given`` tokens again (tokens uniform over the model's vocabulary less
    the start token, as :func:`repeated_block_batch` draws them); the model then writes
    ``length - given`` tokens, each its arg max given everything before it (``mask`` ``(L, H)``
    ablates heads, as in :func:`measure`). Only copying from the block can get them right: chance
    is one in ``model.vocab_size - 1``.
    """
    if not 1 <= given < length:
        raise ValueError(f"need 1 <= given < length, got given={given}, length={length}")
    vocab = model.vocab_size - 1  # the last id is the start token
    if 1 + noise + length + length > model.max_len and model.position == "learned":
        raise ValueError(f"a prompt and its completion need {1 + noise + 2 * length} positions, "
                         f"the model has {model.max_len}")
    device = next(model.parameters()).device
    block = torch.randint(0, vocab, (batch, length), generator=generator)  # (B, length)
    start = torch.full((batch, 1), vocab)  # (B, 1)
    prompt = torch.cat(
        [start, torch.randint(0, vocab, (batch, noise), generator=generator), block, block[:, :given]],
        dim=1,
    )  # (B, 1 + noise + length + given)
    was_training = model.training
    model.eval()
    tokens = prompt.to(device)
    mask = None if mask is None else mask.to(device)
    for _ in range(length - given):
        logits, _ = model(tokens, head_mask=mask)  # (B, p + i, V)
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    model.train(was_training)
    written, expected = tokens[:, prompt.shape[1]:].cpu(), block[:, given:]  # (B, length - given)
    return Completion(prompt, written, expected, float((written == expected).double().mean()))
