"""The device check's pieces, run on the CPU so that they cannot rot between GPU runs.

tools/device_check.py itself needs a GPU and is never part of ``make test``; what it is made of is
tested here on tiny inputs: a notebook run as a script (magics, install cell, headless figures,
the chapter's folder as working directory), a failing cell named, the table of contents read
without YAML, the bench and test steps parsed into the summary, and the summary table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from tools import chapters, device_check

ROOT = Path(__file__).resolve().parent.parent


def notebook(path: Path, *cells: tuple[str, str]) -> Path:
    """A minimal .ipynb (nbformat 4) with the given (cell_type, source) cells, sources stored as line lists."""
    data = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": kind, "metadata": {}, "source": src.splitlines(keepends=True),
         **({"outputs": [], "execution_count": None} if kind == "code" else {})} for kind, src in cells]}
    path.write_text(json.dumps(data))
    return path


INSTALL = ("code", "try:\n    import attnkit\nexcept ImportError:\n    %pip install -q attnkit\n    import attnkit")


def good(folder: Path) -> Path:
    return notebook(folder / "good.ipynb",
                    ("markdown", "# 01 · A tiny chapter"),
                    INSTALL,
                    ("code", "import matplotlib.pyplot as plt\nx = 41\n!echo hi\nif True:\n    %time y = 1\n"),
                    ("code", "x += 1\nplt.plot([0, 1]); plt.show()\n"  # attnkit: from the install cell
                             "open('ran.txt', 'w').write(f'{x} {attnkit.default_device().type}')"))


def test_a_notebook_runs_as_a_script_in_its_folder(tmp_path):
    nb = good(tmp_path)
    cells = chapters.code_cells(nb)
    assert [n for n, _ in cells] == [2, 3, 4]  # numbers count every cell, markdown included
    assert "    pass  # IPython: %pip install -q attnkit" in cells[0][1]  # the install cell imports attnkit
    assert "pass  # IPython: !echo hi" in cells[1][1] and "    pass  # IPython: %time y = 1" in cells[1][1]
    seconds = chapters.run(nb, log=lambda *_: None)
    assert seconds >= 0 and (tmp_path / "ran.txt").read_text() == "42 cpu"
    compile(chapters.script(nb), "script", "exec")  # the whole chapter is one valid script


def test_a_failing_cell_is_named(tmp_path):
    nb = notebook(tmp_path / "bad.ipynb", ("code", "a = 1"), ("markdown", "text"),
                  ("code", "assert a == 2, 'the claim does not hold'"))
    with pytest.raises(chapters.ChapterError, match=r"bad.ipynb: cell 3 raised AssertionError: the claim"):
        chapters.run(nb, log=lambda *_: None)
    assert Path.cwd() != tmp_path  # the working directory is restored


def test_the_toc_is_read_without_yaml_as_yaml_reads_it():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    part = next(p for p in toc["parts"] if p.get("caption") == "Chapters")
    assert chapters.toc_chapters() == [ROOT / f"{c['file']}.ipynb" for c in part["chapters"]]
    assert all(path.is_file() for path in chapters.toc_chapters())


def test_attnkit_imports_are_found_every_way():
    source = ("import attnkit\nimport attnkit.plotting as ap\nfrom attnkit import softmax, GPT as G\n"
              "from attnkit.efficient import (tiled_attention,\n    peak_memory)\n"
              "d = attnkit.default_device()\nap.plot_attention\nimport torch\ntorch.nn\n")
    assert chapters.attnkit_imports(source) == {
        ("attnkit", None), ("attnkit.plotting", None), ("attnkit", "softmax"), ("attnkit", "GPT"),
        ("attnkit.efficient", "tiled_attention"), ("attnkit.efficient", "peak_memory"),
        ("attnkit", "default_device"), ("attnkit.plotting", "plot_attention")}


def test_the_package_tests_leave_out_the_grader_and_jupyter():
    names = {p.name for p in device_check.package_tests()}
    assert {"test_attention.py", "test_multihead.py", "test_bench.py", "test_launches.py"} <= names
    assert not names & {"test_book.py", "test_grader.py", "test_ch01_grading.py", "test_device_check.py"}


def test_summary_table_is_one_markdown_table():
    results = [device_check.Result("bench bfloat16", "slow", 12.0, "24/25 rows within 1.10"),
               device_check.Result("  bfloat16 mha forward n=128", "ok", 0.0, "ratio 0.98 | paired"),
               device_check.Result("chapter 06_positional_encoding", "FAIL", 3.5, "cell 12 raised")]
    table = device_check.summary_table(results, "device check: H100")
    lines = table.splitlines()
    assert lines[0] == "device check: H100" and lines[2] == "| check | result | seconds | detail |"
    assert all(line.replace("\\|", "").count("|") == 5 for line in lines[4:7])  # four cells each
    assert "ratio 0.98 \\| paired" in table
    assert lines[-1] == "1 step(s) failed: chapter 06_positional_encoding"


def test_without_cuda_it_refuses_unless_told(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert device_check.main(["--steps", "chapters"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_steps_run_and_land_in_the_summary(tmp_path, capsys):
    """Chapters (one passing, one failing) and a test file, end to end through main()."""
    passing = tmp_path / "test_tiny.py"
    passing.write_text("def test_one():\n    assert 1 + 1 == 2\n")
    failing = notebook(tmp_path / "broken.ipynb", ("code", "raise ValueError('on purpose')"))
    out = tmp_path / "out"
    status = device_check.main(["--allow-cpu", "--out", str(out), "--steps", "tests,chapters",
                                "--chapters", str(good(tmp_path)), str(failing), "--tests", str(passing)])
    printed = capsys.readouterr().out
    assert status == 1  # the broken chapter
    summary = (out / "summary.md").read_text()
    assert printed.rstrip().endswith(f"logs, bench JSON and summary.md in {out}")
    assert summary.splitlines()[0].startswith("device check: ") and "torch " + torch.__version__ in summary
    rows = {line.split(" | ")[0].strip("| ").strip(): line for line in summary.splitlines() if line.startswith("| ")}
    assert "| pass |" in rows["chapter good"] and "| FAIL |" in rows["chapter broken"]
    assert "cell 1 raised ValueError: on purpose" in rows["chapter broken"]
    assert "| pass |" in rows["attnkit tests (1 files)"] and "1 passed" in rows["attnkit tests (1 files)"]
    headers = re.findall(r"^===== .+: \w+ in [\d.]+ s$", (out / "steps.log").read_text(), re.M)  # one a step
    assert len(headers) == 3, headers


def test_the_bench_step_reads_every_row_with_the_gpt_step(tmp_path):
    tiny = ("--devices cpu --sizes 8 --repeats 1 --embed-dim 8 --heads 2 --ff-dim 16 --batch 1 "
            "--modules mha --modes forward").split()
    results = device_check.bench_step("bfloat16", 120, tmp_path, None, tiny)
    checks = [r.check.strip() for r in results]
    assert checks == ["bench bfloat16", "bfloat16 mha forward n=8", "bfloat16 gpt train n=128"]
    assert results[0].result in ("pass", "slow") and results[0].detail.startswith(("2/2", "1/2", "0/2"))
    data = json.loads((tmp_path / "bench_bfloat16.json").read_text())
    assert {r["dtype"] for r in data["rows"]} == {"bfloat16"}


def test_it_is_never_part_of_make_test_or_ci():
    """The check needs a GPU: neither the Makefile nor a workflow runs it (only its pieces, here)."""
    for path in [ROOT / "Makefile", *sorted((ROOT / ".github" / "workflows").glob("*.yml"))]:
        assert "device_check" not in path.read_text(), f"{path.name} runs the device check"
