"""Plots every chapter reuses: attention-weight heatmaps (chapter 01 onwards)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["plot_attention", "plot_heads"]


def _as_array(weights: torch.Tensor | np.ndarray, shape: str) -> np.ndarray:
    """``weights`` as a NumPy array with as many axes as ``shape`` names, e.g. ``"(n_queries, n_keys)"``."""
    w = weights.detach().cpu().float().numpy() if isinstance(weights, torch.Tensor) else np.asarray(weights)
    if w.ndim != shape.count(",") + 1:
        raise ValueError(f"expected attention weights of shape {shape}, got shape {w.shape}")
    return w


def plot_attention(
    weights: torch.Tensor | np.ndarray,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool = False,
    colorbar: bool = True,
) -> Axes:
    """Draw one attention-weight matrix ``(n_queries, n_keys)`` as a heatmap.

    Rows are queries, columns are keys; darker cells carry more weight. With
    ``annotate=True`` each cell shows its weight (useful for small matrices).
    Returns the axes so callers can add to the figure.
    """
    w = _as_array(weights, "(n_queries, n_keys)")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * w.shape[1] + 2, 0.45 * w.shape[0] + 1.5))
    im = ax.imshow(w, cmap="Blues", vmin=0.0, vmax=max(1e-9, float(w.max())), aspect="auto")
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if key_labels is not None:
        ax.set_xticks(range(w.shape[1]), list(key_labels), rotation=90 if w.shape[1] > 8 else 0)
    if query_labels is not None:
        ax.set_yticks(range(w.shape[0]), list(query_labels))
    if annotate:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center",
                        color="white" if w[i, j] > 0.6 * w.max() else "black", fontsize=8)
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def plot_heads(
    weights: torch.Tensor | np.ndarray,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Draw the weights of every head, ``(num_heads, n_queries, n_keys)``, side by side."""
    w = _as_array(weights, "(num_heads, n_queries, n_keys)")
    h = w.shape[0]
    fig, axes = plt.subplots(1, h, figsize=(2.6 * h + 1, 2.8), squeeze=False)
    for i, ax in enumerate(axes[0]):
        plot_attention(w[i], query_labels, key_labels, ax=ax, title=f"head {i}", colorbar=False)
        if i:
            ax.set_ylabel("")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
