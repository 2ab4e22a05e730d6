"""attnkit.bench runs end to end on tiny sizes and writes valid JSON with a ratio per row (no timing assertions)."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch

from attnkit import bench

TINY = ["--sizes", "8,12", "--repeats", "2", "--embed-dim", "8", "--heads", "2", "--ff-dim", "16", "--batch", "2"]


def test_bench_cli_writes_json_with_a_ratio_per_row(tmp_path, capsys):
    out = tmp_path / "sub" / "bench.json"
    rows = bench.main([*TINY, "--devices", "cpu", "--json", str(out), "--with-explicit"])
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["meta"]["what_runs"]["mha"][1].startswith("torch.nn.MultiheadAttention")
    assert len(data["rows"]) == len(rows) == len(bench.MODULES) * len(bench.MODES) * 2 * 2  # sizes x variants
    keys = {(r["module"], r["mode"], r["seq_len"], r["variant"]) for r in data["rows"]}
    assert len(keys) == len(data["rows"])
    for r in data["rows"]:
        assert r["device"] == "cpu" and r["dtype"] == "float32"
        assert math.isfinite(r["ratio"])
        assert r["ratio"] == pytest.approx(r["ours_ms"] / r["torch_ms"])
        # the reported times are the medians of the recorded runs (rounded to 1e-4 ms)
        assert r["ours_ms"] == pytest.approx(statistics.median(r["ours_runs_ms"]), abs=1e-3)
        assert r["torch_ms"] == pytest.approx(statistics.median(r["torch_runs_ms"]), abs=1e-3)
        assert len(r["ours_runs_ms"]) == len(r["torch_runs_ms"]) == 2
    assert "ratio" in printed and "torch.nn.TransformerEncoderLayer" in printed


def test_bench_subset_and_cuda_skipped_without_gpu(tmp_path, capsys):
    out = tmp_path / "b.json"
    bench.main([*TINY, "--devices", "cpu,cuda", "--modules", "mha", "--modes", "forward", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    devices = {r["device"] for r in rows}
    assert devices == ({"cpu", "cuda"} if torch.cuda.is_available() else {"cpu"})
    assert {r["module"] for r in rows} == {"mha"} and {r["mode"] for r in rows} == {"forward"}
    if not torch.cuda.is_available():
        assert "CUDA is not available" in capsys.readouterr().out


@pytest.mark.parametrize("module", bench.MODULES)
@pytest.mark.parametrize("explicit", [False, True])
def test_pairs_compute_the_same_thing(module, explicit):
    """Both sides of each pair give the same output on the same inputs (like for like), in eval and train mode."""
    ours, theirs, inputs, modules = bench.make_pair(module, 2, 6, 8, 2, 16, torch.device("cpu"), torch.float64,
                                                    explicit)
    for training in (False, True):
        for m in modules:
            m.train(training)
        with torch.no_grad():
            torch.testing.assert_close(ours(*inputs), theirs(*inputs))


def test_time_pair_keeps_each_sides_times_and_alternates():
    """The timer is honest: each side's time is its own, and the calls alternate (ours, torch, torch, ours, ...)."""
    calls = []

    def side(name, seconds):
        def once():
            calls.append(name)
            return seconds
        return once

    a, t = bench.time_pair(side("ours", 0.003), side("torch", 0.001), repeats=4, warmup=1)
    assert a == [0.003] * 4 and t == [0.001] * 4
    assert calls == ["ours", "torch", "ours", "torch", "torch", "ours", "ours", "torch", "torch", "ours"]


def test_bad_module_is_refused():
    with pytest.raises(SystemExit):
        bench.main(["--modules", "nope"])
