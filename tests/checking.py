"""Run a grading suite in-process on a namespace made from code (fast: no sandbox, no kernel).

The sandboxed path is tested end to end in ``test_grader.py``; these helpers test
the judge's checks themselves: the reference passes everything, each classic
mistake fails the checks it should, with a message that names it.
"""

from __future__ import annotations

import textwrap

from autograder.judging.checks import CheckFailed, LocalBackend, load_suite, seed_for
from autograder.judging.authorship import delegations


def namespace(code: str) -> dict:
    import linecache

    ns: dict = {"__name__": "__main__"}
    code = textwrap.dedent(code)
    linecache.cache["<answer>"] = (len(code), None, code.splitlines(True), "<answer>")  # as the sandbox's cells
    exec(compile(code, "<answer>", "exec"), ns)
    return ns


def run_suite(assignment: str, code: str, secret: str = "test") -> dict[str, str]:
    """grade_id -> "" when the check passes, else its failure message (delegation included)."""
    suite = load_suite(assignment)
    ns = namespace(code)
    parts = {p for c in suite.checks.values() for p in c.parts}
    delegated = delegations(textwrap.dedent(code), parts, suite.forbidden, assignment=assignment)
    results = {}
    for gid, check in suite.checks.items():
        bad = [delegated[p] for p in check.parts if p in delegated]
        if bad:
            results[gid] = "earns no points: " + bad[0]
            continue
        try:
            suite.run(gid, LocalBackend(ns), seed_for(secret, assignment, gid))
            results[gid] = ""
        except CheckFailed as e:
            results[gid] = str(e) or "failed"
    return results


def run_checks(assignment: str, code: str, gids: list[str], secret: str = "test") -> dict[str, str]:
    """Only the checks ``gids`` (with run_suite's seeds): a test aimed at one check need not run them all."""
    suite, ns, out = load_suite(assignment), namespace(code), {}
    for gid in gids:
        try:
            suite.run(gid, LocalBackend(ns), seed_for(secret, assignment, gid))
            out[gid] = ""
        except CheckFailed as e:
            out[gid] = str(e) or "failed"
    return out


def with_answer(code: str, name: str, value: str) -> str:
    """``code`` with the line assigning question ``name`` replaced by ``name = value``."""
    line = next(line for line in code.splitlines() if line.startswith(f"{name} = "))
    return mutate(code, line, f"{name} = {value}")


def assert_only_question_named(assignment: str, code: str, name: str, questions, words: str) -> None:
    """Run the checks of ``questions`` on ``code``: ``name``'s fails naming ``words``, every other passes."""
    results = run_checks(assignment, code, [f"test_{q}" for q in questions])
    assert words.lower() in results[f"test_{name}"].lower(), results[f"test_{name}"]
    assert all(msg == "" for gid, msg in results.items() if gid != f"test_{name}"), results


def source_code(assignment: str) -> str:
    """The reference answer: setup and solution cells of the source notebook, in order."""
    from autograder.course import source_notebooks
    from autograder.notebook import SourceNotebook

    code = []
    for path in source_notebooks(assignment):
        nb = SourceNotebook.load(path)
        code += [c.code for c in nb.cells if c.kind in ("setup", "solution")]
    return "\n\n".join(code)


def mutate(code: str, old: str, new: str) -> str:
    """``code`` with ``old`` replaced by ``new``; fails loudly if ``old`` is not there (the mutant would be void)."""
    assert old in code, f"mutation target not found: {old!r}"
    return code.replace(old, new)


def reference_answers(source_path) -> dict[str, str]:
    """Solution cell code of a source notebook, without nbgrader's solution markers: what a student would write."""
    from autograder.notebook import SourceNotebook

    return {c.grade_id: "\n".join(line for line in c.code.splitlines()
                                  if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line) + "\n"
            for c in SourceNotebook.load(source_path).solutions()}


def answered_release(assignment: str, name: str, answers: dict[str, str] | None = None) -> dict:
    """The released notebook ``name`` with its answer cells filled (by default with the reference answers)."""
    import json

    from autograder.course import RELEASE, SOURCE

    answers = reference_answers(SOURCE / assignment / name) if answers is None else answers
    nb = json.loads((RELEASE / assignment / name).read_text())
    for cell in nb["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell["source"] = answers[gid]
    return nb


def assert_full_marks(assignment: str, code: str) -> None:
    results = run_suite(assignment, code)
    assert all(msg == "" for msg in results.values()), results


def assert_mistake_named(assignment: str, name: str, code: str, gids: str | list[str], words: str,
                         partial: bool = True) -> dict[str, str]:
    """Each check in ``gids`` fails with a message containing ``words``; with ``partial``, some check still passes."""
    results = run_suite(assignment, code)
    for gid in [gids] if isinstance(gids, str) else gids:
        assert results[gid], f"{name}: {gid} passed but should fail"
        assert words.lower() in results[gid].lower(), f"{name}: {gid}'s message does not name the mistake: {results[gid]!r}"
    if partial:
        assert sum(1 for m in results.values() if m) < len(results), f"{name}: lost every point, expected partial credit"
    return results


def assert_delegation_named(assignment: str, code: str, part: str) -> dict[str, str]:
    """The checks that earn nothing for delegating name ``part``; some other check keeps its points."""
    results = run_suite(assignment, code)
    mine = [gid for gid, msg in results.items() if msg.startswith("earns no points")]
    assert mine and all(part in results[g] for g in mine), results
    assert any(msg == "" for msg in results.values()), "the honest part must keep its points"
    return results


def closed_folder(paths, uid: int, gid: int) -> str | None:
    """The first folder on the way to one of ``paths`` (as written and with links followed) that user ``uid``
    (group ``gid``) cannot enter, or a file of them it cannot read, with its mode; None when every one is open."""
    import stat
    from pathlib import Path

    def permits(path: Path, bits: int) -> bool:
        st = path.stat()
        shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
        return bool((st.st_mode >> shift) & bits)

    for path in map(Path, paths):
        for target in dict.fromkeys([path.absolute(), path.resolve()]):
            for folder in [*reversed(target.parents), *([target] if target.is_dir() else [])]:
                if not permits(folder, stat.S_IXOTH):
                    return f"{folder} (mode {stat.filemode(folder.stat().st_mode)}, owner uid {folder.stat().st_uid})"
            if not target.is_dir() and not permits(target, stat.S_IROTH):
                return f"{target} (mode {stat.filemode(target.stat().st_mode)})"
    return None
