"""Choosing where to run: the one place the course decides on a device."""

from __future__ import annotations

import torch

__all__ = ["default_device"]


def default_device() -> torch.device:
    """``cuda`` when a GPU is available, else ``cpu``. Notebooks call this once in their setup cell."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
