"""Exercise 09's fixtures: a language model whose outputs show whether it was used with a cache, and a generator.

The checks of ``autograder/judging/checks/ch09_tiny_gpt.py`` use this module twice: they run it here, in the
judge's process, to compute every reference (greedy tokens, the logits of each step), and they send
its text into the student's process (``Trial.trusted``), where it is executed into a fresh namespace
of its own; the objects built there are what the student's ``generate`` and ``sample_next`` receive.
Nothing is looked up by name among the student's definitions, so a ``TinyLM`` or ``seeded_generator``
redefined in a cell changes nothing.

It imports only ``math`` and ``torch``: it runs in the sandbox too.
"""

from __future__ import annotations

import math

import torch


class CacheProbeLM(torch.nn.Module):
    """The notebook's ``TinyLM`` (one causal attention layer, learned positions, a key-value cache), marked
    so that its outputs show whether the cache was used.

    ``model(tokens, cache=None) -> (logits, cache)`` as ``TinyLM``: ``tokens`` ``(B, s)`` are the ``s``
    positions after the ``t`` whose keys and values ``cache`` holds; ``logits`` ``(B, s, V)``; the cache
    returned, ``(keys, values)`` each ``(B, t + s, D)``, holds all ``t + s`` positions.

    The mark: a token at a position ``p >= prompt_len`` (a generated one) is known only once the logits
    at ``p - 1`` are, so a loop that uses the cache feeds it alone, in a call of one token. Such a call
    gives it the positional vector ``pos[p]``. A call of several tokens that computes such a position
    (the whole sequence recomputed without the cache, the token fed again together with others) gives it
    ``recomputed[p]``, a different vector: its key, value and logits change, and so do the tokens drawn
    after it. Prompt positions get ``pos[p]`` however the prompt is fed (at once, in pieces, a token at
    a time). So greedy generation that uses the cache gives the same tokens as recomputing everything on
    ``TinyLM``, and a loop that recomputes gives other tokens.

    ``call_log()`` lists ``(s, t)`` of every call, as ``TinyLM``'s does, to help a student debug; nothing
    is graded from it (it lives in the student's process).
    """

    def __init__(self, prompt_len: int, vocab_size: int = 12, dim: int = 16, max_len: int = 64, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(int(seed))
        self.prompt_len, self.max_len = int(prompt_len), int(max_len)
        self.embed = torch.nn.Parameter(torch.randn(vocab_size, dim, generator=g))
        pos = torch.randn(max_len, dim, generator=g)
        self.pos = torch.nn.Parameter(pos)
        self.recomputed = torch.nn.Parameter(pos + 2.0 * torch.randn(max_len, dim, generator=g))
        self.proj = torch.nn.Parameter(torch.randn(3, dim, dim, generator=g) / math.sqrt(dim))
        # logits of order 1: sampling with a temperature near 1 has several likely tokens to draw from
        self.out = torch.nn.Parameter(torch.randn(dim, vocab_size, generator=g) / math.sqrt(dim))
        self.calls: list[tuple[int, int]] = []

    def positions(self, t: int, s: int) -> torch.Tensor:
        """The positional vectors of the ``s`` positions ``t .. t + s - 1`` fed in one call: ``(s, D)``."""
        if t + s > self.max_len:
            raise ValueError(f"the model was fed {s} token(s) after a cache of {t} positions: {t + s} positions, more "
                             f"than the {self.max_len} it has. Pass back exactly the cache the model returned (it "
                             "already holds the new keys and values) and feed only the newest token")
        pos = self.pos[t:t + s]
        if s > 1 and t + s > self.prompt_len:
            first = max(self.prompt_len - t, 0)  # the first generated position of this call, counted from t
            pos = torch.cat([pos[:first], self.recomputed[t + first:t + s]])
        return pos

    def forward(self, tokens: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        t = 0 if cache is None else cache[0].shape[1]
        s = tokens.shape[1]
        self.calls.append((s, t))
        x = self.embed[tokens] + self.positions(t, s)            # (B, s, D)
        q, k, v = (x @ w for w in self.proj)                     # (B, s, D) each
        if cache is not None:
            k = torch.cat([cache[0], k], dim=1)                  # (B, t + s, D)
            v = torch.cat([cache[1], v], dim=1)                  # (B, t + s, D)
        allowed = torch.ones(s, t + s, dtype=torch.bool, device=tokens.device).tril(t)
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])  # (B, s, t + s)
        scores = scores.masked_fill(~allowed, float("-inf"))
        h = x + torch.softmax(scores, dim=-1) @ v                # (B, s, D)
        return h @ self.out, (k, v)                              # (B, s, V)

    def call_log(self) -> list[tuple[int, int]]:
        """``(s, t)`` of every call: ``s`` new tokens after ``t`` cached ones (not graded)."""
        return list(self.calls)


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed``."""
    return torch.Generator().manual_seed(int(seed))
