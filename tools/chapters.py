"""The book's chapters as _toc.yml lists them, each one run top to bottom as a plain Python script.

Only the standard library (and matplotlib, which the chapters need anyway): the device check
(tools/device_check.py) runs chapters on machines with Python and torch but no Jupyter, no
nbformat and no YAML parser, as a reader's Colab runtime executes them cell after cell.

    python -m tools.chapters list                        # the chapters, in the book's order
    python -m tools.chapters run book/01_single_head.ipynb [...]   # run each, in a fresh namespace

A run executes the code cells in order in one namespace, from the chapter's own folder (as
Jupyter Book does), with matplotlib's headless backend. IPython's ``%`` and ``!`` lines are
replaced by ``pass`` (indentation kept). The install cell (tools/install_cell.py) stays: it is
where a chapter imports ``attnkit``, and with its ``%pip install`` gone it imports the package
this checkout provides, or fails saying so. A cell that raises stops the run with the chapter,
the cell number and the traceback.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_FILE = re.compile(r"^\s*-\s*file:\s*(\S+)\s*$")
_CAPTION = re.compile(r"^\s*-\s*caption:\s*(.+?)\s*$")


def toc_chapters(root: Path = ROOT) -> list[Path]:
    """The notebooks of _toc.yml's "Chapters" part, in order (read without a YAML parser)."""
    chapters, inside = [], False
    for line in (root / "_toc.yml").read_text().splitlines():
        caption = _CAPTION.match(line)
        if caption:
            inside = caption.group(1).strip("'\"") == "Chapters"
            continue
        match = _FILE.match(line)
        if inside and match:
            chapters.append(root / f"{match.group(1)}.ipynb")
    if not chapters:
        raise ValueError(f"no chapters found under 'caption: Chapters' in {root / '_toc.yml'}")
    return chapters


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def as_python(source: str) -> str:
    """A cell's source with IPython's ``%`` and ``!`` lines replaced by ``pass`` (indentation kept)."""
    lines = []
    for line in source.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")):
            line = line[: len(line) - len(stripped)] + "pass  # IPython: " + stripped
        lines.append(line)
    return "\n".join(lines)


def code_cells(notebook: Path) -> list[tuple[int, str]]:
    """``(cell number, Python source)`` of each code cell, as it runs in a script.

    The number counts every cell of the notebook from 1, markdown included, as Jupyter shows them.
    """
    cells = json.loads(Path(notebook).read_text())["cells"]
    out = []
    for number, cell in enumerate(cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        out.append((number, as_python(_source(cell))))
    return out


def script(notebook: Path) -> str:
    """The chapter as one Python script, a comment before each cell."""
    return "\n\n".join(f"# -- cell {n}\n{src}" for n, src in code_cells(notebook)) + "\n"


def attnkit_imports(source: str) -> set[tuple[str, str | None]]:
    """Every ``(module, name)`` of attnkit a source uses: ``from attnkit.m import X`` gives
    ``("attnkit.m", "X")``, ``import attnkit.m`` gives ``("attnkit.m", None)`` and ``attnkit.X``
    (with ``import attnkit``) gives ``("attnkit", "X")``."""
    found: set[tuple[str, str | None]] = set()
    aliases: dict[str, str] = {}  # local name -> attnkit module it stands for
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                node.module.split(".")[0] == "attnkit":
            for alias in node.names:
                found.add((node.module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "attnkit":
                    found.add((alias.name, None))
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "attnkit"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.add((aliases[node.value.id], node.attr))
    return found


class ChapterError(Exception):
    """A cell of a chapter raised; the message names the chapter and the cell."""


def run(notebook: Path, *, log=print) -> float:
    """Run the chapter's code cells in order in one namespace; return the seconds it took."""
    notebook = Path(notebook).resolve()
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    namespace: dict = {"__name__": "__main__", "display": print}
    cwd = Path.cwd()
    start = time.perf_counter()
    os.chdir(notebook.parent)
    try:
        for number, source in code_cells(notebook):
            code = compile(source, f"{notebook.name}, cell {number}", "exec")
            try:
                exec(code, namespace)  # noqa: S102 - the chapter is this repository's own code
            except Exception as err:  # reported with the cell, then raised
                raise ChapterError(f"{notebook.name}: cell {number} raised {type(err).__name__}: {err}") from err
            finally:
                plt.close("all")
    finally:
        os.chdir(cwd)
    seconds = time.perf_counter() - start
    log(f"{notebook.name}: {len(code_cells(notebook))} code cells ran in {seconds:.1f} s")
    return seconds


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("list", "run"):
        print(__doc__)
        return 2
    if args[0] == "list":
        for path in toc_chapters():
            print(path.relative_to(ROOT))
        return 0
    status = 0
    for path in args[1:] or [str(p) for p in toc_chapters()]:
        try:
            run(Path(path))
        except ChapterError as err:
            traceback.print_exception(err.__cause__)
            print(f"FAILED {err}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
