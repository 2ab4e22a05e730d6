"""Reading submissions defensively and deciding which of their cells to run.

The student's notebook is data, never trusted: only the code of its answer cells
(and cells the student added) is taken from it. Test cells and read-only cells
always come from the source notebook, whatever the student did to them (edited,
blanked, deleted, reordered, metadata changed), and test cells are not run in
the student's process at all: the judge grades them.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autograder.in_sandbox.magics import cell_magic

MAX_NOTEBOOK_BYTES = 32 << 20
MAX_RUN_BYTES = 1 << 20  # a file a notebook runs with %run: read at most this much
INSTALL_CELL = "install"  # grade_id of an exercise's first cell that installs the course package (tools/install_cell.py)


class BadNotebook(ValueError):
    """The submission cannot be read as a notebook."""


def cell_text(source: Any) -> str:
    if isinstance(source, list):
        return "".join(s for s in source if isinstance(s, str))
    return source if isinstance(source, str) else ""


_LAST_READ: list = []  # [(the file's identity, the notebook)]: the one notebook read last, in this process


def read_notebook(path: Path) -> dict:
    """Parse ``path`` as a notebook, refusing anything that is not plainly one.

    A submission's notebook is parsed once: the judge and the records (:mod:`autograder.records.written`) both
    read it, and the second read of an unchanged file (same device, inode, size, modification and change
    times) returns the same object. Callers read it and never change it."""
    try:
        st = path.stat()
        size = st.st_size
    except OSError as e:
        raise BadNotebook(f"the notebook could not be read ({e.strerror})") from None
    identity = (str(path), st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns)
    if _LAST_READ and _LAST_READ[0][0] == identity:
        return _LAST_READ[0][1]
    nb = _parse_notebook(path, size)
    _LAST_READ[:] = [(identity, nb)]
    return nb


def _parse_notebook(path: Path, size: int) -> dict:
    if size == 0:
        raise BadNotebook("the notebook file is empty")
    if size > MAX_NOTEBOOK_BYTES:
        raise BadNotebook(f"the notebook file is {size >> 20} MiB, over the {MAX_NOTEBOOK_BYTES >> 20} MiB limit")
    try:
        nb = json.loads(path.read_bytes().decode("utf-8-sig"))  # a byte-order mark (some editors add one) is fine
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadNotebook(f"the notebook is not valid JSON ({str(e)[:120]})") from None
    if isinstance(nb, dict) and nb.get("nbformat") == 3 and isinstance(nb.get("worksheets"), list):
        raise BadNotebook("the notebook is in the old format 3: open it in a current Jupyter and save it again "
                          "(that converts it to format 4)")
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise BadNotebook("the file is JSON but not a notebook (no list of cells)")
    return nb


def nbgrader_meta(cell: dict) -> dict:
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    nbg = meta.get("nbgrader") if isinstance(meta, dict) else None
    return nbg if isinstance(nbg, dict) else {}


def canonical_text(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


def defined_names(code: str) -> set[str]:
    """Top-level functions and classes a cell defines (empty if it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


@dataclass
class SourceCell:
    kind: str  # "solution", "test", "setup" (read-only code), "install" (the package's install cell), "markdown"
    grade_id: str
    code: str
    points: float = 0.0
    cell_id: str = ""


@dataclass
class SourceNotebook:
    """A source notebook reduced to what grading needs."""

    name: str
    cells: list[SourceCell]

    @classmethod
    def load(cls, path: Path, release_path: Path | None = None) -> "SourceNotebook":
        nb = json.loads(path.read_text())
        release = json.loads(release_path.read_text()) if release_path and release_path.exists() else None
        visible = {nbgrader_meta(c).get("grade_id"): cell_text(c.get("source")) for c in (release or {}).get("cells", [])}
        cells = []
        for c in nb["cells"]:
            meta = nbgrader_meta(c)
            gid = meta.get("grade_id", "")
            code = cell_text(c.get("source"))
            if c.get("cell_type") != "code":
                kind = "markdown"
            elif meta.get("solution"):
                kind = "solution"
            elif meta.get("grade"):
                kind = "test"
                code = visible.get(gid, code)  # the version students see: hidden tests stripped
            elif gid == INSTALL_CELL:
                kind = "install"  # installs the course package where it is missing: the student's setting, not run
            else:
                kind = "setup"
            cells.append(SourceCell(kind, gid, code, float(meta.get("points", 0) or 0), str(c.get("id", ""))))
        return cls(path.stem, cells)

    def tests(self) -> list[SourceCell]:
        return [c for c in self.cells if c.kind == "test"]

    def solutions(self) -> list[SourceCell]:
        return [c for c in self.cells if c.kind == "solution"]


@dataclass
class Plan:
    """What runs in the student's process, in order, and which code answers which part."""

    cells: list[tuple[str, str]] = field(default_factory=list)  # (label, code)
    answers: dict[str, str] = field(default_factory=dict)  # part (solution grade_id) -> the student's code
    notes: list[str] = field(default_factory=list)


def cell_label(code: str, grade_id: str | None) -> str:
    """How a message names a cell so that a student finds it in the notebook (the feedback shows no cell
    numbers): an answer cell by its name, any other by its first line of code."""
    if grade_id:
        return f"your cell {grade_id!r}"
    first = next((line.strip() for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")),
                 code.strip().splitlines()[0] if code.strip() else "")
    return f"your cell that begins {first[:50]!r}"


RUN_FLAGS = {"-i", "-t", "-N", "-p", "-d", "-e", "-n", "-q"}  # %run's options that take no value


def run_target(args: str) -> str:
    """The file a ``%run`` line runs (``args``: what follows ``%run``), as IPython reads it: options first
    (``-i``, ``-t``, ...; ``-m NAME`` names a module), then the file, quoted or not, ``.py`` added when it has no
    suffix; what follows is the script's own argv. Raises ValueError saying what is wrong."""
    try:
        words = shlex.split(args)
    except ValueError as e:
        raise ValueError(f"%run {args.strip()[:80]!r} could not be read ({e})") from None
    module = False
    while words and words[0].startswith("-"):
        flag = words.pop(0)
        if flag == "-m":
            module = True
            break
        if flag not in RUN_FLAGS and not flag.startswith(("-G", "-T", "-D")):
            raise ValueError(f"%run option {flag!r} is not supported by the grader (use %run FILE.py)")
    if not words:
        raise ValueError("%run needs a file name")
    name = words[0]
    if module:
        name = name.replace(".", "/") + ".py"
    elif not os.path.splitext(name)[1]:
        name += ".py"
    return name


def read_student_file(folder: Path | None, name: str) -> str:
    """The text of ``name`` in the submission's folder, read defensively: a relative path inside the folder (no
    ``..``, no absolute path), no symbolic link on the way, a regular file of at most ``MAX_RUN_BYTES``, UTF-8.
    Raises ValueError saying what is wrong (a missing file included)."""
    parts = Path(name).parts
    if folder is None:
        raise ValueError(f"no file {name} beside the notebook (no submission folder)")
    if not parts or Path(name).is_absolute() or ".." in parts or name.startswith("~"):
        raise ValueError(f"%run {name}: only a file of your submission's folder can be run (no absolute path, no ..)")
    path = folder
    for i, part in enumerate(parts):
        path = path / part
        try:
            st = os.lstat(path)
        except OSError:
            raise ValueError(f"no file {name} in your submission's folder: %run {name} runs nothing "
                             "(submit the file beside the notebook)") from None
        if stat.S_ISLNK(st.st_mode):
            raise ValueError(f"%run {name}: {'/'.join(parts[:i + 1])} is a symbolic link, which the grader does not "
                             "follow; submit the file itself")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"%run {name}: not a regular file")
    if st.st_size > MAX_RUN_BYTES:
        raise ValueError(f"%run {name}: the file is {st.st_size} bytes, over the grader's limit of {MAX_RUN_BYTES}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_RUN_BYTES + 1)
    except OSError as e:
        raise ValueError(f"%run {name}: the file could not be read ({e.strerror})") from None
    if len(data) > MAX_RUN_BYTES:
        raise ValueError(f"%run {name}: the file is over the grader's limit of {MAX_RUN_BYTES} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"%run {name}: the file is not UTF-8 text") from None


def expand_runs(code: str, label: str, folder: Path | None) -> list[tuple[str, str]]:
    """A student's cell as the cells it runs: ``%run FILE`` at the start of a top-level line runs the file of the
    submission's folder in the notebook's namespace, so the file's text becomes a cell of its own (run, and scanned
    as the student's code), between the cell's code before and after the line (each keeps its line numbers). A file
    that cannot be run becomes a cell that raises, saying why, as Jupyter's %run would fail. A cell whose body
    Jupyter does not run as Python (a cell magic) is left as it is."""
    lines = code.split("\n")
    runs = [i for i, line in enumerate(lines) if line.startswith("%run") and line[4:5] in ("", " ", "\t")]
    if not runs or cell_magic(code) is not None:
        return [(label, code)]
    out: list[tuple[str, str]] = []
    start = 0
    for n, i in enumerate(runs):
        before = "\n" * start + "\n".join(lines[start:i])  # padded: its line numbers stay the cell's
        if before.strip():
            out.append((label if not out else f"{label} (after a %run)", before))
        try:
            name = run_target(lines[i][4:])
            text = read_student_file(folder, name)
            out.append((f"your file {name!r} (%run in {label.removeprefix('your ')})", text))
        except ValueError as e:
            out.append((f"{label} (its %run line {i + 1})", f"raise FileNotFoundError({str(e)!r})\n"))
        start = i + 1
    after = "\n" * start + "\n".join(lines[start:])
    if after.strip():
        out.append((f"{label} (after a %run)", after))
    return out


def plan_cells(source: SourceNotebook, student: dict, folder: Path | None = None) -> Plan:
    """Match the student's cells to the source and list the code to run.

    A student cell is taken as a test cell (and skipped) when its grade_id names a
    source test, or its text is that of a source test; as a read-only cell (and
    replaced by the source's text) when its grade_id or text is that of a source
    setup cell. Everything else is the student's own code and runs in their order:
    answer cells are matched to parts by grade_id, or failing that by the
    function or class they define. ``%run FILE`` in a student's cell runs a
    file of ``folder`` (the submission's folder), listed as a cell of its own
    (:func:`expand_runs`).
    """
    tests = {c.grade_id: c for c in source.tests()}
    test_texts = {canonical_text(c.code) for c in tests.values()}
    setups = {c.grade_id: c for c in source.cells if c.kind == "setup"}
    installs = {canonical_text(c.code) for c in source.cells if c.kind == "install"}
    setup_texts = {canonical_text(c.code): c for c in setups.values()}
    parts = {c.grade_id for c in source.solutions()}
    plan = Plan()
    used_setup: set[str] = set()
    pending_setup = [c for c in source.cells if c.kind == "setup"]

    for i, cell in enumerate(student["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        code = cell_text(cell.get("source"))
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id") if isinstance(meta.get("grade_id"), str) else ""
        if gid in tests or canonical_text(code) in test_texts:
            continue
        if gid == INSTALL_CELL or canonical_text(code) in installs:
            continue  # the install cell (tools/install_cell.py) is for the student's own kernel: never run here
        setup = setups.get(gid) or setup_texts.get(canonical_text(code))
        if setup is not None and gid not in parts:
            if setup.grade_id not in used_setup:
                # Source setup cells run in source order up to and including this one.
                while pending_setup:
                    s = pending_setup.pop(0)
                    used_setup.add(s.grade_id)
                    plan.cells.append((f"setup cell {s.grade_id!r}", s.code))
                    if s is setup:
                        break
            continue
        if not code.strip():
            continue
        label = cell_label(code, gid)
        pieces = expand_runs(code, label, folder)
        for piece_label, piece in pieces:
            plan.cells.append((piece_label, piece))
            part = gid if gid in parts else next((p for p in sorted(defined_names(piece)) if p in parts), None)
            if part is not None:
                plan.answers[part] = plan.answers.get(part, "") + (piece if len(pieces) == 1 else piece.lstrip("\n")) + "\n"
    if pending_setup:
        missing = [s.grade_id for s in pending_setup]
        plan.notes.append(f"read-only cells restored from the assignment: {', '.join(missing)}")
        plan.cells[0:0] = [(f"setup cell {s.grade_id!r}", s.code) for s in pending_setup]
    for part in parts - set(plan.answers):
        plan.notes.append(f"no answer cell found for {part!r}")
    return plan
