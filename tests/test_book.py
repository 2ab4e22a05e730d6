"""The book: its configuration, its pages' reader features, and a clean build that executes every chapter.

The fast tests read the sources; the slow ones use the session's single build
(book_fixtures.book_build), the same command as `make book`.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import nbformat
import pytest
import yaml

pytest.register_assert_rewrite("book_fixtures")
from book_fixtures import (  # noqa: E402
    ROOT, BookBuild, chapter_docnames, executed_notebook, exercise_docnames, toc_docnames,
)

pytest_plugins = ["book_fixtures"]  # one session-wide build, shared with test_browser.py

from tools.install_cell import install_cell_source, install_spec  # noqa: E402

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
INSTALL_SPEC = install_spec(CONFIG)  # git+URL@TAG, from _config.yml
LINE_LIMIT = 88  # characters of code the book's column shows without scrolling
CHAPTERS = chapter_docnames()
EXERCISES = exercise_docnames()


def _topic(docname: str) -> str:
    """'book/01_single_head' or 'exercises/01_single_head/single_head' -> '01_single_head'."""
    return Path(docname).parts[1] if docname.startswith("exercises/") else Path(docname).name


def _links(nb: nbformat.NotebookNode, cells=None) -> list[str]:
    text = "\n".join(c.source for c in (cells if cells is not None else nb.cells) if c.cell_type == "markdown")
    return re.findall(r"\]\(([^)\s]+)\)", text)


# --- configuration -----------------------------------------------------------------


def test_toc_lists_every_chapter_and_exercise():
    """Every chapter notebook and every released exercise notebook is a page of the book."""
    pages = set(toc_docnames())
    chapters = {f"book/{p.stem}" for p in (ROOT / "book").glob("[0-9][0-9]_*.ipynb")}
    exercises = {str(p.relative_to(ROOT).with_suffix("")) for p in (ROOT / "exercises").glob("*/*.ipynb")}
    assert not chapters - pages, f"chapters missing from _toc.yml: {sorted(chapters - pages)}"
    assert not exercises - pages, f"exercises missing from _toc.yml: {sorted(exercises - pages)}"


def test_config_execution_and_launch_buttons():
    """Cached execution that fails on errors; exercises not executed; Colab, Binder, repository buttons."""
    execute = CONFIG["execute"]
    assert execute["execute_notebooks"] == "cache" and execute["allow_errors"] is False
    assert any(Path("/x/exercises/01_topic/topic.ipynb").match(p) for p in execute["exclude_patterns"])
    assert CONFIG["only_build_toc_files"] is True
    assert CONFIG["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert CONFIG["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
    assert CONFIG["repository"]["url"] == "https://github.com/attention-course/attention-course"
    assert CONFIG["repository"]["branch"] == "main"
    release = str(CONFIG["course"]["release"])
    assert re.fullmatch(r"v\d+\.\d+\.\d+", release), (
        f"course.release in _config.yml must be a release tag like v1.2.3, not {release!r}: "
        "the Colab install must not follow a moving branch")
    assert CONFIG["html"]["use_repository_button"] is True
    assert CONFIG["sphinx"]["config"]["html_theme_options"]["use_download_button"] is True
    mathjax = CONFIG["sphinx"]["config"]["mathjax_path"]
    assert not mathjax.startswith(("http:", "https:", "//")), "MathJax must be served locally, not from a CDN"


# --- reader features of every chapter and exercise ---------------------------------


@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_first_cell_installs_attnkit(docname):
    """The first code cell installs attnkit's pinned release only when the import fails (Colab).

    The cell is written from _config.yml (repository URL, release tag) by tools/install_cell.py,
    so the URL lives in one place.
    """
    nb = nbformat.read(ROOT / f"{docname}.ipynb", as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code").source
    assert re.search(r"try:\s*\n\s*import attnkit", first), f"{docname}: first code cell should `try: import attnkit`"
    assert "except ImportError" in first and "%pip install" in first, f"{docname}: no install on ImportError"
    assert first == install_cell_source(CONFIG, Path(docname).name), (
        f"{docname}: the install cell differs from _config.yml's repository and release: "
        "run `.venv/bin/python -m tools.install_cell`")


@pytest.mark.parametrize("docname", EXERCISES)
def test_exercise_installs_attnkit_if_it_uses_it(docname):
    """An exercise that imports attnkit installs it first, like a chapter (exercises usually do not use it).

    Only an import at the top level of a cell runs whatever happens; one inside a function or a branch
    runs when the cell chooses to (exercise 09's last cell: only where the repository's checkpoint is)."""
    nb = nbformat.read(ROOT / f"{docname}.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    if not any(re.search(r"^(import attnkit|from attnkit)", src, re.M) for src in code):
        return
    assert INSTALL_SPEC in code[0] and "except ImportError" in code[0], (
        f"{docname} imports attnkit: its first code cell must install it when missing (see book/01_single_head)"
    )


@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_links_its_exercise(docname):
    """A chapter links the exercise notebook(s) of its topic, and the link resolves."""
    topic = _topic(docname)
    exercises = sorted((ROOT / "exercises" / topic).glob("*.ipynb"))
    if not exercises:
        pytest.skip(f"no exercise released for {topic} yet")
    nb = nbformat.read(ROOT / f"{docname}.ipynb", as_version=4)
    targets = {(ROOT / "book" / link.split("#")[0]).resolve() for link in _links(nb)}
    missing = [str(e.relative_to(ROOT)) for e in exercises if e.resolve() not in targets]
    assert not missing, (f"{docname} should link its exercise: add [Exercise ...](../exercises/{topic}/"
                         f"{exercises[0].name}) near the learning goals; not linked: {missing}")


@pytest.mark.parametrize("docname", EXERCISES)
def test_exercise_links_back_to_chapter(docname):
    """The exercise's first markdown cell links back to its chapter, which exists."""
    path = ROOT / f"{docname}.ipynb"
    nb = nbformat.read(path, as_version=4)
    first_md = [next(c for c in nb.cells if c.cell_type == "markdown")]
    topic = _topic(docname)
    chapter = ROOT / "book" / f"{topic}.ipynb"
    targets = {(path.parent / link.split("#")[0]).resolve() for link in _links(nb, first_md)}
    assert chapter.resolve() in targets, (
        f"{docname}: the first markdown cell should link its chapter: "
        f"[chapter {topic[:2]}](../../book/{topic}.ipynb)"
    )
    assert chapter.exists(), f"{docname} links book/{topic}.ipynb, which does not exist yet"


# --- code fits the column ----------------------------------------------------------

BOOK_PAGES = [d for d in toc_docnames() if d.startswith("book/")]
_FENCE = re.compile(r"^(`{3,}|~{3,})(?!\{)[^\n]*\n(.*?)^\1\s*$", re.M | re.S)
_INCLUDE = re.compile(r"^```\{literalinclude\}\s+(\S+)\s*\n((?::[\w-]+:.*\n)*)", re.M)
_HIDDEN = {"remove-input", "remove-cell", "remove_input", "remove_cell"}


def _page_sources(docname: str) -> tuple[list[str], list[str]]:
    """(code cells shown, markdown texts) of a book page (.ipynb or .md)."""
    path = ROOT / f"{docname}.ipynb"
    if path.exists():
        nb = nbformat.read(path, as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"
                and not _HIDDEN & set(c.metadata.get("tags", []))]
        return code, [c.source for c in nb.cells if c.cell_type == "markdown"]
    return [], [(ROOT / f"{docname}.md").read_text()]


def _pyobject_lines(path: Path, name: str) -> list[str]:
    """The source lines `{literalinclude}` with `:pyobject: name` shows (decorators included)."""
    import ast

    source = path.read_text()
    scope: list = ast.parse(source).body
    node = None
    for part in name.split("."):
        node = next((n for n in scope if getattr(n, "name", None) == part), None)
        assert node is not None, f"{path.name} has no {name!r} for :pyobject:"
        scope = getattr(node, "body", [])
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return source.splitlines()[start - 1:node.end_lineno]


def _shown_code(docname: str) -> list[tuple[str, str]]:
    """Every line of code the page shows, as (where, line)."""
    code, markdown = _page_sources(docname)
    shown = [(f"code cell {i}", line) for i, src in enumerate(code) for line in src.splitlines()]
    base = (ROOT / docname).parent
    for text in markdown:
        for match in _FENCE.finditer(text):
            shown += [("code block", line) for line in match.group(2).splitlines()]
        for match in _INCLUDE.finditer(text):
            options = dict(re.findall(r":([\w-]+):\s*(.*)", match.group(2)))
            path = (base / match.group(1)).resolve()
            lines = (_pyobject_lines(path, options["pyobject"]) if "pyobject" in options
                     else path.read_text().splitlines())
            where = f"{path.relative_to(ROOT)}::{options.get('pyobject', '')}"
            shown += [(where, line) for line in lines]
    return shown


def _too_long(shown: list[tuple[str, str]]) -> list[str]:
    return [f"{where}: {len(line)} chars: {line.strip()[:60]}..."
            for where, line in shown if len(line) > LINE_LIMIT]


def test_line_check_catches_a_long_line():
    """The check itself: an 89-character line is reported, an 88-character one is not."""
    assert _too_long([("x", "y" * (LINE_LIMIT + 1))]) and not _too_long([("x", "y" * LINE_LIMIT)])


@pytest.mark.parametrize("docname", BOOK_PAGES + EXERCISES)
def test_code_cells_fit_the_column(docname):
    """Code cells and code blocks written in the page: at most 88 characters a line.

    The released exercises are pages of the book too (_toc.yml globs them): their setup,
    stubs, visible tests and question cells are read in the same column.
    """
    shown = [(w, line) for w, line in _shown_code(docname) if "::" not in w]
    long_lines = _too_long(shown)
    assert not long_lines, (f"{docname}: {len(long_lines)} lines of code are wider than the column "
                            f"({LINE_LIMIT}):\n  " + "\n  ".join(long_lines[:20]))


@pytest.mark.parametrize("docname", BOOK_PAGES)
def test_included_package_code_fits_the_column(docname):
    """Package code the page shows with {literalinclude}: at most 88 characters a line."""
    shown = [(w, line) for w, line in _shown_code(docname) if "::" in w]
    long_lines = _too_long(shown)
    objects = sorted({line.split(": ")[0] for line in long_lines})
    assert not long_lines, (f"{docname} shows package code wider than the column ({LINE_LIMIT}) "
                            f"in {objects}:\n  " + "\n  ".join(long_lines[:20]))


@pytest.mark.parametrize("docname", BOOK_PAGES)
def test_headings_in_order(docname):
    """One title (#) per page, and no heading skips a level (## then ####)."""
    _, markdown = _page_sources(docname)
    text = _FENCE.sub("", "\n".join(markdown))
    levels = [len(m.group(1)) for m in re.finditer(r"^(#{1,6}) ", text, re.M)]
    assert levels.count(1) == 1 and levels[0] == 1, f"{docname}: headings {levels}: one # title first"
    skips = [(a, b) for a, b in zip(levels, levels[1:]) if b > a + 1]
    assert not skips, f"{docname}: a heading skips a level (from {skips[0][0]} to {skips[0][1]} #)"


@pytest.mark.parametrize("docname", CHAPTERS)
def test_every_figure_has_caption_and_alt_text(docname):
    """A code cell that shows a figure carries MyST-NB figure metadata: caption, name, alt text."""
    nb = nbformat.read(ROOT / f"{docname}.ipynb", as_version=4)
    missing = []
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        shows = cell.source.count("plt.show()")
        if not shows:
            continue
        figure = cell.metadata.get("mystnb", {}).get("figure", {})
        alt = cell.metadata.get("mystnb", {}).get("image", {}).get("alt", "")  # MyST-NB reads mystnb.*
        if shows > 1 or not figure.get("caption") or not figure.get("name") or len(alt) < 20:
            missing.append(i)
    assert not missing, (f"{docname}: code cells {missing} show a figure without "
                         "metadata mystnb.figure.caption/name and mystnb.image.alt (one figure per cell)")


# --- the build ---------------------------------------------------------------------


@pytest.mark.slow
def test_book_builds_without_warnings(book_build: BookBuild):
    """`make book` succeeds: no Sphinx warning (they are errors) and no chapter cell that raises."""
    assert book_build.returncode == 0 and not book_build.problems, book_build.describe()


@pytest.mark.slow
@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_executed(book_build: BookBuild, docname):
    """Every code cell of the chapter ran (the build executes chapters) and none raised."""
    nb = executed_notebook(docname)
    assert nb is not None, f"{docname} was not executed by the build:\n" + book_build.describe()
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        first_line = cell.source.splitlines()[0] if cell.source else ""
        assert cell.execution_count is not None, f"{docname}: code cell {i} ({first_line!r}) did not run"
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{docname}: code cell {i} ({first_line!r}) raised {errors[0].ename}: {errors[0].evalue}"


@pytest.mark.slow
@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_outputs_need_no_javascript(book_build: BookBuild, docname):
    """No ipywidget outputs: offline they show nothing but their initial text (e.g. a 0% tqdm bar)."""
    nb = executed_notebook(docname)
    if nb is None:
        pytest.skip(f"{docname} did not execute: test_chapter_executed reports why")
    widgets = [i for i, c in enumerate(c for c in nb.cells if c.cell_type == "code")
               if any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in c.outputs)]
    assert not widgets, (f"{docname}: code cells {widgets} output ipywidgets, which need JavaScript from a "
                         "CDN: use `from tqdm import tqdm` (text progress bars) or print progress instead")


@pytest.mark.slow
@pytest.mark.parametrize("docname", EXERCISES)
def test_exercise_page_shows_blanks_and_visible_tests(book_build: BookBuild, docname):
    """The exercise page is the released notebook, unexecuted: blanks and visible tests, no outputs."""
    page = book_build.html / f"{docname}.html"
    assert page.exists(), f"no page for {docname}:\n" + book_build.describe()
    text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
    assert "YOUR CODE HERE" in text and "NotImplementedError" in text, f"{docname}: the blanks are not shown"
    assert 'class="cell_output' not in page.read_text(), f"{docname} was executed; it must not be"
    nb = nbformat.read(ROOT / f"{docname}.ipynb", as_version=4)
    tests = [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]
    assert tests, f"{docname} has no visible test cells"
    for cell in tests:
        line = cell.source.strip().splitlines()[0]
        assert line in text, f"{docname}: visible test {cell.metadata['nbgrader']['grade_id']} is not on the page"


@pytest.mark.slow
def test_mathjax_is_served_by_the_book(book_build: BookBuild):
    """MathJax is part of the built site (copied from _vendor/mathjax), so math renders offline."""
    script = book_build.html / "_static" / CONFIG["sphinx"]["config"]["mathjax_path"]
    assert script.is_file(), (f"{script.relative_to(ROOT)} is missing: run `make install`, which fetches "
                              "MathJax from npm into _vendor/mathjax once")
    page = (book_build.html / "book" / "01_single_head.html").read_text()
    assert "cdn.jsdelivr.net" not in page and "_static/mathjax/" in page


@pytest.mark.slow
def test_download_sources_exist(book_build: BookBuild):
    """The download button serves each notebook's .ipynb."""
    for docname in CHAPTERS + EXERCISES:
        source = book_build.html / "_sources" / f"{docname}.ipynb"
        assert source.exists(), f"no downloadable {source.relative_to(book_build.html)}"
        json.loads(source.read_text())  # a valid notebook file
