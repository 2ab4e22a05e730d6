"""The names of torch's own attention (and of any other operator an exercise bans), in one place.

Both layers of the authorship defence read these lists: the static scan of the student's
code (:mod:`autograder.judging.authorship`, in the grading process) and the run-time guard of the
harness (:mod:`autograder.in_sandbox.harness`, in the sandbox), which makes the aten operators whose
names match refuse to run during a judged call.

This module is copied into the sandbox next to the harness, so it imports only the
standard library.
"""

from __future__ import annotations

from collections.abc import Iterable

# Python names of torch's attention, with what they are (the static scan's exact matches).
TORCH_ATTENTION = {
    "scaled_dot_product_attention": "torch's scaled_dot_product_attention",
    "multi_head_attention_forward": "torch's multi_head_attention_forward",
    "_native_multi_head_attention": "torch's native multi-head attention",
    "MultiheadAttention": "torch.nn.MultiheadAttention",
    "TransformerEncoderLayer": "torch.nn.TransformerEncoderLayer",
    "TransformerDecoderLayer": "torch.nn.TransformerDecoderLayer",
    "TransformerEncoder": "torch.nn.TransformerEncoder",
    "TransformerDecoder": "torch.nn.TransformerDecoder",
    "Transformer": "torch.nn.Transformer",
    # attention written in Python inside torch, reaching no attention operator: the scan's name is its ban
    "flex_attention": "torch's flex_attention",
}

# Any name containing one of these is torch's attention too: the aten operators that compute it
# (torch.ops.aten._scaled_dot_product_attention_math, _scaled_dot_product_flash_attention_for_cpu,
# _native_multi_head_attention, ...). Reached through torch.ops.aten, the C bindings, fast paths and
# decompositions alike, attention ends in one of them, whatever Python name led there.
ATEN_ATTENTION = ("scaled_dot_product", "multi_head_attention", "_transformer_encoder_layer", "scaled_dot_attention",
                  "_flash_attention", "_efficient_attention", "_cudnn_attention")

# torch.nn modules whose forward computes attention without reaching an attention operator
# (nn.MultiheadAttention with need_weights=True multiplies and softmaxes by hand).
ATTENTION_MODULES = ("MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer", "Transformer")

# The dispatch keys whose kernels a guard replaces (only those an operator has: the others keep their
# defaults). Backends with their own kernels (mkldnn, nested, sparse, quantized) are included, so a
# tensor converted to another layout does not slip past.
GUARD_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
              "CPU", "CUDA", "MPS", "XPU", "MkldnnCPU", "NestedTensorCPU", "NestedTensorCUDA", "SparseCPU",
              "SparseCUDA", "SparseCsrCPU", "SparseCsrCUDA", "QuantizedCPU", "QuantizedCUDA",
              "AutocastCPU", "AutocastCUDA")

# Lower-cased, underscore-free fragments that every banned name of an exercise maps to at run time:
# a ban on "softmax" (or "Softmax", "log_softmax", "softmin") refuses every aten operator whose name
# contains "softmax" (_softmax, _log_softmax, _safe_softmax, _masked_softmax, special_softmax, the
# sparse ones and the backward kernels). Bans that are Python names only (Categorical,
# logits_to_probs) reach these operators anyway.
RUNTIME_FRAGMENTS = {"softmin": "softmax", "logsoftmax": "softmax", "logitstoprobs": "softmax",
                     "categorical": "softmax"}


def squash(name: str) -> str:
    """``name`` lower-cased without underscores: the form in which names are compared."""
    return name.lower().replace("_", "")


def is_torch_attention(name: str) -> str | None:
    """What torch attention ``name`` (an attribute or imported name) is, if it is one."""
    if name in TORCH_ATTENTION:
        return TORCH_ATTENTION[name]
    if any(s in name for s in ATEN_ATTENTION):
        return f"torch's {name}"
    return None


IMPORT = "import:"  # a ban ``import:LIB`` refuses importing LIB and its submodules (a library outside the vocabulary)
NAMESPACE = "namespace:"  # a ban ``namespace:NS`` refuses every operator of the dispatcher's namespace NS (``onnx``)


CLASS = "class:"  # a ban ``class:NAME`` refuses every aten operator of a class of :data:`CLASSES` (what it computes)

# The aten operators that contract (each output element a sum of products of two operands' elements over a shared
# dimension, in one kernel), named by the tokens of their names (split at underscores): every public product of torch
# ends in one of them (torch.mm, matmul, ``@``, einsum, tensordot, inner, outer, kron, linalg.multi_dot, linalg.vecdot,
# F.linear, F.bilinear, the convolutions, cdist, embedding bags with weights, the quantized, sparse and scaled
# products). Tokens, not fragments: "mm" as a fragment would also refuse cummax, "dot" the attention's names.
# ``tests/test_ch10_grading.py`` proves each public product refused and sorts every operator whose name looks like a
# product into this class or a short list of the operators that only look like one.
CONTRACTION_TOKENS = frozenset({
    # matrix and vector products, plain, batched, fused with an addition, sparse, quantized, scaled, grouped
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "mv", "dot", "vdot", "vecdot", "addr", "ger", "outer",
    "inner", "matmul", "gemm", "smm", "spmm", "hspmm", "sspaddmm", "einsum", "tensordot", "kron",
    # linear maps: y = x W^T + b and its kinds (F.linear, F.bilinear's _trilinear, linear combinations)
    "linear", "bilinear", "trilinear",
    # convolutions (a product with a sliding window of the weights), of every backend
    "conv", "conv1d", "conv2d", "conv3d", "convolution", "depthwise2d", "depthwise3d",
    # pairwise distances (|q|^2 + |k|^2 - 2 q.k) and similarities, and weighted sums of rows (p @ V as a bag)
    "cdist", "pdist", "euclidean", "similarity", "bag",
})
CLASSES = {"contraction": CONTRACTION_TOKENS}


def op_tokens(base: str) -> set[str]:
    """The tokens of an operator's base name: lower-cased, split at underscores (``_int_mm`` -> {"int", "mm"})."""
    return {t for t in base.lower().split("_") if t}


def op_class(base: str) -> str:
    """The class of :data:`CLASSES` an aten operator (its base name, ``mm``, ``_scaled_mm``) belongs to, or ''."""
    tokens = op_tokens(base)
    return next((name for name, members in CLASSES.items() if tokens & members), "")


def runtime_fragments(banned: Iterable[str]) -> list[str]:
    """The squashed fragments an operator's name must contain to be refused, for a part's banned names; a ban
    ``import:LIB`` (a library outside the part's vocabulary), ``namespace:NS`` (a dispatcher namespace) or
    ``class:NAME`` (a class of operators) is kept as it is. An unknown class is an error, not a ban that refuses
    nothing."""
    for b in banned:
        if b.startswith(CLASS) and b[len(CLASS):] not in CLASSES:
            raise ValueError(f"unknown class of operators {b!r}: the classes are "
                             f"{', '.join(CLASS + c for c in CLASSES)}")
    return sorted({b if b.startswith((IMPORT, NAMESPACE, CLASS)) else RUNTIME_FRAGMENTS.get(squash(b), squash(b))
                   for b in banned if squash(b)})


def refused_imports(fragments: Iterable[str]) -> tuple[str, ...]:
    """The libraries whose import a process banned for ``fragments`` refuses."""
    return tuple(sorted(f[len(IMPORT):] for f in fragments if f.startswith(IMPORT)))


def matching_ops(op_names: Iterable[str], fragments: Iterable[str]) -> list[str]:
    """The aten operators (``aten::name.overload``, as the dispatcher lists them) a guard refuses:
    those whose base name contains one of ``fragments`` (squashed) or an attention fragment (raw), those of a
    class ``class:NAME`` and every operator of a namespace ``namespace:NS`` among ``fragments``."""
    fragments = list(fragments)
    namespaces = tuple(f[len(NAMESPACE):] + "::" for f in fragments if f.startswith(NAMESPACE))
    classes = [CLASSES[f[len(CLASS):]] for f in fragments if f.startswith(CLASS)]
    fragments = [f for f in fragments if not f.startswith((IMPORT, NAMESPACE, CLASS))]
    found = []
    for full in op_names:
        if namespaces and full.startswith(namespaces):
            found.append(full)
            continue
        if not full.startswith("aten::"):
            continue
        base = full[len("aten::"):].split(".")[0]
        if any(f in squash(base) for f in fragments) or any(s in base for s in ATEN_ATTENTION) or \
                any(op_tokens(base) & members for members in classes):
            found.append(full)
    return sorted(found)
