"""What the run-time bans cost.

Locally: chapter 01's checks on the reference answers, with and without the per-call guard
(``ban.Guard``). In the sandbox: the round trip of a judged call in a process banned for life (the
ban costs nothing per call; its one-off work is timed too), and the sandbox's start.

Run: ``.venv/bin/python tests/guard_overhead.py [--sandbox]`` (not collected by pytest). Rounds alternate
so that load on a shared machine affects both alike; medians (and their ratio) are printed.
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


def sandbox(rounds: int = 5, calls: int = 100) -> None:
    """The judged call's round trip (a 4x16x16 softmax written by hand) in a sandbox banned for life, and the start."""
    import numpy as np

    from autograder.isolation.sandbox import Sandbox

    x = np.random.rand(4, 16, 16).astype(np.float32)
    code = "def mine(x, dim=-1):\n    e = (x - x.amax(dim, keepdim=True)).exp()\n    return e / e.sum(dim, keepdim=True)\n"
    for bans in [("softmax",), ()]:
        starts, per = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            with Sandbox(bans=bans) as box:
                starts.append(time.perf_counter() - t)
                box.request({"op": "exec", "code": code, "label": "<bench>"}, timeout=30)
                t = time.perf_counter()
                for _ in range(calls):
                    reply = box.request({"op": "call", "target": "mine", "args": [x], "bans": list(bans)}, timeout=30)
                per.append((time.perf_counter() - t) / calls)
                assert reply["ok"], reply
        print(f"sandbox banned for {list(bans)}: start {statistics.median(starts[1:]) * 1e3:.0f} ms, "
              f"judged call round trip {statistics.median(per) * 1e3:.2f} ms (median of {rounds})")
    import subprocess

    code = ("import time, torch\nfrom autograder.in_sandbox import ban\nt = time.perf_counter(); ban.prepare(torch)\n"
            "u = time.perf_counter(); ban.ban_for_life(torch, ('softmax',))\n"
            "print(f'one-off: prepare {1e3 * (u - t):.0f} ms (once per zygote), ban_for_life {1e3 * (time.perf_counter() - u):.1f} ms')")
    print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    sandbox() if "--sandbox" in sys.argv else main()
