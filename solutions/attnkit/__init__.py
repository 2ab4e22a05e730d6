"""attnkit: the reference implementation of the attention course.

One module per concept, in the order the book teaches them. Each module may import
only the modules above it in this map (and torch); nothing imports ``bench`` or ``plotting``.

=======================  ==============================================================  =======
module                   its one job (public names)                                       chapter
=======================  ==============================================================  =======
``validation``           input checks and ``ShapeError`` (``check_inputs``,               all
                         ``check_mask``, ``check_tensors``); imports nothing of ours
``device``               ``default_device``: the one place a device is chosen             all
``attention``            ``softmax``, ``scaled_dot_product_attention`` (explicit)         01
``multihead``            ``split_heads``, ``merge_heads``, ``MultiHeadAttention``          02, 08
                         (attention function, ``num_kv_heads``, ``dropout``)
``self_attention``       ``SelfAttention``                                                03
``masks``                ``causal_mask``, ``padding_mask``, ``sliding_window_mask``        04, 03
``cross_attention``      ``CrossAttention``, ``context_padding_mask``                      05
``positional``           sinusoidal, learned, rotary positions; ALiBi                      06
                         (``alibi_slopes``, ``alibi_bias``, ``alibi_attention``)
``transformer``          ``FeedForward``, encoder and decoder blocks (built from           07
                         ``SelfAttention`` and ``CrossAttention``), ``Transformer``
``efficient``            ``fused_attention`` (the fast path), tiled attention, the KV     08
                         cache and its size, linear attention, ``peak_memory``
``torch_twins``          torch's layers holding our weights: ``to_torch_multihead``,       tests
                         ``to_torch_encoder_layer``, ``to_torch_decoder_layer``
``plotting``             ``plot_attention``, ``plot_heads`` (matplotlib)                  all
``bench``                ``python -m attnkit.bench``: the fast path against torch's       08
=======================  ==============================================================  =======

Every attention function has the signature ``(query, key, value, mask=None) -> (output, weights)``;
``MultiHeadAttention``, ``SelfAttention``, ``CrossAttention`` and the blocks take one as their
``attention=`` argument (``fused_attention`` returns ``None`` for the weights it never forms).
"""

from attnkit.validation import ShapeError, check_inputs, check_mask, check_tensors
from attnkit.device import default_device
from attnkit.attention import scaled_dot_product_attention, softmax
from attnkit.multihead import AttentionFn, MultiHeadAttention, merge_heads, split_heads
from attnkit.self_attention import SelfAttention
from attnkit.masks import causal_mask, padding_mask, sliding_window_mask
from attnkit.cross_attention import CrossAttention, context_padding_mask
from attnkit.positional import (LearnedPositionalEmbedding, SinusoidalPositionalEncoding, alibi_attention, alibi_bias,
                                alibi_slopes, apply_rotary_embedding, position_shift_matrix, sinusoidal_frequencies,
                                sinusoidal_positional_encoding)
from attnkit.transformer import FeedForward, Transformer, TransformerDecoderBlock, TransformerEncoderBlock
from attnkit.efficient import (append_to_cache, cached_attention, causal_linear_attention, elu_feature_map,
                               fused_attention, kv_cache_bytes_per_token, linear_attention, online_softmax_update,
                               peak_memory, tiled_attention)
from attnkit.torch_twins import to_torch_decoder_layer, to_torch_encoder_layer, to_torch_multihead

__all__ = [
    # validation
    "ShapeError", "check_inputs", "check_mask", "check_tensors",
    # device
    "default_device",
    # chapter 01
    "softmax", "scaled_dot_product_attention",
    # chapter 02
    "AttentionFn", "split_heads", "merge_heads", "MultiHeadAttention",
    # chapter 03
    "SelfAttention",
    # chapter 04
    "causal_mask", "padding_mask", "sliding_window_mask",
    # chapter 05
    "CrossAttention", "context_padding_mask",
    # chapter 06
    "sinusoidal_frequencies", "sinusoidal_positional_encoding", "position_shift_matrix",
    "SinusoidalPositionalEncoding", "LearnedPositionalEmbedding", "apply_rotary_embedding",
    "alibi_slopes", "alibi_bias", "alibi_attention",
    # chapter 07
    "FeedForward", "TransformerEncoderBlock", "TransformerDecoderBlock", "Transformer",
    # chapter 08
    "fused_attention", "online_softmax_update", "tiled_attention", "append_to_cache", "cached_attention",
    "kv_cache_bytes_per_token", "elu_feature_map", "linear_attention", "causal_linear_attention", "peak_memory",
    # oracles
    "to_torch_multihead", "to_torch_encoder_layer", "to_torch_decoder_layer",
]
__version__ = "0.1.0"
