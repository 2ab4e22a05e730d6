"""Exercise 09's fixtures, run twice: here, in the judge, for every reference, and from this text in a fresh namespace
of their own in the student's process (``Trial.trusted``), where they are what the student's ``generate`` and
``sample_next`` receive (a ``TinyLM`` or ``seeded_generator`` redefined in a cell changes nothing). It imports only
``math`` and ``torch``: it runs in the sandbox too."""

from __future__ import annotations

import math

import torch


class CacheProbeLM(torch.nn.Module):
    """The notebook's ``TinyLM`` (``model(tokens, cache=None) -> (logits, cache)``: one causal attention layer,
    learned positions, a key-value cache) with a mark that shows whether the cache was used. A generated position
    ``p >= prompt_len`` fed alone (as a cached loop does: its token is known only once the logits at ``p - 1`` are)
    gets the positional vector ``pos[p]``; computed in a call of several tokens (recomputed without the cache, or fed
    again with others) it gets ``recomputed[p]``, and the tokens drawn after it change. Prompt positions get ``pos[p]``
    however they are fed. ``call_log()`` lists ``(s, t)`` of every call for a student to debug with (not graded: it
    lives in the student's process)."""

    def __init__(self, prompt_len: int, vocab_size: int = 12, dim: int = 16, max_len: int = 64, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(int(seed))
        self.prompt_len, self.max_len = int(prompt_len), int(max_len)
        self.embed = torch.nn.Parameter(torch.randn(vocab_size, dim, generator=g))
        self.pos = torch.nn.Parameter(torch.randn(max_len, dim, generator=g))
        self.recomputed = torch.nn.Parameter(self.pos.detach() + 2.0 * torch.randn(max_len, dim, generator=g))
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
