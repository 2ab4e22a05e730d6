"""IPython syntax in a student's cell, turned into plain Python the way Jupyter would run it.

Used by the harness, which runs the cells in the sandbox, and by the static authorship scan,
which must read the code exactly as the harness runs it. Bounded: IPython's own input
transformer re-tokenises the cell once per magic (a cell with hundreds of magics takes
minutes), so past ``MAX_TRANSFORMED_MAGICS`` magic lines, or ``MAX_TRANSFORMED_CHARS``
characters, a linear line-by-line rewrite is used instead.

This module is copied into the sandbox next to the harness, so it imports only the standard
library (and IPython's transformer, when it is installed, for a cell that needs it).
"""

from __future__ import annotations

import ast

MAX_TRANSFORMED_MAGICS = 20  # magic lines handed to IPython's transformer (quadratic in them)
MAX_TRANSFORMED_CHARS = 100_000  # larger cells are rewritten line by line


def cell_magic(code: str) -> tuple[str, str, str] | None:
    """``(name, arguments, body)`` when the cell starts with a cell magic (``%%writefile x.py``), else None."""
    lines = code.split("\n")
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("%%"):
            return None
        name, _, args = stripped[2:].partition(" ")
        return name, args.strip(), "\n".join(lines[i + 1:])
    return None


# The cell magics whose body Jupyter runs as Python in the notebook's namespace (``%%writefile`` writes its body to
# a file: the harness writes it, the scan reads it as the student's module). Any other (``%%bash``, ``%%script``,
# ``%%html``, ``%%javascript``, ``%%latex``, ``%%markdown``, ``%%svg``, ``%%perl``, ``%%ruby``, ``%%python3`` (another
# process), or a magic Jupyter does not know, which fails without running the body) runs no Python here.
PYTHON_CELL_MAGICS = ("time", "timeit", "capture", "prun", "writefile", "file")


def runs_python(code: str) -> bool:
    """Whether Jupyter runs the cell's body as Python in the notebook's namespace (no cell magic, or one of
    :data:`PYTHON_CELL_MAGICS`)."""
    magic = cell_magic(code)
    return magic is None or magic[0] in PYTHON_CELL_MAGICS


def strip_magics(code: str) -> str:
    """Turn IPython-only syntax (``%magic``, ``!shell``, ``obj?``) into plain Python that does nothing.

    A cell whose body Jupyter does not run as Python (:func:`runs_python`: ``%%bash``, ``%%script false``,
    ``%%html``, ...) becomes ``pass``: neither run nor scanned. A cell magic that runs its body (``%%time``,
    ``%%capture``, ...) becomes ``pass`` on its line and the cell's body runs as plain Python (``%%writefile`` is
    handled by the harness before this, and read by the scan as the module's code). A cell that is plain
    Python is left exactly as it is (a continuation line ``% x.dim()`` or a ``%`` inside a string is no
    magic); one that is not is handed to IPython's own input transformer, which turns only real magics
    at the start of logical lines into ``get_ipython()`` calls (a no-op in the sandbox).
    """
    if not runs_python(code):
        return "pass\n"
    lines = code.split("\n")
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("%%"):
            lines[i] = "pass  # " + stripped
        elif stripped:
            break
        i += 1
    code = "\n".join(lines)
    magic_lines = _magic_lines(lines)
    if not magic_lines:
        return code
    try:
        compile(code, "<cell>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        return code  # plain Python already
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        pass
    if magic_lines <= MAX_TRANSFORMED_MAGICS and len(code) <= MAX_TRANSFORMED_CHARS:
        try:
            from IPython.core.inputtransformer2 import TransformerManager  # imported only for cells that need it

            return TransformerManager().transform_cell(code)
        except Exception:  # noqa: BLE001 - no IPython, or it choked: rewrite line by line
            pass
    return _comment_out_magics(lines)


def _magic_lines(lines: list[str]) -> int:
    """How many lines could be IPython syntax (a magic, a shell escape or a help request)."""
    count = 0
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(("%", "!")) or stripped.endswith("?"):
            count += 1
    return count


def _comment_out_magics(lines: list[str]) -> str:
    """The linear rewrite: each line that starts with ``%`` or ``!`` becomes ``pass``, indentation kept."""
    out = []
    for line in lines:
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")):
            line = line[: len(line) - len(stripped)] + "pass  # " + stripped
        out.append(line)
    return "\n".join(out) + "\n"
