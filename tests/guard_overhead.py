"""What the run-time bans cost: chapter 01's checks on the reference answers, with and without the guard.

Run: ``.venv/bin/python tests/guard_overhead.py`` (not collected by pytest). Rounds alternate between
the two so that load on a shared machine affects both alike; the medians and their ratio are printed.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from autograder.judging.checks import CheckFailed, LocalBackend, load_suite, seed_for  # noqa: E402
from checking import namespace, source_code  # noqa: E402

A = "01_single_head"


class _NoGuard:
    refusals: list[str] = []

    def judged(self, fragments: tuple[str, ...]) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def grade_once(guarded: bool) -> tuple[float, int]:
    """Seconds to run every check of chapter 01 on the reference, and the number of judged calls."""
    suite, ns = load_suite(A), namespace(source_code(A))
    calls = 0
    start = time.perf_counter()
    for gid in suite.checks:
        backend = LocalBackend(ns)
        if not guarded:
            backend.runner.guard = _NoGuard()
        ask = backend.ask

        def counted(request: dict, ask=ask) -> object:
            nonlocal calls
            calls += request.get("op") == "call"
            return ask(request)

        backend.ask = counted  # type: ignore[method-assign]
        try:
            suite.run(gid, backend, seed_for("bench", A, gid))
        except CheckFailed as e:
            raise SystemExit(f"the reference failed {gid}: {e}") from None
    return time.perf_counter() - start, calls


def main(rounds: int = 7) -> None:
    grade_once(True), grade_once(False)  # warm-up
    with_guard, without = [], []
    for _ in range(rounds):
        t, calls = grade_once(True)
        with_guard.append(t)
        without.append(grade_once(False)[0])
    g, b = statistics.median(with_guard), statistics.median(without)
    print(f"chapter 01 checks on the reference, {calls} judged calls, median of {rounds} rounds:")
    print(f"  with the guard {g * 1e3:.0f} ms, without {b * 1e3:.0f} ms: ratio {g / b:.2f}, "
          f"{(g - b) / calls * 1e3:.2f} ms per judged call")


if __name__ == "__main__":
    main()
