"""attnkit: the reference implementation of the attention course.

One module per concept, in the order the book teaches them. A module may import
only modules listed above it (and torch); nothing in the package imports
``torch_twins``, ``plotting``, ``bench``, ``flash_triton`` or ``vocabulary``. Every name below is exported here,
but those of the modules marked "not imported here".

``validation`` (all chapters)
    Input checks, one exception type for bad shapes; imports nothing of ours.
    ``ShapeError`` (a ``ValueError``), ``check_tensors``, ``check_mask``,
    ``check_inputs``, ``check_embeddings``.
``device`` (all chapters)
    The one place a device is chosen: ``default_device``.
``attention`` (chapter 01)
    ``softmax``, ``scaled_dot_product_attention`` (explicit, always
    ``(output, weights)``).
``multihead`` (chapter 02; ``num_kv_heads`` chapter 08)
    ``split_heads``, ``merge_heads``, ``MultiHeadAttention`` (its ``attention=``
    function, grouped-query ``num_kv_heads``, attention ``dropout``), the types
    ``AttentionFn`` and ``AttentionOptions`` (the keyword arguments the layers
    built on it pass on).
``self_attention`` (chapter 03)
    ``SelfAttention``.
``masks`` (chapter 04; the sliding window chapters 03 and 08)
    ``causal_mask``, ``padding_mask``, ``sliding_window_mask``.
``cross_attention`` (chapter 05)
    ``CrossAttention``, ``context_padding_mask``.
``positional`` (chapter 06)
    ``sinusoidal_frequencies``, ``sinusoidal_positional_encoding``,
    ``position_shift_matrix``, ``SinusoidalPositionalEncoding``,
    ``LearnedPositionalEmbedding``, ``apply_rotary_embedding``, ALiBi's
    ``alibi_slopes``, ``alibi_bias``, ``alibi_attention``.
``transformer`` (chapter 07)
    ``FeedForward``, ``TransformerEncoderBlock``, ``TransformerDecoderBlock`` (built
    from ``SelfAttention`` and ``CrossAttention``), ``Transformer``.
``efficient`` (chapter 08)
    ``fused_attention`` (torch's fused kernel, the fast path), ``online_softmax_update``,
    ``tiled_attention``, ``append_to_cache``, ``cached_attention``,
    ``kv_cache_bytes_per_token``, ``elu_feature_map``, ``linear_attention``,
    ``causal_linear_attention``, ``peak_memory``.
``text`` (chapter 09)
    The text and the tokenizer: ``shakespeare_corpus`` (shipped with the package,
    ``CORPUS_PATH``), ``CharTokenizer``.
``gpt`` (chapter 09)
    A decoder-only language model from chapter 07's blocks: ``GPT`` (its ``POSITIONS``
    schemes, ALiBi's included; ``INITS``, ``GPT(init=...)``; ``feed_forward=False`` builds an
    attention-only model), ``language_model_loss``, ``sample_next``, ``generate`` (with chapter
    08's cache), the model scored on the n-grams' characters, ``windowed_bits_per_char``, and
    the chapter's checkpoint, shipped with the package: ``load_tiny_gpt``, ``TINY_GPT_PATH``.
``ngram`` (chapter 09)
    The counting baseline: ``ngram_bits_per_char``.
``probes`` (chapter 09)
    What a head does: ``previous_token_scores``, ``repeated_random_tokens`` (the in-context
    loss curve).
``induction`` (chapter 09)
    Induction heads grown and proven: ``RepeatedBatch``, ``repeated_block_batch`` (a block
    repeated at a random offset), ``second_copy_queries``, the per-sequence
    ``induction_score`` and the foolable ``fixed_offset_induction_score``,
    ``second_copy_bits``, ``attention_only_gpt``, ``head_mask``, ``measure``,
    ``train_on_repeats`` and what it records, ``InductionHistory``; the circuit writing,
    ``complete_copies`` and its ``Completion``.
``torch_twins`` (the tests, the checks, the benchmark)
    torch's layers holding our weights: ``to_torch_multihead``,
    ``to_torch_encoder_layer``, ``to_torch_decoder_layer``.
``plotting`` (all chapters; not imported here)
    ``plot_attention``, ``plot_heads``.
``bench`` (chapter 08; not imported here)
    ``python -m attnkit.bench``: the fast path timed against torch's modules.
``flash_triton`` (chapter 10; not imported here: it needs Triton, and picks Triton's
    interpreter when there is no GPU, before importing Triton)
    ``flash_forward_kernel`` (the ``@triton.jit`` forward), ``flash_backward_kernel``,
    ``flash_attention`` (differentiable), ``flash_attention_forward`` (with the
    log-sum-exp), ``INTERPRETED``;
    ``python -m attnkit.flash_triton --bench`` times it against torch's attention on a GPU.
``vocabulary`` (every exercise; not imported here)
    What each graded part may call, one table for the exercise's text, its visible
    tests and the grader: ``Vocabulary``, ``VOCABULARIES``, ``vocabulary``, ``describe``,
    ``outside``, ``check_vocabulary``.

Every attention function has the signature ``(query, key, value, mask=None) ->
(output, weights)``; ``MultiHeadAttention``, ``SelfAttention``, ``CrossAttention``
and the blocks take one as their ``attention=`` argument (``fused_attention``
returns ``None`` for the weights it never forms, so a layer built with it and
attention ``dropout > 0`` raises ``ValueError`` in training mode: there are no
weights to drop). No flag changes a return type.
"""

from attnkit.validation import ShapeError, check_embeddings, check_inputs, check_mask, check_tensors
from attnkit.device import default_device
from attnkit.attention import scaled_dot_product_attention, softmax
from attnkit.multihead import (AttentionFn, AttentionOptions, MultiHeadAttention, merge_heads,
                              split_heads)
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
from attnkit.text import CORPUS_PATH, CharTokenizer, shakespeare_corpus
from attnkit.gpt import (GPT, INITS, POSITIONS, TINY_GPT_PATH, generate, language_model_loss, load_tiny_gpt,
                         sample_next, windowed_bits_per_char)
from attnkit.ngram import ngram_bits_per_char
from attnkit.probes import previous_token_scores, repeated_random_tokens
from attnkit.induction import (Completion, InductionHistory, complete_copies, RepeatedBatch, attention_only_gpt, fixed_offset_induction_score, head_mask,
                               induction_score, measure, repeated_block_batch, second_copy_bits,
                               second_copy_queries, train_on_repeats)
from attnkit.torch_twins import to_torch_decoder_layer, to_torch_encoder_layer, to_torch_multihead

__all__ = [
    # validation
    "ShapeError", "check_tensors", "check_mask", "check_inputs", "check_embeddings",
    # device
    "default_device",
    # chapter 01
    "softmax", "scaled_dot_product_attention",
    # chapter 02
    "AttentionFn", "AttentionOptions", "split_heads", "merge_heads", "MultiHeadAttention",
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
    # chapter 09
    "CORPUS_PATH", "shakespeare_corpus", "CharTokenizer", "POSITIONS", "GPT", "TINY_GPT_PATH", "load_tiny_gpt", "language_model_loss", "sample_next", "generate",
    "ngram_bits_per_char", "previous_token_scores", "repeated_random_tokens", "INITS",
    "windowed_bits_per_char",
    "RepeatedBatch", "repeated_block_batch", "second_copy_queries", "induction_score",
    "fixed_offset_induction_score", "second_copy_bits", "attention_only_gpt", "head_mask", "measure",
    "train_on_repeats", "InductionHistory", "Completion", "complete_copies",
    # oracles
    "to_torch_multihead", "to_torch_encoder_layer", "to_torch_decoder_layer",
]
__version__ = "0.1.0"
