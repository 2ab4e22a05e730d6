"""Similarity report: which answers look alike, for an instructor to read (never a grade).

``python -m autograder similarity [SUBMISSIONS] --assignment A [--out similarity.html]``

Each student's answers to assignment ``A`` (the nbgrader solution cells of their
notebooks, and any code cells they added) are compared with ``copydetect`` (winnowed
fingerprints of the token stream, so renamed variables and reformatting do not hide a
copy) against every other student's answers and against the course's published code:
the assignment's reference solutions (``solutions/assignments/<A>``, public in the open
course), the book's chapter cells and the ``attnkit`` package, which a student may
legitimately have read. The code the release notebook gives every student (stubs, visible tests) is
boilerplate and is not counted.

The result is one HTML page: pairs of students ranked by similarity, then answers
ranked by how much they share with the course's code, each with the shared passages
highlighted side by side. The report reads the submissions and writes that page only:
it never opens the gradebook, and no grade depends on it. High similarity is a reason
to look, not evidence: short exercises have few good solutions.

Imports: course (folders of the course). Third party: copydetect, nbformat.
"""

from __future__ import annotations

import argparse
import html
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder import course

MAX_NOTEBOOK_BYTES = 5 << 20  # a submission larger than this is reported, not read
REFERENCE_PREFIX = "course__"  # reference files are named course__<what>.py


@dataclass(frozen=True)
class Pair:
    """Two files and how much of each the other covers (copydetect's scores, 0..1)."""

    left: str
    right: str
    left_share: float
    right_share: float
    shared_tokens: int
    left_html: str
    right_html: str

    @property
    def score(self) -> float:
        """The larger share: a short answer copied whole into a longer one still ranks high."""
        return max(self.left_share, self.right_share)


def _code_cells(path: Path, answers_only: bool) -> list[str]:
    """Code cells of a notebook: with ``answers_only``, nbgrader solution cells and cells a
    student added (no nbgrader metadata); otherwise every code cell."""
    nb = nbformat.read(path, as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        meta = cell.metadata.get("nbgrader", {})
        if not answers_only or meta.get("solution") or not meta:
            cells.append(cell.source)
    return cells


def _python(cells: list[str]) -> str:
    """Cells as one Python file; IPython magics and shell lines are commented out."""
    lines = []
    for source in cells:
        for line in source.splitlines():
            lines.append("# " + line if line.lstrip().startswith(("%", "!")) else line)
        lines.append("")
    return "\n".join(lines)


def collect_answers(submissions: Path, assignment: str, into: Path) -> dict[str, str]:
    """Write ``into/<student>.py`` for each student with answers; return problems by student."""
    problems: dict[str, str] = {}
    for student_dir in sorted(p for p in submissions.iterdir() if p.is_dir()):
        notebooks = sorted((student_dir / assignment).glob("*.ipynb"))
        if not notebooks:
            continue
        cells: list[str] = []
        for nb_path in notebooks:
            if nb_path.stat().st_size > MAX_NOTEBOOK_BYTES:
                problems[student_dir.name] = f"{nb_path.name} is over {MAX_NOTEBOOK_BYTES >> 20} MiB: not read"
                continue
            try:
                cells += _code_cells(nb_path, answers_only=True)
            except Exception as exc:  # an unreadable notebook costs that student's row only
                problems[student_dir.name] = f"{nb_path.name} could not be read: {exc}"
        if cells:
            (into / f"{student_dir.name}.py").write_text(_python(cells))
    return problems


def _solution_cells(path: Path) -> list[str]:
    """The reference answers of a source notebook: its solution cells, nbgrader's markers removed."""
    nb = nbformat.read(path, as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            lines = [line for line in cell.source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")]
            cells.append("\n".join(lines))
    return cells


def collect_references(root: Path, into: Path, assignment: str | None = None) -> None:
    """The course's published code: the assignment's reference solutions (``solutions/assignments``),
    each book chapter's cells and each attnkit module."""
    for source in sorted((root / "solutions" / "assignments" / (assignment or "")).glob("*.ipynb")
                         if assignment else []):
        (into / f"{REFERENCE_PREFIX}solution_{source.stem}.py").write_text(_python(_solution_cells(source)))
    for chapter in sorted((root / "book").glob("[0-9][0-9]_*.ipynb")):
        text = _python(_code_cells(chapter, answers_only=False))
        (into / f"{REFERENCE_PREFIX}book_{chapter.stem}.py").write_text(text)
    for module in sorted((root / "solutions" / "attnkit").glob("*.py")):
        (into / f"{REFERENCE_PREFIX}attnkit_{module.stem}.py").write_text(module.read_text())


def collect_boilerplate(release: Path, into: Path) -> None:
    """What every student was given: the code cells of the released notebooks."""
    for nb_path in sorted(release.glob("*.ipynb")):
        (into / f"given_{nb_path.stem}.py").write_text(_python(_code_cells(nb_path, answers_only=False)))


def compare(students: Path, references: Path, boilerplate: Path, noise: int, guarantee: int) -> list[Pair]:
    """Every student against every other student and every reference file, with copydetect."""
    from copydetect import CopyDetector

    detector = CopyDetector(test_dirs=[str(students)], ref_dirs=[str(students), str(references)],
                            boilerplate_dirs=[str(boilerplate)], extensions=["py"], noise_t=noise,
                            guarantee_t=guarantee, display_t=0.0, autoopen=False, silent=True,
                            out_file=str(students.parent / "unused.html"))
    detector.run()
    pairs = []
    for left_share, right_share, left, right, left_html, right_html, tokens in detector.get_copied_code_list():
        pairs.append(Pair(Path(left).stem, Path(right).stem, float(left_share), float(right_share),
                          int(tokens), left_html, right_html))
    return pairs


def rank(pairs: list[Pair]) -> tuple[list[Pair], list[Pair]]:
    """(student pairs, student-vs-course pairs), each from the most to the least similar."""
    between = {}
    for pair in pairs:
        if pair.right.startswith(REFERENCE_PREFIX):
            continue
        key = tuple(sorted((pair.left, pair.right)))
        if key not in between or pair.score > between[key].score:
            between[key] = pair
    course_pairs = [p for p in pairs if p.right.startswith(REFERENCE_PREFIX)]
    order = lambda p: (-p.score, -p.shared_tokens, p.left, p.right)  # noqa: E731
    return sorted(between.values(), key=order), sorted(course_pairs, key=order)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; max-width: 90rem; color: #1a1a1a; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border: 1px solid #999; padding: .3rem .6rem; text-align: left; vertical-align: top; }
th { background: #eee; }
.side { display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; }
pre { background: #f6f6f6; padding: .5rem; overflow: auto; font-size: .85rem; }
.highlight-red { background: #ffd0d0; } .highlight-green { background: #c8f0c8; }
"""


def _rows(pairs: list[Pair], label_right: str) -> str:
    if not pairs:
        return "<p>None above the noise threshold.</p>"
    out = [f"<table><tr><th>rank</th><th>student</th><th>{label_right}</th><th>similarity</th>"
           "<th>share of left / right</th><th>shared tokens</th></tr>"]
    for i, p in enumerate(pairs, 1):
        right = p.right.removeprefix(REFERENCE_PREFIX)
        out.append(f"<tr><td>{i}</td><td>{html.escape(p.left)}</td><td>{html.escape(right)}</td>"
                   f"<td>{p.score:.0%}</td><td>{p.left_share:.0%} / {p.right_share:.0%}</td>"
                   f"<td>{p.shared_tokens}</td></tr>")
    out.append("</table>")
    for i, p in enumerate(pairs, 1):
        right = p.right.removeprefix(REFERENCE_PREFIX)
        out.append(f"<details><summary>{i}. {html.escape(p.left)} and {html.escape(right)}: "
                   f"{p.score:.0%}</summary><div class='side'><pre>{p.left_html}</pre>"
                   f"<pre>{p.right_html}</pre></div></details>")
    return "\n".join(out)


def render(assignment: str, students: list[Pair], against_course: list[Pair], problems: dict[str, str],
           count: int) -> str:
    """The HTML page."""
    notes = "".join(f"<li>{html.escape(s)}: {html.escape(m)}</li>" for s, m in sorted(problems.items()))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Similarity: {html.escape(assignment)}</title>
<style>{_STYLE}</style></head><body>
<h1>Similarity report: {html.escape(assignment)}</h1>
<p>{count} students' answers (solution cells and cells they added), compared with
<a href="https://github.com/blingenf/copydetect">copydetect</a>. Code given to every student in the
release is not counted. <strong>This report changes no grade.</strong> A high score is a reason
to read both answers, not evidence of copying: short exercises have few good solutions.</p>
{f"<h2>Not compared</h2><ul>{notes}</ul>" if notes else ""}
<h2>Pairs of students</h2>
{_rows(students, "student")}
<h2>Answers and the course's published code (reference solutions, book chapters, attnkit)</h2>
{_rows(against_course, "course file")}
</body></html>
"""


def run(submissions: Path, assignment: str, out: Path, root: Path = course.ROOT, release: Path | None = None,
        noise: int = 20, guarantee: int = 20) -> tuple[list[Pair], list[Pair]]:
    """Build the report for one assignment and write it to ``out``; return the ranked pairs."""
    if not submissions.is_dir():
        raise FileNotFoundError(f"no submissions folder {submissions} (expected SUBMISSIONS/<student>/"
                                f"{assignment}/*.ipynb, nbgrader's layout)")
    release = release or root / "exercises" / assignment
    with tempfile.TemporaryDirectory(prefix="similarity-") as tmp:
        students, refs, given = (Path(tmp) / name for name in ("students", "course", "given"))
        for folder in (students, refs, given):
            folder.mkdir()
        problems = collect_answers(submissions, assignment, students)
        count = len(list(students.glob("*.py")))
        if count == 0:
            raise FileNotFoundError(f"no answers found under {submissions}/<student>/{assignment}/*.ipynb")
        collect_references(root, refs, assignment)
        collect_boilerplate(release, given)
        between, against = rank(compare(students, refs, given, noise, guarantee))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(assignment, between, against, problems, count))
    return between, against


def _cli(args: argparse.Namespace) -> int:
    if args.assignment not in course.assignments():
        print(f"nothing was done: unknown assignment {args.assignment!r}; known: {', '.join(course.assignments())}",
              file=sys.stderr)
        return 2
    try:
        between, against = run(Path(args.submissions), args.assignment, Path(args.out),
                               noise=args.noise, guarantee=args.guarantee)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {len(between)} student pairs, {len(against)} matches with the course's code")
    for pair in between[:5]:
        print(f"  {pair.score:4.0%}  {pair.left}  {pair.right}")
    return 0


def add_similarity_parser(sub: argparse._SubParsersAction) -> None:
    """The ``similarity`` subcommand."""
    p = sub.add_parser("similarity", help="rank similar answers (students and course code) in an HTML page")
    p.add_argument("submissions", nargs="?", default="submitted",
                   help="folder of student folders, nbgrader's layout (default: submitted/)")
    p.add_argument("--assignment", required=True, help="assignment name, e.g. 01_single_head")
    p.add_argument("--out", default="similarity.html", help="HTML page to write (default: similarity.html)")
    p.add_argument("--noise", type=int, default=20, help="matches shorter than this many tokens are ignored")
    p.add_argument("--guarantee", type=int, default=20,
                   help="matches at least this many tokens long are always found")
    p.set_defaults(func=_cli)
