"""attnkit: the reference implementation of the attention course.

One module per concept, in the order the book teaches them:

* :mod:`attnkit.attention`: ``softmax``, ``scaled_dot_product_attention`` (chapter 01)
* :mod:`attnkit.multihead`: ``split_heads``, ``merge_heads``, ``MultiHeadAttention`` (chapter 02)
* :mod:`attnkit.self_attention`: ``SelfAttention`` (chapter 03)
* :mod:`attnkit.masks`: ``causal_mask``, ``padding_mask`` (chapter 04)
* :mod:`attnkit.cross_attention`: ``CrossAttention`` (chapter 05)
* :mod:`attnkit.positional`: sinusoidal, learned and rotary position encodings (chapter 06)
* :mod:`attnkit.transformer`: ``FeedForward``, encoder and decoder blocks, ``Transformer`` (chapter 07)
* :mod:`attnkit.plotting`: attention heatmaps used throughout the book
"""

from attnkit.attention import scaled_dot_product_attention, softmax
from attnkit.device import default_device
from attnkit.masks import causal_mask, padding_mask
from attnkit.multihead import MultiHeadAttention, merge_heads, split_heads
from attnkit.self_attention import SelfAttention
from attnkit.cross_attention import CrossAttention
from attnkit.positional import (LearnedPositionalEmbedding, SinusoidalPositionalEncoding, apply_rotary_embedding,
                                position_shift_matrix, sinusoidal_positional_encoding)
from attnkit.transformer import FeedForward, Transformer, TransformerDecoderBlock, TransformerEncoderBlock
from attnkit.efficient import append_to_cache, cached_attention, linear_attention, tiled_attention  # chapter 08

__all__ = ["softmax", "scaled_dot_product_attention", "default_device",
           "split_heads", "merge_heads", "MultiHeadAttention", "SelfAttention", "causal_mask", "padding_mask"]
__all__ += ["CrossAttention", "sinusoidal_positional_encoding", "position_shift_matrix", "SinusoidalPositionalEncoding",
            "LearnedPositionalEmbedding", "apply_rotary_embedding",
            "FeedForward", "TransformerEncoderBlock", "TransformerDecoderBlock", "Transformer"]
__version__ = "0.1.0"
from attnkit.gpt import GPT, CharTokenizer, generate, sample_next  # chapter 09 (helper gpt)

__all__ += ["GPT", "CharTokenizer", "generate", "sample_next"]
