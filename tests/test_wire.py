"""The judge's channel to the sandbox: arrays round-trip, and every malformed frame is a WireError, nothing else.

Frames come from the student's process, so decoding is the grader's attack surface: an
exception other than WireError would end the whole notebook's grading instead of one call.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from autograder.in_sandbox.wire import MAX_DEPTH, Ref, WireError, decode, encode, map_leaves


def frame(body, payloads: list[bytes] = ()) -> bytes:
    header = json.dumps({"body": body, "sizes": [len(p) for p in payloads]}).encode()
    return struct.pack("<Q", len(header)) + header + b"".join(payloads)


def test_round_trip_of_arrays_and_plain_values():
    msg = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "n": [1, 2.5, None, "x", (3, 4)], "big": 2**70,
           "nan": float("nan")}
    out = decode(encode(msg))
    np.testing.assert_array_equal(out["a"], msg["a"])
    assert out["a"].dtype == np.float32 and out["big"] == 2**70 and out["n"][4] == (3, 4) and out["nan"] != out["nan"]


@pytest.mark.parametrize("body, payloads", [
    ({"$a": 0, "dtype": "float32", "shape": [0, 2**70]}, [b""]),  # numpy refuses the shape itself
    ({"$a": 0, "dtype": "float32", "shape": [0, 2**40, 2**40]}, [b""]),
    ({"$a": 0, "dtype": "float32", "shape": [True, 4]}, [b"\0" * 16]),
    ({"$a": 0, "dtype": "float32", "shape": [-1]}, [b"\0" * 4]),
    ({"$a": 0, "dtype": "float32", "shape": [3]}, [b"\0" * 4]),  # byte count disagrees
    ({"$a": 0, "dtype": "object", "shape": [1]}, [b"\0" * 8]),  # no pickled objects
    ({"$a": 5, "dtype": "float32", "shape": [1]}, [b"\0" * 4]),
    ({"$int": "9" * 100}, []),
    ({"$dict": [[1, 2]]}, []),
    ({"$float": "1e309"}, []),
    ({}, []),
])
def test_malformed_frames_are_wire_errors(body, payloads):
    with pytest.raises(WireError):
        decode(frame(body, payloads))


def test_truncated_and_oversized_headers():
    good = encode({"x": 1})
    for data in (good[:5], good[:-1], struct.pack("<Q", 1 << 40) + good[8:]):
        with pytest.raises(WireError):
            decode(data)


def test_map_leaves_rebuilds_containers_and_is_bounded():
    """Both sides convert arrays through map_leaves: every leaf is reached, containers come back as plain ones
    (a namedtuple as a tuple, so the wire can carry it), refs stay leaves, and a cycle cannot recurse forever."""
    from collections import namedtuple

    pair = namedtuple("pair", "out weights")
    value = {"x": [np.ones(2), pair(np.zeros(1), Ref(3))], "n": (1, "s", None)}
    seen = []
    out = map_leaves(value, lambda v: seen.append(v) or (v * 2 if isinstance(v, np.ndarray) else v))
    assert type(out["x"][1]) is tuple and out["x"][1][1] == Ref(3) and out["n"] == (1, "s", None)
    np.testing.assert_array_equal(out["x"][0], [2.0, 2.0])
    assert len(seen) == 6
    loop: list = []
    loop.append(loop)
    with pytest.raises(WireError):
        map_leaves(loop, lambda v: v)
    deep: list = [1]
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    assert map_leaves(deep, lambda v: v) == deep
