"""Multi-head attention: several learned perspectives on the same sequence (chapter 02).

Shape legend: ``B`` batch, ``n`` queries, ``m`` keys and values, ``E`` the
embedding width ``embed_dim``, ``H`` heads, ``Dh = E // H`` the width of one head,
``G`` key-value heads (``H`` unless grouped-query attention, chapter 08).

Each head projects queries, keys and values with its own slice of one wide
``E x E`` projection, attends with
:func:`attnkit.attention.scaled_dot_product_attention`, and the heads' outputs
are concatenated and mixed by ``out_proj`` (Vaswani et al., 2017, section 3.2.2).

The attention function is a constructor argument: any function
``(query, key, value, mask) -> (output, weights)`` on ``(B, H, seq, Dh)``
tensors, such as :func:`attnkit.efficient.fused_attention` (the fast path, whose
weights are ``None``) or :func:`attnkit.positional.alibi_attention` with its
slopes bound. No flag changes what ``forward`` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from attnkit.attention import scaled_dot_product_attention
from attnkit.validation import ShapeError, check_embeddings

__all__ = ["AttentionFn", "AttentionOptions", "split_heads", "merge_heads", "MultiHeadAttention"]

# (query, key, value, mask) -> (output, weights); weights None if never formed
AttentionFn = Callable[[Tensor, Tensor, Tensor, "Tensor | None"],
                       "tuple[Tensor, Tensor | None]"]


class AttentionOptions(TypedDict, total=False):
    """The keyword-only arguments of :class:`MultiHeadAttention`, which the layers
    built on it (``SelfAttention``, ``CrossAttention``) pass on unchanged."""

    num_kv_heads: int | None
    dropout: float
    attention: AttentionFn


def _shape(x: object) -> object:
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """Cut the last axis into ``num_heads`` heads, head axis forward (chapter 02).

    ``(B, n, H * Dh) -> (B, H, n, Dh)``: head ``h`` gets features ``h * Dh`` to
    ``(h + 1) * Dh - 1``. Leading dimensions may be anything:
    ``(..., n, H * Dh) -> (..., H, n, Dh)``.
    """
    if not isinstance(x, Tensor) or x.dim() < 2:
        raise ShapeError(f"split_heads expects a tensor of shape "
                         f"(..., n, num_heads * head_dim), got {_shape(x)}")
    if num_heads < 1 or x.shape[-1] % num_heads:
        raise ShapeError(f"the last dimension {x.shape[-1]} of {tuple(x.shape)} is not "
                         f"divisible by num_heads={num_heads}")
    return x.unflatten(-1, (num_heads, -1)).transpose(-3, -2)  # (..., H, n, Dh)


def merge_heads(x: Tensor) -> Tensor:
    """Undo :func:`split_heads`: ``(B, H, n, Dh) -> (B, n, H * Dh)`` (chapter 02)."""
    if not isinstance(x, Tensor) or x.dim() < 3:
        raise ShapeError(f"merge_heads expects a tensor of shape "
                         f"(..., num_heads, n, head_dim), got {_shape(x)}")
    return x.transpose(-3, -2).flatten(-2)  # (..., n, H, Dh) -> (..., n, H * Dh)


class _PackedProjections:
    """``q_proj``, ``k_proj`` and ``v_proj``'s weights (and biases) as consecutive rows of one
    tensor, queries then keys then values, like torch's ``in_proj_weight`` (chapter 08).

    The three layers keep their own ``nn.Parameter``s, now slices of that tensor, so training,
    ``state_dict`` and weight copies see nothing new. When the three are applied to one input
    (self-attention) the packed rows project it in one matrix product, and one kernel on a GPU,
    instead of three; keys and values of one context (cross-attention) in one. That is only
    right while the parameters still lie where they were packed and calling the layers would do
    nothing more: :meth:`holds` checks their addresses, shapes and strides, and that no hook or
    replaced ``forward`` would be skipped, so weights or layers changed by hand are used as they are.
    """

    def __init__(self, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear) -> None:
        layers = (q_proj, k_proj, v_proj)
        rows = [layer.out_features for layer in layers]  # E, G Dh, G Dh
        self.weight: Tensor | None = None  # (E + 2 G Dh, E); None: not packed
        self.bias: Tensor | None = None  # (E + 2 G Dh,)
        with_bias = [layer.bias is not None for layer in layers]
        with torch.no_grad():
            for name in ("weight", "bias") if all(with_bias) else ("weight",) if not any(with_bias) else ():
                params = [getattr(layer, name) for layer in layers]
                packed = torch.cat(params)  # rows: q, then k, then v
                for p, part in zip(params, packed.split(rows)):
                    p.data = part  # the same Parameter, its values now a slice of `packed`
                setattr(self, name, packed)
        self.kv_weight = None if self.weight is None else self.weight[rows[0]:]  # (2 G Dh, E)
        self.kv_bias = None if self.bias is None else self.bias[rows[0]:]  # (2 G Dh,)
        self.layout = self.layout_of(layers)

    @staticmethod
    def layout_of(layers: tuple[nn.Module, ...]) -> list[tuple]:
        return [(p.data_ptr(), p.shape, p.stride()) for layer in layers
                for p in layer._parameters.values() if p is not None]  # dict access: cheap

    def holds(self, layers: tuple[nn.Module, ...]) -> bool:
        """Whether one product over the packed rows computes what calling ``layers`` would: they
        are plain ``nn.Linear``s, no forward hook or replaced ``forward`` would be skipped, and
        their parameters lie where they were packed."""
        if self.weight is None or _global_forward_hooks or _global_forward_pre_hooks:
            return False
        for layer in layers:
            if type(layer) is not nn.Linear or layer._forward_hooks or layer._forward_pre_hooks \
                    or "forward" in layer.__dict__:
                return False
        return self.layout_of(layers) == self.layout


class MultiHeadAttention(nn.Module):
    """``num_heads`` attention heads in parallel, concatenated, projected (chapter 02).

    ``forward(query, key, value, mask=None) -> (output, weights)``: query
    ``(B, n, E)``, key and value ``(B, m, E)``, output ``(B, n, E)``, the per-head
    weights ``(B, H, n, m)``. A bool ``mask`` (True = may attend) broadcastable to
    ``(B, n, m)`` applies to every head; a 4-D mask is ``(B, H, n, m)``.

    Args:
        embed_dim, num_heads: ``E`` and ``H``; each head is ``Dh = E // H`` wide.
        bias: whether the four projections have a bias.
        num_kv_heads: ``G`` key-value heads (chapter 08), each shared by ``H // G``
            consecutive query heads: ``G == H`` (the default) is multi-head
            attention, ``1 < G < H`` grouped-query attention (Ainslie et al.,
            2023), ``G == 1`` multi-query attention (Shazeer, 2019). Query head
            ``h`` reads key-value head ``h // (H // G)``, as torch's
            ``F.scaled_dot_product_attention(..., enable_gqa=True)``.
        dropout: attention dropout, in training mode only: each weight is zeroed
            with probability ``dropout``, the rest scaled by ``1 / (1 - dropout)``,
            before they mix the values, as in ``nn.MultiheadAttention`` (the
            weights returned are the dropped ones). An ``attention`` function
            that forms no weights (``fused_attention``) has none to drop: with
            ``dropout > 0`` in training mode ``forward`` raises ``ValueError``.
        attention: the function that attends, ``(q, k, v, mask) -> (out, weights)``.

    Where no gradient is recorded (``torch.no_grad()``, inference) and the key is the value,
    the projections that share an input run as one matrix product over their packed weights
    (:class:`_PackedProjections`, what torch's ``nn.MultiheadAttention`` does): the same
    numbers, fewer kernel launches (chapter 08, ``attnkit.bench``).
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, *,
                 num_kv_heads: int | None = None, dropout: float = 0.0,
                 attention: AttentionFn = scaled_dot_product_attention) -> None:
        super().__init__()
        G = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads="
                             f"{num_heads} (each head gets embed_dim // num_heads "
                             f"features)")
        if G < 1 or num_heads % G:
            raise ValueError(f"num_heads={num_heads} must be a multiple of "
                             f"num_kv_heads={G} (each key-value head serves "
                             f"num_heads // num_kv_heads query heads)")
        if not 0.0 <= dropout <= 1.0:  # as nn.Dropout (1.0 zeroes every weight)
            raise ValueError(f"dropout is a probability in [0, 1], got {dropout!r}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, G
        self.head_dim = embed_dim // num_heads
        self.dropout, self.attention = dropout, attention
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, G * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, G * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self._packed = _PackedProjections(self.q_proj, self.k_proj, self.v_proj)

    def _apply(self, fn: Any, recurse: bool = True) -> MultiHeadAttention:
        super()._apply(fn, recurse)  # .to(), .half(): each parameter gets a tensor of its own
        inputs = (self.q_proj, self.k_proj, self.v_proj)
        if not self._packed.holds(inputs):
            self._packed = _PackedProjections(*inputs)  # so pack them again
        return self

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        check_embeddings(query, key, value, self.q_proj.weight)
        H, G = self.num_heads, self.num_kv_heads
        packed, layers = self._packed, self._modules  # no gradient: one product per input
        if key is value and not torch.is_grad_enabled() and packed.holds(
                (layers["q_proj"], layers["k_proj"], layers["v_proj"])):
            if query is key:  # self-attention: H + 2G heads from one product, then cut
                qkv = F.linear(query, packed.weight, packed.bias)  # (B, n, E + 2 G Dh)
                q, k, v = split_heads(qkv, H + 2 * G).split_with_sizes((H, G, G), -3)  # (B, H|G, n, Dh)
            else:  # cross-attention: the context's keys and values from one product
                q = split_heads(self.q_proj(query), H)  # (B, H, n, Dh)
                kv = F.linear(key, packed.kv_weight, packed.kv_bias)  # (B, m, 2 G Dh)
                k, v = split_heads(kv, 2 * G).split_with_sizes((G, G), -3)  # (B, G, m, Dh)
        else:
            q = split_heads(self.q_proj(query), H)  # (B, H, n, Dh)
            k = split_heads(self.k_proj(key), G)  # (B, G, m, Dh)
            v = split_heads(self.v_proj(value), G)  # (B, G, m, Dh)
        if G != H:  # each key-value head serves H // G consecutive query heads
            k = k.repeat_interleave(H // G, dim=-3)  # (B, H, m, Dh)
            v = v.repeat_interleave(H // G, dim=-3)  # (B, H, m, Dh)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, 1, n, m): the same mask for every head
        out, weights = self.attention(q, k, v, mask)  # (B, H, n, Dh), (B, H, n, m)
        if self.training and self.dropout > 0.0:  # attention dropout
            if weights is None:
                name = getattr(self.attention, "__name__", "this attention function")
                raise ValueError(f"attention dropout drops weights, and {name} does "
                                 f"not form them: use dropout=0.0 with it")
            weights = F.dropout(weights, self.dropout)  # (B, H, n, m)
            out = weights @ v  # (B, H, n, Dh): the values mixed by the kept weights
        return self.out_proj(merge_heads(out)), weights  # (B, n, E), (B, H, n, m)
