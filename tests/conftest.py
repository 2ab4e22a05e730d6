"""Shared fixtures: the repository paths and a helper that runs a suite on code in this process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Triton chooses between its interpreter and its compiler when it is first imported: without a GPU, chapter 10's
# setup cell asks for the interpreter, which it only gets if no earlier test imported triton first (ch04's did).
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover - the course needs torch
    pass


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
