"""Graded checks for exercise 06_positional_encoding: the sinusoidal table, the shift matrix, learned embeddings."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnkit import position_shift_matrix as ref_shift
from attnkit import sinusoidal_positional_encoding as ref_pe
from autograder.checks import CheckFailed, StudentError, Suite, Trial, close, expect_close, expect_tensor

SUITE = Suite("06_positional_encoding")
PE, SHIFT, LEARNED = "sinusoidal_positional_encoding", "position_shift_matrix", "LearnedPositionalEmbedding"
PE_FROM_1 = ("the positions start at 1: row i is position i, counted from 0 (torch.arange(num_positions)), so row 0 "
             "is [sin 0, cos 0, ...] = [0, 1, 0, 1, ...]")
LEARNED_FROM_1 = ("the positions start at 1: the row of position i is table[i], counted from 0, so a sequence of "
                  "n positions uses rows 0..n-1 (torch.arange(n))")


def _expect_value_error(call: Callable[[], object], what: str, hint: str) -> None:
    """``call()`` must raise ValueError in the student's code."""
    try:
        result = call()
    except StudentError as e:
        msg = str(e)
        if msg.startswith("not implemented"):
            raise
        if msg.startswith("your code raised ValueError"):
            return
        raise CheckFailed(f"{what} should raise a ValueError that says why; {msg}. {hint}") from None
    shape = tuple(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
    raise CheckFailed(f"{what} silently returned {shape}; it should raise a ValueError. {hint}")


# -- the sinusoidal table -------------------------------------------------------------------------


def _table(n: int, d: int, freq: Callable[[torch.Tensor], torch.Tensor], sin_first: bool = True,
           start: int = 0) -> torch.Tensor:
    """An interleaved sin/cos table with the pair frequencies ``freq(j)``, for positions start..start+n-1."""
    i = torch.arange(start, start + n, dtype=torch.float64)[:, None]
    a = i * freq(torch.arange(d // 2, dtype=torch.float64))  # (n, d/2)
    first, second = (a.sin(), a.cos()) if sin_first else (a.cos(), a.sin())
    return torch.stack([first, second], -1).reshape(n, d)


def _pe_mistakes(n: int, d: int) -> dict[str, torch.Tensor]:
    i = torch.arange(n, dtype=torch.float64)[:, None]
    c = torch.arange(d, dtype=torch.float64)
    per_column = i * 10000.0 ** (-c / d)  # each column its own frequency
    per_column = torch.where(c.long() % 2 == 0, per_column.sin(), per_column.cos())
    a = i * 10000.0 ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)
    return {
        "sin and cos are swapped: even columns 2j hold sin(i w_j), odd columns 2j+1 hold cos(i w_j)":
            _table(n, d, lambda j: 10000.0 ** (-2 * j / d), sin_first=False),
        "the frequency exponent is missing its factor 2: w_j = 10000^(-2j/dim), with j counting sin/cos pairs":
            _table(n, d, lambda j: 10000.0 ** (-j / d)),
        "the frequency exponent uses the column index 2j where it needs the pair index j: w_j = 10000^(-2j/dim), "
        "so the pair in columns (2j, 2j+1) uses j, not 2j":
            _table(n, d, lambda j: 10000.0 ** (-4 * j / d)),
        "the frequency exponent has the wrong sign: w_j = 10000^(-2j/dim) shrinks as j grows (10000^(+2j/dim) grows)":
            _table(n, d, lambda j: 10000.0 ** (2 * j / d)),
        "each column got its own frequency 10000^(-c/dim); the sin and cos of pair j share one frequency "
        "w_j = 10000^(-2j/dim)": per_column,
        "sin fills the first half of the columns and cos the second; they must interleave: column 2j is sin, 2j+1 cos":
            torch.cat([a.sin(), a.cos()], -1),
        "the base is 1000; the frequencies are w_j = 10000^(-2j/dim)": _table(n, d, lambda j: 1000.0 ** (-2 * j / d)),
        PE_FROM_1: _table(n, d, lambda j: 10000.0 ** (-2 * j / d), start=1),
    }


@SUITE.check("test_sinusoidal_shape", parts=[PE])
def sinusoidal_shape(t: Trial) -> None:
    """Shape (num_positions, dim), floating point; position 0 is [0, 1, 0, 1, ...]."""
    for n, d in [(5, 4), (1, 2), (17, 10)]:
        P = expect_tensor(t.call(PE, n, d), (n, d), f"sinusoidal_positional_encoding({n}, {d})")
        if not P.is_floating_point():
            raise CheckFailed(f"sinusoidal_positional_encoding({n}, {d}) has dtype {P.dtype}; it should be floating point")
    expect_close(P[0], torch.tensor([0.0, 1.0] * 5), "row 0 (position 0) of the table",
                 {"sin and cos are swapped: position 0 is sin(0) = 0 in even columns and cos(0) = 1 in odd ones":
                  torch.tensor([1.0, 0.0] * 5), PE_FROM_1: ref_pe(2, 10, dtype=torch.float64)[1]})


@SUITE.check("test_sinusoidal_values", parts=[PE])
def sinusoidal_values(t: Trial) -> None:
    """Every entry equals sin(i w_j) / cos(i w_j) with w_j = 10000^(-2j/dim), for several sizes."""
    for n, d in [(12, 8), (60, 32), (7, 6)]:
        expect_close(t.call(PE, n, d), ref_pe(n, d, dtype=torch.float64),
                     f"sinusoidal_positional_encoding({n}, {d})", _pe_mistakes(n, d), atol=2e-4)


@SUITE.check("test_sinusoidal_odd_dim", parts=[PE])
def sinusoidal_odd_dim(t: Trial) -> None:
    """An odd dim raises a ValueError (the columns come in sin/cos pairs)."""
    for d in (5, 1):
        _expect_value_error(lambda: t.call(PE, 4, d), f"sinusoidal_positional_encoding(4, {d})",
                            "With an odd dim the last sin column would have no cos partner: check dim % 2 first")
    # the smallest even dim still works (its values are test_sinusoidal_values' business)
    expect_tensor(t.call(PE, 3, 2), (3, 2), "sinusoidal_positional_encoding(3, 2) (the smallest even dim must work)")


# -- the shift matrix -----------------------------------------------------------------------------


def _rotation(delta: int, d: int, w: torch.Tensor) -> torch.Tensor:
    """The block-diagonal shift matrix (row-vector convention) with pair frequencies ``w``."""
    c, s = torch.cos(delta * w), torch.sin(delta * w)
    return torch.block_diag(*[torch.stack([torch.stack([c[j], -s[j]]), torch.stack([s[j], c[j]])])
                              for j in range(d // 2)])


def _shift_mistakes(delta: int, d: int) -> dict[str, torch.Tensor]:
    M = ref_shift(delta, d, dtype=torch.float64)
    j = torch.arange(d // 2, dtype=torch.float64)
    return {
        "the rotation frequencies are missing the factor 2: block j turns by delta * w_j with "
        "w_j = 10000^(-2j/dim), the frequency of the table's pair j": _rotation(delta, d, 10000.0 ** (-j / d)),
        "the rotation frequencies use the column index 2j where the pair index j belongs: block j turns by "
        "delta * w_j with w_j = 10000^(-2j/dim)": _rotation(delta, d, 10000.0 ** (-4 * j / d)),
        "M rotates the wrong way: P[i] @ M gives P[i - delta]. For row vectors, block j is "
        "[[cos(delta w_j), -sin(delta w_j)], [sin(delta w_j), cos(delta w_j)]]; you built its transpose "
        "(the column-vector rotation)": M.T,
        "the rotation angles ignore delta: block j turns by delta * w_j, not w_j": ref_shift(1, d, dtype=torch.float64),
    }


@SUITE.check("test_shift_matrix_shape", parts=[SHIFT])
def shift_matrix_shape(t: Trial) -> None:
    """Shape (dim, dim); delta = 0 gives the identity; M is block diagonal with 2x2 blocks."""
    expect_close(t.call(SHIFT, 0, 6), torch.eye(6), "position_shift_matrix(0, 6) (a shift by 0 changes nothing)")
    M = expect_tensor(t.call(SHIFT, 3, 8), (8, 8), "position_shift_matrix(3, 8)")
    block = torch.block_diag(*[torch.ones(2, 2)] * 4).bool()
    if M.to(torch.float64)[~block].abs().max() > 1e-6:
        raise CheckFailed("position_shift_matrix(3, 8) has non-zero entries outside the 2x2 diagonal blocks: each "
                          "sin/cos pair (columns 2j, 2j+1) rotates on its own")


@SUITE.check("test_shift_matrix_property", parts=[SHIFT])
def shift_matrix_property(t: Trial) -> None:
    """P[i + delta] = P[i] @ M for every position i, several offsets (including negative) and widths."""
    for delta, d in [(1, 4), (5, 16), (-3, 8), (int(t.randint(10, 60, (1,))), 12)]:
        n = 40
        P = ref_pe(n + abs(delta), d, dtype=torch.float64)
        M = expect_tensor(t.call(SHIFT, delta, d), (d, d), f"position_shift_matrix({delta}, {d})")
        i = torch.arange(max(0, -delta), n)
        shifted = P[i] @ M.to(torch.float64)
        wrong = {msg: P[i] @ W for msg, W in _shift_mistakes(delta, d).items()}
        expect_close(shifted, P[i + delta], f"P[i] @ position_shift_matrix({delta}, {d}) (should be P[i + {delta}])",
                     wrong, atol=2e-4)


# -- learned embeddings ---------------------------------------------------------------------------


def _table_of(obj, max_len: int, dim: int) -> tuple[str, torch.Tensor]:
    found = [(k, v) for k, v in obj.params().items() if tuple(v.shape) == (max_len, dim)]
    if len(found) != 1:
        raise CheckFailed(f"LearnedPositionalEmbedding({max_len}, {dim}) should hold one learned table of shape "
                          f"({max_len}, {dim}) (for example nn.Embedding({max_len}, {dim})); found "
                          f"{len(found)} parameter(s) of that shape")
    return found[0]


def _learned_mistakes(x: torch.Tensor, table: torch.Tensor) -> dict[str, torch.Tensor]:
    n = x.shape[-2]
    from_1 = {LEARNED_FROM_1: x + table[torch.arange(1, n + 1).clamp_max(table.shape[0] - 1)]}
    return {
        **from_1,
        "it returns the position rows without adding x: forward must return x + the row of each position":
            table[:n].expand_as(x).clone(),
        "every position got the same row: the positions run along axis -2 (x.shape[-2] or x.shape[1]), "
        "not the batch axis 0": x + table[0],
    }


@SUITE.check("test_learned_embedding", parts=[LEARNED])
def learned_embedding(t: Trial) -> None:
    """forward(x) = x + table[:n] for (B, n, dim) inputs, with the module's own table and with loaded weights."""
    max_len, dim = 12, 6
    obj = t.new(LEARNED, max_len, dim)
    name, table = _table_of(obj, max_len, dim)
    for b, n in [(1, 5), (3, 7), (2, max_len)]:
        x = t.randn(b, n, dim)
        expect_close(obj(x), x + table[:n], f"LearnedPositionalEmbedding({max_len}, {dim}) on x of shape {(b, n, dim)}",
                     _learned_mistakes(x, table))
    new = t.randn(max_len, dim)
    obj.load({name: new})
    x = t.randn(2, 4, dim)
    expect_close(obj(x), x + new[:4], "the output after loading a new table into the module (forward must use the "
                 "module's own learned table)", _learned_mistakes(x, new))


@SUITE.check("test_learned_embedding_max_len", parts=[LEARNED])
def learned_embedding_max_len(t: Trial) -> None:
    """Sequences up to max_len work; a longer one raises a ValueError (there is no learned row for it)."""
    obj = t.new(LEARNED, 5, 4)
    _, table = _table_of(obj, 5, 4)
    x = t.randn(2, 5, 4)
    try:
        out = obj(x)
    except StudentError as err:
        if not str(err).startswith("not implemented"):
            short = t.randn(2, 3, 4)
            try:
                from_1 = close(obj(short), short + table[1:4])
            except CheckFailed:
                from_1 = False
            if from_1:
                raise CheckFailed(f"a sequence of exactly max_len = 5 positions fails ({err}): {LEARNED_FROM_1}") from None
        raise
    expect_close(out, x + table, "the output for a sequence of exactly max_len = 5 positions", _learned_mistakes(x, table))
    _expect_value_error(lambda: obj(t.randn(2, 6, 4)), "LearnedPositionalEmbedding(5, 4) on a sequence of 6 positions",
                        "Position 5 has no learned row: compare x.shape[-2] with max_len and raise a ValueError that "
                        "names both")

