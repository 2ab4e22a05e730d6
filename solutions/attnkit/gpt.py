"""A small GPT: a decoder-only Transformer language model, trained and sampled (chapter 09).

Shape legend: ``B`` batch, ``n`` positions, ``s`` new positions, ``t`` cached positions, ``E`` the
model width ``embed_dim``, ``H`` heads, ``Dh = E // H``, ``L`` layers, ``V`` the vocabulary size.

* :class:`GPT`: token embedding, a position scheme (``"learned"``, ``"sinusoidal"``, ``"rope"``,
  ``"alibi"`` or ``"none"``), pre-norm :class:`~attnkit.transformer.TransformerEncoderBlock` s with
  the causal mask (Radford et al., 2019), a final layer norm and a read-out tied to the embedding
  (Press and Wolf, 2017).
* :func:`language_model_loss`, :func:`sample_next`, :func:`generate` (with chapter 08's key-value cache).
* :func:`windowed_bits_per_char`: the model scored on the characters
  :func:`attnkit.ngram.ngram_bits_per_char` scores the counting baseline on.
* :func:`load_tiny_gpt`: chapter 09's model trained for longer, shipped with the package
  (``attnkit/data/tiny_gpt``, written by ``scripts/train_tiny_gpt.py``), with its own tokenizer.

The text and the tokenizer are in :mod:`attnkit.text`, the head scores in :mod:`attnkit.probes`
and :mod:`attnkit.induction`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.attention import scaled_dot_product_attention
from attnkit.efficient import KVCache, append_to_cache, cached_attention
from attnkit.masks import causal_mask
from attnkit.multihead import merge_heads, split_heads
from attnkit.positional import (alibi_attention, alibi_bias, alibi_slopes, apply_rotary_embedding,
                                sinusoidal_positional_encoding)
from attnkit.text import CharTokenizer
from attnkit.transformer import TransformerEncoderBlock

__all__ = [
    "POSITIONS",
    "INITS",
    "GPT",
    "language_model_loss",
    "sample_next",
    "generate",
    "windowed_bits_per_char",
    "TINY_GPT_PATH",
    "load_tiny_gpt",
]

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")
INITS = ("gpt2", "torch")
TINY_GPT_PATH = Path(__file__).parent / "data" / "tiny_gpt"  # chapter 09's checkpoint


# -- the model -----------------------------------------------------------------------------------------


class GPT(nn.Module):
    """A decoder-only Transformer language model from the course's pre-norm blocks (chapter 09).

    ``forward(tokens, need_weights=False, head_mask=None) -> (logits, weights)``: ``tokens``
    ``(B, n)`` int64, ``logits`` ``(B, n, V)`` where position ``i`` predicts token ``i + 1`` from
    tokens ``0..i``; ``weights`` a list of ``L`` tensors ``(B, H, n, n)``, or of ``None`` when
    ``need_weights`` is False (then the fused kernel of chapter 08 computes the attention). ``head_mask`` ``(L, H)``
    multiplies each head's output (0 removes the head: an ablation).

    ``decode(tokens, cache) -> (logits, cache)`` runs ``s`` new positions after the ``t`` whose keys
    and values ``cache`` holds (one ``(keys, values)`` pair per layer, ``(B, H, t, Dh)`` each).

    Each block is ``x + attn(norm1(x))`` then ``x + ffn(norm2(x))`` as in
    :class:`~attnkit.transformer.TransformerEncoderBlock` ``(norm_first=True)``; the attention is
    written out here from the projections of the block's
    :class:`~attnkit.multihead.MultiHeadAttention` (``block.self_attn.attn``) so that RoPE can
    rotate queries and keys and the cache can hold the keys and values.

    ``dropout`` applies to the embeddings, to each sublayer's output, inside the feed-forward
    network and to the attention weights, in training mode only. The attention-weight dropout is
    the MultiHeadAttention's own (``block.self_attn.attn.dropout``) and is applied as it applies
    it: ``F.dropout`` on the ``(B, H, n, n)`` weights of the explicit path, which then mix the
    values, so in training the model computes, random draws included, what the blocks'
    ``forward`` with ``causal_mask`` would. Where no weights are needed (``need_weights=False``
    and no attention dropout: ``dropout=0`` or ``eval()``) torch's fused kernel computes the
    attention with ``is_causal=True``, which lets it skip the masked half rather than read a
    mask. Training with attention dropout takes the explicit path: the fused kernel's own
    ``dropout_p`` matches ``F.dropout`` on the weights only where torch falls back to its math
    kernel (on a CPU it does); its GPU kernels draw their own random masks, and no kernel
    returns the weights it dropped.
    ``decode`` is for generation and refuses training mode with attention dropout.

    ``position="alibi"`` adds nothing to the embeddings: each head adds ALiBi's bias,
    ``-slope_h`` times the distance from query to key, to its scores (Press et al., 2022;
    :func:`~attnkit.positional.alibi_attention`), on every path (explicit, fused, cached).

    ``feed_forward=False`` removes each block's feed-forward network and the norm before it
    (``block.feed_forward`` and ``block.norm2`` are ``None``): an attention-only model, the
    smallest that forms an induction circuit (Olsson et al., 2022; :mod:`attnkit.induction`).
    ``init="gpt2"`` draws every weight from N(0, 0.02) with zero biases (GPT-2's choice);
    ``init="torch"`` keeps PyTorch's default initialisation of each layer.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 128,
        num_heads: int = 4,
        num_layers: int = 4,
        ff_dim: int | None = None,
        max_len: int = 256,
        position: str = "learned",
        dropout: float = 0.0,
        tie_weights: bool = True,
        feed_forward: bool = True,
        init: str = "gpt2",
    ) -> None:
        super().__init__()
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        if (
            position in ("rope", "sinusoidal")
            and (embed_dim // num_heads if position == "rope" else embed_dim) % 2
        ):
            raise ValueError(
                f"position={position!r} needs an even width, got embed_dim={embed_dim}, "
                f"num_heads={num_heads}"
            )
        self.vocab_size, self.max_len = vocab_size, max_len
        self.position, self.num_heads = position, num_heads
        self.token_embed = nn.Embedding(vocab_size, embed_dim)
        self.position_embed = (
            nn.Embedding(max_len, embed_dim) if position == "learned" else None
        )
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerEncoderBlock(
                embed_dim, num_heads, ff_dim or 4 * embed_dim, dropout, norm_first=True
            )
            for _ in range(num_layers)
        )
        if not feed_forward:  # attention only: no feed-forward network, no norm before it
            for block in self.blocks:
                block.feed_forward, block.norm2 = None, None
        self.attention_only = not feed_forward
        self.norm = nn.LayerNorm(embed_dim)
        self.readout = nn.Linear(embed_dim, vocab_size, bias=False)
        if init == "gpt2":
            self.apply(self._init)
        if tie_weights:
            # one (V, E) matrix embeds and reads out
            self.readout.weight = self.token_embed.weight

    @staticmethod
    def _init(module: nn.Module) -> None:
        # GPT-2's initialisation: small normal weights, zero biases
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def _check_tokens(self, tokens: Tensor, start: int) -> None:
        if (
            not isinstance(tokens, Tensor)
            or tokens.dim() != 2
            or tokens.dtype != torch.long
        ):
            got = (
                f"{tuple(tokens.shape)} {tokens.dtype}"
                if isinstance(tokens, Tensor)
                else type(tokens).__name__
            )
            raise ValueError(
                f"tokens must be an int64 tensor of shape (B, n), got {got}"
            )
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(
                f"token ids must lie in 0..{self.vocab_size - 1}, got {tokens.min()}..{tokens.max()}"
            )
        if self.position == "learned" and start + tokens.shape[1] > self.max_len:
            raise ValueError(
                f"learned positions exist for {self.max_len} positions (max_len), got a sequence "
                f"reaching position {start + tokens.shape[1] - 1}"
            )

    def _embed(self, tokens: Tensor, start: int) -> Tensor:
        x = self.token_embed(tokens)  # (B, s, E)
        n, E = tokens.shape[1], x.shape[-1]
        if self.position == "learned":
            x = x + self.position_embed(
                torch.arange(start, start + n, device=tokens.device)
            )
        elif self.position == "sinusoidal":
            x = (
                x
                + sinusoidal_positional_encoding(
                    start + n, E, device=tokens.device, dtype=x.dtype
                )[start:]
            )
        return self.dropout(x)  # (B, s, E)

    def _attend(
        self,
        block: TransformerEncoderBlock,
        h: Tensor,
        start: int,
        caching: bool,
        cache: KVCache | None,
        need_weights: bool,
        head_mask: Tensor | None,
    ) -> tuple[Tensor, Tensor | None, KVCache | None]:
        mha = block.self_attn.attn  # chapter 02's MultiHeadAttention: projections, dropout
        q, k, v = (
            split_heads(p(h), self.num_heads)
            for p in (mha.q_proj, mha.k_proj, mha.v_proj)
        )  # (B, H, s, Dh)
        if self.position == "rope":
            positions = torch.arange(start, start + h.shape[1], device=h.device)  # (s,)
            q, k = apply_rotary_embedding(q, positions), apply_rotary_embedding(
                k, positions
            )
        p = mha.dropout if self.training else 0.0  # attention dropout, training only
        weights = None
        slopes = (
            alibi_slopes(self.num_heads, device=h.device, dtype=q.dtype)
            if self.position == "alibi" else None
        )  # (H,): ALiBi's bias -slope * distance is added to the scores
        if caching:  # decoding: chapter 08's cache (decode refuses p > 0)
            if slopes is None:
                out, cache = cached_attention(
                    q, k, v, cache
                )  # (B, H, s, Dh); cache (B, H, t + s, Dh)
            else:  # the same, with the bias: new query t + i sees keys 0 .. t + i
                keys, values = append_to_cache(cache, k, v)  # (B, H, t + s, Dh)
                s, total = q.shape[-2], keys.shape[-2]
                mask = torch.ones(s, total, dtype=torch.bool, device=h.device).tril(total - s)
                out, _ = alibi_attention(q, keys, values, mask, slopes=slopes)  # (B, H, s, Dh)
                cache = (keys, values)
        elif need_weights or p > 0.0:  # the explicit path of chapter 01, weights formed
            mask = causal_mask(h.shape[1], device=h.device)  # (n, n)
            if slopes is None:
                out, weights = scaled_dot_product_attention(
                    q, k, v, mask
                )  # (B, H, n, Dh), (B, H, n, n)
            else:
                out, weights = alibi_attention(q, k, v, mask, slopes=slopes)
            if p > 0.0:  # as MultiHeadAttention: drop weights, then mix the values
                weights = F.dropout(weights, p)  # (B, H, n, n)
                out = weights @ v  # (B, H, n, Dh)
            if not need_weights:
                weights = None
        elif slopes is None:  # the fused kernel (chapter 08's fast path), the causal mask as a flag
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, n, Dh)
        else:  # the fused kernel with ALiBi's bias as a float mask, -inf above the diagonal
            n = h.shape[1]
            bias = alibi_bias(slopes, n).masked_fill(
                ~causal_mask(n, device=h.device), float("-inf")
            )  # (H, n, n)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (B, H, n, Dh)
        if head_mask is not None:
            out = out * head_mask[:, None, None].to(
                out.dtype
            )  # (B, H, s, Dh) times (H, 1, 1)
        return (
            block.dropout1(mha.out_proj(merge_heads(out))),
            weights,
            cache,
        )  # (B, s, E)

    def _run(
        self,
        tokens: Tensor,
        start: int,
        caches: list[KVCache | None] | None,
        need_weights: bool,
        head_mask: Tensor | None,
    ) -> tuple[Tensor, list[Tensor | None], list[KVCache | None]]:
        self._check_tokens(tokens, start)
        x = self._embed(tokens, start)  # (B, s, E)
        weights, new_caches = [], []
        for i, block in enumerate(self.blocks):
            out, w, cache = self._attend(
                block,
                block.norm1(x),
                start,
                caches is not None,
                caches[i] if caches else None,
                need_weights,
                None if head_mask is None else head_mask[i],
            )
            x = x + out
            if block.feed_forward is not None:
                x = x + block.dropout2(block.feed_forward(block.norm2(x)))  # (B, s, E)
            weights.append(w)
            new_caches.append(cache)
        return self.readout(self.norm(x)), weights, new_caches  # (B, s, V)

    def forward(
        self,
        tokens: Tensor,
        need_weights: bool = False,
        head_mask: Tensor | None = None,
    ) -> tuple[Tensor, list[Tensor | None]]:
        L, H = len(self.blocks), self.num_heads
        if head_mask is not None and head_mask.shape != (L, H):
            raise ValueError(
                f"head_mask must be (num_layers, num_heads) = ({L}, {H}), "
                f"got {tuple(head_mask.shape)}"
            )
        logits, weights, _ = self._run(tokens, 0, None, need_weights, head_mask)
        return logits, weights  # (B, n, V), L x (B, H, n, n) or None

    def decode(
        self, tokens: Tensor, cache: list[KVCache] | None = None
    ) -> tuple[Tensor, list[KVCache]]:
        """Logits ``(B, s, V)`` for ``s`` new tokens ``(B, s)`` after the cached ones, and the longer cache."""
        if self.training and any(b.self_attn.attn.dropout > 0 for b in self.blocks):
            raise ValueError(
                "decode is for generation and has no attention dropout; this model is in "
                "training mode with attention dropout > 0: call model.eval() first"
            )
        start = cache[0][0].shape[-2] if cache else 0
        logits, _, new_cache = self._run(
            tokens, start, cache or [None] * len(self.blocks), False, None
        )
        return logits, new_cache


# -- training and sampling -----------------------------------------------------------------------------


def language_model_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """Mean cross-entropy (nats) of predicting ``tokens[:, i+1]`` from ``logits[:, i]``.

    ``logits`` ``(B, n, V)`` are the model's outputs on ``tokens`` ``(B, n)``; the last
    position has no target and the first token is never predicted, so ``n - 1``
    predictions per row count (chapter 09).
    """
    if logits.dim() != 3 or logits.shape[:2] != tokens.shape:
        raise ValueError(
            f"logits (B, n, V) must match tokens (B, n): got {tuple(logits.shape)} and "
            f"{tuple(tokens.shape)}"
        )
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token id per row of ``logits`` ``(B, V)`` -> ``(B,)`` (chapter 09).

    The logits are divided by ``temperature`` *before* the softmax (``temperature=0``:
    the arg max, greedy decoding); with ``top_k`` only the ``k`` largest logits keep
    probability (ties at the ``k``-th value are kept too). Sampling uses ``generator``
    when given, so a seeded generator gives the same tokens every time.
    """
    if logits.dim() != 2:
        raise ValueError(
            f"sample_next expects logits of shape (B, V), got {tuple(logits.shape)}"
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and not 1 <= top_k <= logits.shape[-1]:
        raise ValueError(
            f"top_k must be in 1..{logits.shape[-1]} (the vocabulary size), got {top_k}"
        )
    if temperature == 0:
        return logits.argmax(-1)  # (B,)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[
            :, -1:
        ]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits.float(), dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


@torch.no_grad()
def generate(
    model: GPT,
    prompt: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    window: int | None = None,
) -> Tensor:
    """The prompt followed by ``max_new_tokens`` sampled tokens (chapter 09).

    ``prompt`` is ``(n,)`` or ``(B, n)`` int64 and the result ``(n + max_new_tokens,)`` or
    ``(B, n + max_new_tokens)``. Each step samples with :func:`sample_next`. With ``use_cache`` the
    prompt runs once and then each step feeds only the newest token, reading the earlier keys and
    values from the cache (chapter 08); without it every step runs the whole sequence again. Both
    give the same tokens for the same ``generator``. The model runs in ``eval()`` mode (no dropout)
    and is put back in the mode it was in.

    ``window`` crops the context: each step runs the model, without the cache, on the last
    ``window`` tokens only, their positions counted from 0, so a model trained on windows of that
    length never meets a position (or, with RoPE, a distance) it was not trained on, however long
    the text grows. As long as the text is at most ``window`` tokens this gives the same tokens.
    """
    if (
        not isinstance(prompt, Tensor)
        or prompt.dim() not in (1, 2)
        or prompt.shape[-1] < 1
    ):
        raise ValueError(
            f"prompt must be a non-empty (n,) or (B, n) tensor of token ids, got "
            f"{tuple(prompt.shape) if isinstance(prompt, Tensor) else type(prompt).__name__}"
        )
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be an int >= 1 or None, got {window!r}")
    tokens = prompt if prompt.dim() == 2 else prompt[None]  # (B, n)
    was_training = model.training
    model.eval()
    try:
        cache, step_input = None, tokens
        for _ in range(max_new_tokens):
            if window is not None:  # the last `window` tokens, from position 0
                logits, _ = model(tokens[:, -window:])  # (B, min(n + i, window), V)
            elif use_cache:
                logits, cache = model.decode(
                    step_input, cache
                )  # (B, s, V): s = n first, then 1
            else:
                logits, _ = model(tokens)  # (B, n + i, V): everything again
            step_input = sample_next(logits[:, -1], temperature, top_k, generator)[
                :, None
            ]  # (B, 1)
            tokens = torch.cat([tokens, step_input], dim=1)
    finally:
        model.train(was_training)
    return tokens if prompt.dim() == 2 else tokens[0]


@torch.no_grad()
def windowed_bits_per_char(
    model: GPT,
    ids: Tensor,
    context: int,
    min_context: int,
    head_mask: Tensor | None = None,
    batch: int = 1024,
) -> tuple[float, int]:
    """Bits per character of ``model`` on ``ids`` ``(N,)``, every character read with context (chapter 09).

    Windows of ``context + 1`` tokens every ``stride = context + 1 - min_context`` positions;
    only the last ``stride`` predictions of each window count, so the characters
    ``min_context .. end - 1`` are each scored exactly once, from ``min_context`` to ``context``
    characters of context. Returns ``(bits, end)``; score an n-gram on the same characters with
    ``ngram_bits_per_char(train, ids[min_context - (order - 1) : end], order, V)``.
    """
    if not 1 <= min_context <= context:
        raise ValueError(f"need 1 <= min_context <= context, got {min_context}, {context}")
    stride = context + 1 - min_context
    n_windows = (ids.shape[0] - stride) // stride
    if n_windows < 1:
        raise ValueError(f"ids of length {ids.shape[0]} hold no window of {context + 1}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = 0.0
    for starts in (torch.arange(n_windows) * stride).split(batch):
        rows = starts[:, None] + torch.arange(context + 1)  # (b, context + 1)
        tokens = ids[rows].to(device)  # (b, context + 1)
        logits, _ = model(tokens, head_mask=head_mask)  # (b, context + 1, V)
        total += F.cross_entropy(
            logits[:, min_context - 1 : -1].flatten(0, 1).float(),
            tokens[:, min_context:].flatten(),
            reduction="sum",
        ).item()
    model.train(was_training)
    return total / (n_windows * stride) / math.log(2), min_context + n_windows * stride


def load_tiny_gpt(
    folder: str | Path | None = None, device: torch.device | str | None = None
) -> tuple[GPT, CharTokenizer, dict]:
    """Chapter 09's checkpoint: ``(model, tokenizer, config)`` (chapter 09).

    ``folder`` (default :data:`TINY_GPT_PATH`, installed with the package) holds ``checkpoint.pt``
    (float16 weights, the read-out tied to the embedding and stored once) and ``config.json``
    (the model's settings, the tokenizer's characters, the recorded validation loss), as
    ``scripts/train_tiny_gpt.py`` writes them. The model comes back in float32, in eval mode, on
    ``device``; the tokenizer is rebuilt from the checkpoint's own characters.
    """
    folder = TINY_GPT_PATH if folder is None else Path(folder)
    config = json.loads((folder / "config.json").read_text())
    model = GPT(**config["model"])
    state = torch.load(folder / "checkpoint.pt", map_location="cpu", weights_only=True)
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in state.items()}, strict=False
    )
    if missing != ["readout.weight"] or unexpected:  # the read-out is the embedding, tied
        raise ValueError(
            f"{folder / 'checkpoint.pt'} does not fit GPT(**config['model']): missing {missing}, "
            f"unexpected {unexpected}"
        )
    return model.to(device).eval(), CharTokenizer("".join(config["chars"])), config
