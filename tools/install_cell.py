"""Write each chapter's first code cell, which installs attnkit on Colab or Binder.

The repository URL and the release tag live in one place, _config.yml
(`repository.url` and `course.release`); this script writes them into the chapters:

    .venv/bin/python -m tools.install_cell          # rewrite book/NN_*.ipynb (and exercises' install cells)
    .venv/bin/python -m tools.install_cell --check  # exit 1 if a chapter is stale

The install pins the release tag, not the moving branch, so a reader on Colab gets
the package the book was built against. A chapter that needs a package beyond attnkit's
(``EXTRAS``: chapter 10 needs Triton) installs it in the same cell when it is missing, with
the requirement written in requirements.txt. tests/test_book.py checks the cells.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent


def install_spec(config: dict | None = None) -> str:
    """'git+URL@TAG' from _config.yml: the pip requirement's URL, without the subdirectory."""
    config = config or yaml.safe_load((ROOT / "_config.yml").read_text())
    url = config["repository"]["url"].rstrip("/")
    release = config["course"]["release"]
    return f"git+{url}@{release}"


# chapter -> the module it needs beyond attnkit, looked up (never imported: importing Triton here would
# come before attnkit.flash_triton picks the interpreter on a machine without a GPU)
EXTRAS = {"10_flash_triton": "triton"}


def requirement(module: str) -> str:
    """The requirements.txt line that installs ``module`` (``triton>=3.7.1,<3.10``)."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        spec = line.split("#")[0].split(";")[0].strip()  # without a comment or a platform marker
        if spec.startswith(module):
            return spec
    raise KeyError(f"requirements.txt has no line for {module}")


def install_cell_source(config: dict | None = None, chapter: str | None = None) -> str:
    """The source of the first code cell of ``chapter`` (``01_single_head``); without one, of every
    chapter that needs nothing beyond attnkit."""
    source = (
        "# Install the course package if it is missing (Colab, Binder); a no-op locally.\n"
        "# Written by tools/install_cell.py from _config.yml: edit the URL and tag there.\n"
        "try:\n"
        "    import attnkit\n"
        "except ImportError:\n"
        f'    release = "{install_spec(config)}"\n'
        '    %pip install -q "attnkit @ {release}#subdirectory=solutions"\n'
        "    import attnkit"
    )
    if chapter in EXTRAS:
        module = EXTRAS[chapter]
        source += (
            f"\n\n# This chapter also needs {module} (Linux wheels; Colab's GPU runtime has it): found, not\n"
            "# imported, so that attnkit can pick Triton's interpreter first where there is no GPU.\n"
            "import importlib.util\n\n"
            f'if importlib.util.find_spec("{module}") is None:\n'
            f'    %pip install -q "{requirement(module)}"'
        )
    return source


def chapters() -> list[Path]:
    return sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def exercise_sources() -> list[Path]:
    """The source notebooks whose first code cell is an install cell (grade_id ``install``: an exercise whose visible
    tests use attnkit); ``python -m autograder release`` carries it into the exercise, the grader never runs it."""
    found = []
    for path in sorted((ROOT / "solutions" / "assignments").glob("*/*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        if any(c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "install" for c in cells):
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale chapters, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path in chapters():
        want = install_cell_source(chapter=path.stem)
        nb = nbformat.read(path, as_version=4)
        cell = next(c for c in nb.cells if c.cell_type == "code")
        if cell.source != want:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                cell.source = want
                nbformat.write(nb, path)
    for path in exercise_sources():
        text = path.read_text()
        nb = json.loads(text)
        cell = next(c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "install")
        cell["source"] = install_cell_source(chapter=path.parent.name).splitlines(keepends=True)
        new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new)
    for path in stale:
        print(("stale: " if args.check else "rewrote: ") + str(path))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
