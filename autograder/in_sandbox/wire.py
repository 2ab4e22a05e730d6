"""The message format between the trusted judge and the sandboxed student process.

A message on a pipe is an 8-byte little-endian length of the rest, then an
8-byte little-endian length of the JSON header, the header (the value, with
arrays replaced by their dtype, shape and index) and the raw bytes of any
arrays it carries, in order. Nothing is ever unpickled: arrays are rebuilt with ``numpy.frombuffer``
from an allow-listed dtype and a checked shape, so a hostile sandbox can send
wrong numbers but never code, objects or oversized buffers.

This module is copied into the sandbox next to the harness, so it imports only
the standard library and numpy.

Values on the wire: ``None``, bool, int, float (including nan/inf), str, lists,
tuples, dicts with str keys, numpy arrays (see ``DTYPES``) and references to
objects that live in the sandbox (``Ref``).
"""

from __future__ import annotations

import json
import math
import os
import select
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

DTYPES = ("float16", "float32", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
MAX_HEADER = 8 << 20
MAX_DEPTH = 16


class WireError(ValueError):
    """A message that does not follow the format (treated as a broken submission)."""


@dataclass(frozen=True)
class Ref:
    """A handle to an object (a student's module) that stays in the sandbox."""

    id: int


def map_leaves(v: Any, leaf: Callable[[Any], Any], depth: int = 0) -> Any:
    """``v`` with its lists, tuples (a namedtuple or ``torch.Size`` as a plain tuple) and dicts rebuilt and
    ``leaf`` applied to everything else: the one walk both sides use to turn arrays into tensors and back."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if isinstance(v, tuple):
        return tuple(map_leaves(x, leaf, depth + 1) for x in tuple.__iter__(v))
    if isinstance(v, list):
        return [map_leaves(x, leaf, depth + 1) for x in v]
    if isinstance(v, dict):
        return {k: map_leaves(x, leaf, depth + 1) for k, x in v.items()}
    return leaf(v)


def _enc(v: Any, bufs: list[bytes], depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return {"$int": str(v)}
    if isinstance(v, float):
        return v if math.isfinite(v) else {"$float": repr(v)}
    if isinstance(v, Ref):
        return {"$ref": v.id}
    if isinstance(v, np.ndarray):
        name = v.dtype.name
        if name not in DTYPES:
            raise WireError(f"array dtype {name} is not allowed")
        bufs.append(np.ascontiguousarray(v).tobytes())
        return {"$a": len(bufs) - 1, "dtype": name, "shape": list(v.shape)}
    if isinstance(v, tuple):
        return {"$tuple": [_enc(x, bufs, depth + 1) for x in v]}
    if isinstance(v, list):
        return [_enc(x, bufs, depth + 1) for x in v]
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise WireError("dict keys must be strings")
        return {"$dict": [[k, _enc(x, bufs, depth + 1)] for k, x in v.items()]}
    raise WireError(f"cannot send a value of type {type(v).__name__}")


def _dec(v: Any, bufs: list[memoryview], depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if v is None or isinstance(v, (bool, str, float)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, list):
        return [_dec(x, bufs, depth + 1) for x in v]
    if not isinstance(v, dict) or len(v) == 0:
        raise WireError("malformed value")
    if "$int" in v:
        s = v["$int"]
        if not isinstance(s, str) or len(s) > 40:
            raise WireError("malformed int")
        return int(s)
    if "$float" in v:
        if v["$float"] not in ("nan", "inf", "-inf"):
            raise WireError("malformed float")
        return float(v["$float"])
    if "$ref" in v:
        if not isinstance(v["$ref"], int):
            raise WireError("malformed ref")
        return Ref(v["$ref"])
    if "$tuple" in v:
        if not isinstance(v["$tuple"], list):
            raise WireError("malformed tuple")
        return tuple(_dec(x, bufs, depth + 1) for x in v["$tuple"])
    if "$dict" in v:
        items = v["$dict"]
        if not isinstance(items, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in items):
            raise WireError("malformed dict")
        return {k: _dec(x, bufs, depth + 1) for k, x in items}
    if "$a" in v:
        idx, dtype, shape = v.get("$a"), v.get("dtype"), v.get("shape")
        if not isinstance(idx, int) or not 0 <= idx < len(bufs):
            raise WireError("malformed array index")
        if dtype not in DTYPES:
            raise WireError(f"array dtype {dtype!r} is not allowed")
        if not isinstance(shape, list) or len(shape) > 8 or \
                not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in shape):
            raise WireError("malformed array shape")
        np_dtype = np.dtype(dtype)
        count = math.prod(shape)
        if count * np_dtype.itemsize != len(bufs[idx]):
            raise WireError("array shape and byte count disagree")
        try:
            return np.frombuffer(bufs[idx], dtype=np_dtype).reshape(shape).copy()
        except ValueError as e:  # numpy's own limits (for example too many elements along empty axes)
            raise WireError(f"array shape {shape} refused: {e}") from None
    raise WireError("malformed value")


def encode(msg: Any) -> bytes:
    """Serialise one message (header plus array payloads) to bytes."""
    bufs: list[bytes] = []
    header = json.dumps({"body": _enc(msg, bufs), "sizes": [len(b) for b in bufs]}).encode()
    return struct.pack("<Q", len(header)) + header + b"".join(bufs)


def send(fd: int, msg: Any, deadline: float | None = None) -> None:
    """Write one message; on a non-blocking ``fd``, TimeoutError if ``deadline`` (time.monotonic) comes first."""
    data = memoryview(encode(msg))
    _write_all(fd, struct.pack("<Q", len(data)), deadline)
    _write_all(fd, data, deadline)


def wait(fd: int, event: int, deadline: float | None) -> bool:
    """Wait until ``fd`` is ready for ``event`` (select.POLLIN or POLLOUT) or broken; False at ``deadline``
    (time.monotonic; None: no deadline)."""
    poller = select.poll()
    poller.register(fd, event)
    while True:
        if deadline is None:
            left_ms = None
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            left_ms = max(1, int(left * 1000) + 1)
        if poller.poll(left_ms):
            return True


def _write_all(fd: int, data: bytes | memoryview, deadline: float | None = None) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:  # a non-blocking fd whose reader is behind
            if not wait(fd, select.POLLOUT, deadline):
                raise TimeoutError("the other side stopped reading") from None


def _read_exact(fd: int, n: int, deadline: float | None = None) -> bytes:
    chunks = []
    while n:
        try:
            chunk = os.read(fd, min(n, 1 << 20))
        except BlockingIOError:  # a non-blocking fd with nothing to read yet
            if not wait(fd, select.POLLIN, deadline):
                raise TimeoutError("the other side stalled half-way through a message") from None
            continue
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv(fd: int, max_bytes: int, deadline: float | None = None) -> Any:
    """Read one message; refuse anything larger than ``max_bytes``; on a non-blocking ``fd``,
    TimeoutError if ``deadline`` comes first."""
    (total,) = struct.unpack("<Q", _read_exact(fd, 8, deadline))
    if total > max_bytes:
        raise WireError(f"message of {total} bytes exceeds the limit of {max_bytes}")
    return decode(_read_exact(fd, total, deadline))


def decode(data: bytes) -> Any:
    if len(data) < 8:
        raise WireError("truncated message")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > MAX_HEADER or 8 + hlen > len(data):
        raise WireError("bad header length")
    try:
        header = json.loads(data[8 : 8 + hlen])
    except (ValueError, RecursionError) as e:
        raise WireError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("sizes"), list):
        raise WireError("malformed header")
    sizes = header["sizes"]
    if not all(isinstance(s, int) and s >= 0 for s in sizes) or 8 + hlen + sum(sizes) != len(data):
        raise WireError("payload sizes do not match the message")
    view = memoryview(data)
    bufs, pos = [], 8 + hlen
    for s in sizes:
        bufs.append(view[pos : pos + s])
        pos += s
    return _dec(header.get("body"), bufs)
