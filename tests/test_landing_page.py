"""The landing page (book/intro.md) lists every chapter of _toc.yml, in order, with its title, module and exercise.

A chapter added to _toc.yml without a row on the landing page fails here, and so does a row whose
module does not exist in attnkit or whose exercise is not in exercises/.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
INTRO = ROOT / "book" / "intro.md"
LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")


def toc_chapters() -> list[str]:
    """The chapter notebooks of _toc.yml's "Chapters" part, e.g. ``book/01_single_head``."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    part = next(p for p in toc["parts"] if p.get("caption") == "Chapters")
    return [c["file"] for c in part["chapters"]]


def table_rows() -> list[list[str]]:
    """The cells of each row of the table under "## Chapters" (header and rule left out)."""
    text = INTRO.read_text()
    section = text.split("\n## Chapters\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows[0].split("|")[1].strip() == "chapter" and set(rows[1]) <= set("|- "), rows[:2]
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows[2:]]


def title(notebook: Path) -> str:
    """The notebook's H1, "06 · Positional encoding" read as "06 Positional encoding"."""
    first = json.loads(notebook.read_text())["cells"][0]
    source = "".join(first["source"]) if isinstance(first["source"], list) else first["source"]
    heading = source.splitlines()[0].removeprefix("# ")
    return heading.replace(" · ", " ")


def test_every_chapter_of_the_toc_has_a_row_in_order():
    chapters = toc_chapters()
    linked = [LINK.search(row[0]).group(2) for row in table_rows()]
    want = [Path(c).name + ".ipynb" for c in chapters]
    missing = [w for w in want if w not in linked]
    assert not missing, (f"book/intro.md's chapter table has no row for {', '.join(missing)}: add one "
                         "(chapter | what you learn | attnkit module | exercise)")
    assert linked == want, f"the table's chapters {linked} are not _toc.yml's, in its order: {want}"


@pytest.mark.parametrize("row", table_rows(), ids=lambda row: LINK.search(row[0]).group(2))
def test_each_row_names_its_title_module_and_exercise(row):
    assert len(row) == 4, f"a row has four cells (chapter, what you learn, module, exercise): {row}"
    chapter, learn, modules, exercise = row
    text, target = LINK.search(chapter).groups()
    notebook = ROOT / "book" / target
    assert notebook.is_file(), f"{target} does not exist"
    assert text == title(notebook), f"the row says {text!r}, the chapter's title is {title(notebook)!r}"
    assert len(learn) > 20, f"{target}: say what the chapter teaches"
    named = re.findall(r"`(attnkit\.[a-z_]+)`", modules)
    assert named, f"{target}: name the chapter's attnkit module(s) as `attnkit.name`, got {modules!r}"
    for module in named:
        assert importlib.util.find_spec(module) is not None, f"{target}: {module} does not exist"
    number = target[:2]
    ex_text, ex_target = LINK.search(exercise).groups()
    ex_path = (ROOT / "book" / ex_target).resolve()
    assert ex_text == number and ex_path.is_file(), f"{target}: exercise link {exercise} does not lead to a file"
    assert ex_path.parent.name == notebook.stem, (f"{target}: the exercise {ex_target} is not in "
                                                  f"exercises/{notebook.stem}/")
