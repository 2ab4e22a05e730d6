"""The device check: everything that needs a GPU, in one call, with one summary table at the end.

    python tools/device_check.py                 # on a machine with CUDA, from the repository root
    python tools/device_check.py --out DIR       # also keep the logs, the bench JSON and the summary there

Made for a GPU machine that has Python and torch (and pytest, perhaps Triton) but no Jupyter,
no network and no package registry; attnkit is taken from this checkout (``solutions/`` on
``PYTHONPATH``), nothing is installed. It is never part of ``make test``; run it whenever a GPU is
at hand and put its table, with the device it names, in benchmarks/README.md. Steps, each a
fresh Python process with a time limit, the most wanted first, all within ``--budget`` seconds
(default 290: under five minutes on an H100):

1. ``python -m attnkit.bench --devices cuda --dtype bfloat16 --gpt-step``, then in float32:
   every row's ratio against torch (target at most 1.10), the GPT training step included;
2. ``attnkit.flash_triton.bench()`` (chapter 10's Triton kernel against torch), when that module
   exists; its absence is reported, not a failure;
3. the attnkit tests (every ``tests/test_*.py`` that imports attnkit and none of the grader,
   nbformat or nbgrader), where CUDA is present so their ``cuda`` cases run;
4. every chapter of _toc.yml run top to bottom as a script (:mod:`tools.chapters`), its device
   chosen by ``attnkit.default_device()``, i.e. ``cuda``.

The summary is one markdown table (check, result, seconds, detail), printed last and written
to ``DIR/summary.md`` with ``--out``. Exit status 0 when every step that ran passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.chapters import toc_chapters  # noqa: E402

TARGET = 1.10
STEPS = ("bench", "flash", "tests", "chapters")
NOT_PACKAGE_TESTS = re.compile(r"^\s*(from|import)\s+(autograder|nbformat|nbgrader|book_fixtures|checking|"
                               r"chapter_checking|corpus)\b", re.M)


@dataclass
class Result:
    """One line of the summary."""

    check: str
    result: str  # pass, FAIL, TIMEOUT, skipped, absent, not run
    seconds: float = 0.0
    detail: str = ""
    log: str = field(default="", repr=False)


def package_tests(root: Path = ROOT) -> list[Path]:
    """The test files that exercise attnkit alone: they import it, and nothing of the grader or Jupyter."""
    out = []
    for path in sorted((root / "tests").glob("test_*.py")):
        text = path.read_text()
        if re.search(r"^\s*(from|import)\s+attnkit\b", text, re.M) and not NOT_PACKAGE_TESTS.search(text):
            out.append(path)
    return out


def environment() -> dict[str, str]:
    """attnkit and tools from this checkout, matplotlib headless, output unbuffered."""
    env = dict(os.environ)
    paths = [str(ROOT / "solutions"), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(MPLBACKEND="Agg", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def run_step(check: str, argv: list[str], timeout: float, log_dir: Path | None) -> Result:
    """Run ``argv`` from the repository root, at most ``timeout`` seconds; pass when it exits 0."""
    if timeout < 1:
        return Result(check, "not run", 0.0, "the time budget was spent")
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=timeout)
        result, output = ("pass" if proc.returncode == 0 else "FAIL"), proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        result, output = "TIMEOUT", out + f"\n(stopped after {timeout:.0f} s)"
    seconds = time.perf_counter() - start
    if log_dir is not None:  # every step's whole output, one after the other
        with open(log_dir / "steps.log", "a") as f:
            f.write(f"\n===== {check}: {result} in {seconds:.1f} s\n$ {' '.join(argv)}\n{output}")
    return Result(check, result, seconds, "", output)


def _tail(output: str, lines: int = 3) -> str:
    text = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return " / ".join(text[-lines:])[:300]


# -- the steps -----------------------------------------------------------------------------------


def bench_step(dtype: str, timeout: float, work: Path, log_dir: Path | None, bench_args: list[str]) -> list[Result]:
    """attnkit.bench in ``dtype`` on CUDA with the GPT step: a result for the run, one per row."""
    out = work / f"bench_{dtype}.json"
    argv = [sys.executable, "-m", "attnkit.bench", "--devices", "cuda", "--dtype", dtype, "--gpt-step",
            "--json", str(out), *bench_args]
    run = run_step(f"bench {dtype}", argv, timeout, log_dir)
    if not out.is_file():
        run.detail = _tail(run.log) if run.result != "pass" else "no JSON written"
        if run.result == "pass":
            run.result = "FAIL"
        return [run]
    rows = [r for r in json.loads(out.read_text())["rows"] if r.get("variant", "fast") == "fast"]
    within = [r for r in rows if r["ratio"] <= TARGET]
    worst = max(rows, key=lambda r: r["ratio"]) if rows else None
    run.detail = (f"{len(within)}/{len(rows)} rows within {TARGET:.2f}"
                  + (f"; worst {worst['ratio']:.2f} ({worst['module']} {worst['mode']} n={worst['seq_len']})"
                     if worst else ""))
    if run.result == "pass" and len(within) < len(rows):
        run.result = "slow"
    results = [run]
    for r in rows:
        results.append(Result(f"  {dtype} {r['module']} {r['mode']} n={r['seq_len']}",
                              "ok" if r["ratio"] <= TARGET else f"> {TARGET:.2f}", 0.0,
                              f"ratio {r['ratio']:.2f} (paired {r['ratio_paired']:.2f}): ours {r['ours_ms']:.3f} ms, "
                              f"torch {r['torch_ms']:.3f} ms, B={r['batch']}"))
    return results


FLASH_DRIVER = """
import json, sys
try:
    import attnkit.flash_triton as ft
except ImportError as err:
    print(json.dumps({"absent": f"attnkit.flash_triton cannot be imported: {err}"})); sys.exit(0)
if not hasattr(ft, "bench"):
    print(json.dumps({"absent": "attnkit.flash_triton has no bench()"})); sys.exit(0)
import torch
if not torch.cuda.is_available():
    print(json.dumps({"absent": "no CUDA: chapter 10's benchmark needs a GPU"})); sys.exit(0)
rows = ft.bench(printed=False) if "printed" in ft.bench.__code__.co_varnames else ft.bench()
keys = ("n", "causal", "triton_ms", "torch_ms", "ratio")
print(json.dumps({"rows": [{k: getattr(r, k) for k in keys if hasattr(r, k)} for r in rows or []]}))
"""


def flash_step(timeout: float, log_dir: Path | None) -> list[Result]:
    """Chapter 10's kernel against torch (attnkit.flash_triton.bench), when the module exists."""
    if importlib.util.find_spec("attnkit") is None and not (ROOT / "solutions" / "attnkit").is_dir():
        return [Result("flash_triton bench", "absent", 0.0, "no attnkit")]
    if not (ROOT / "solutions" / "attnkit" / "flash_triton.py").is_file():
        return [Result("flash_triton bench", "absent", 0.0, "solutions/attnkit/flash_triton.py does not exist")]
    run = run_step("flash_triton bench", [sys.executable, "-c", FLASH_DRIVER], timeout, log_dir)
    last = run.log.strip().splitlines()[-1] if run.log.strip() else ""
    try:
        data = json.loads(last)
    except json.JSONDecodeError:
        run.detail = _tail(run.log)
        run.result = "FAIL" if run.result == "pass" else run.result
        return [run]
    if "absent" in data:
        return [Result("flash_triton bench", "absent", run.seconds, data["absent"])]
    rows = data["rows"]
    run.detail = f"{len(rows)} rows; ratio = triton / torch"
    results = [run]
    for r in rows:
        results.append(Result(f"  flash n={r.get('n')} causal={r.get('causal')}", "ok", 0.0,
                              f"ratio {r.get('ratio', float('nan')):.2f}: triton {r.get('triton_ms', 0):.3f} ms, "
                              f"torch {r.get('torch_ms', 0):.3f} ms"))
    return results


def tests_step(timeout: float, log_dir: Path | None, files: list[Path] | None = None) -> list[Result]:
    """The attnkit tests with pytest (xdist when installed), from this checkout."""
    if importlib.util.find_spec("pytest") is None:
        return [Result("attnkit tests", "skipped", 0.0, "pytest is not installed here")]
    files = package_tests() if files is None else files
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, files)]
    if importlib.util.find_spec("xdist") is not None:
        argv[4:4] = ["-n", str(min(8, os.cpu_count() or 1))]
    run = run_step(f"attnkit tests ({len(files)} files)", argv, timeout, log_dir)
    summary = [line for line in run.log.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    run.detail = summary[-1].strip("= ") if summary else _tail(run.log)
    failed = [line.split(" ", 1)[1].split(" - ")[0] for line in run.log.splitlines() if line.startswith("FAILED ")]
    if failed:
        run.detail += "; failed: " + ", ".join(failed[:5]) + (" ..." if len(failed) > 5 else "")
    return [run]


def chapter_steps(chapters: list[Path], deadline: float, cap: float, log_dir: Path | None) -> list[Result]:
    """Each chapter in a fresh process (a fresh kernel), in the book's order."""
    results = []
    for path in chapters:
        timeout = min(cap, deadline - time.perf_counter())
        run = run_step(f"chapter {path.stem}", [sys.executable, "-m", "tools.chapters", "run", str(path)],
                       timeout, log_dir)
        if run.result in ("FAIL", "TIMEOUT"):
            failed = [line for line in run.log.splitlines() if line.startswith("FAILED ")]
            run.detail = failed[-1].removeprefix("FAILED ")[:300] if failed else _tail(run.log)
        results.append(run)
    return results


# -- the summary ---------------------------------------------------------------------------------


def header() -> str:
    import torch

    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    return (f"device check: {cuda}; torch {torch.__version__}; Python {platform.python_version()}; "
            f"triton {triton_version}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def summary_table(results: list[Result], title: str) -> str:
    """One markdown table: check | result | seconds | detail."""
    lines = [title, "", "| check | result | seconds | detail |", "| --- | --- | ---: | --- |"]
    for r in results:
        seconds = f"{r.seconds:.1f}" if r.seconds else ""
        detail = r.detail.replace("|", "\\|")
        lines.append(f"| {r.check} | {r.result} | {seconds} | {detail} |")
    failed = [r for r in results if r.result in ("FAIL", "TIMEOUT")]
    lines += ["", f"{len(failed)} step(s) failed" + (": " + ", ".join(r.check for r in failed) if failed else "")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/device_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="keep logs, bench JSON and summary.md in this folder")
    parser.add_argument("--budget", type=float, default=290.0, help="seconds for all steps together (default 290)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"which steps, of {', '.join(STEPS)}")
    parser.add_argument("--chapters", nargs="*", type=Path, help="these notebooks instead of _toc.yml's chapters")
    parser.add_argument("--tests", nargs="*", type=Path, help="these test files instead of the attnkit tests")
    parser.add_argument("--bench-args", default="--repeats 15",
                        help="extra arguments for python -m attnkit.bench (default '--repeats 15')")
    parser.add_argument("--allow-cpu", action="store_true", help="run without CUDA (to test this script)")
    args = parser.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        parser.error(f"unknown step(s) {unknown}; choose from {', '.join(STEPS)}")

    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("device check: CUDA is not available here; it is meant for a GPU machine "
              "(--allow-cpu runs it anyway, to test it)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    deadline = start + args.budget
    left = lambda: deadline - time.perf_counter()  # noqa: E731
    title = header()
    print(title, flush=True)
    work = args.out or Path(tempfile.mkdtemp(prefix="device_check_"))
    work.mkdir(parents=True, exist_ok=True)
    log_dir = work
    results: list[Result] = []

    def report(new: list[Result]) -> None:
        for r in new:
            print(f"{r.check}: {r.result} {r.seconds:.1f} s {r.detail}", flush=True)
        results.extend(new)

    if "bench" in steps:
        bench_args = args.bench_args.split()
        for dtype in ("bfloat16", "float32"):
            report(bench_step(dtype, min(60.0, left()), work, log_dir, bench_args))
    if "flash" in steps:
        report(flash_step(min(45.0, left()), log_dir))
    if "tests" in steps:
        report(tests_step(min(120.0, left()), log_dir, args.tests))
    if "chapters" in steps:
        chapters = args.chapters if args.chapters else toc_chapters()
        report(chapter_steps([Path(c).resolve() for c in chapters], deadline, 120.0, log_dir))

    total = time.perf_counter() - start
    table = summary_table(results, f"{title}; {total:.0f} s in all")
    print("\n" + table)
    (work / "summary.md").write_text(table + "\n")
    print(f"\nlogs, bench JSON and summary.md in {work}")
    return 1 if any(r.result in ("FAIL", "TIMEOUT") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
