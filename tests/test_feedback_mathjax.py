"""The feedback page's math, offline, wherever the page is opened, and the page's size.

A feedback page used to carry its own MathJax (tex-svg.js, gzip -9 then base64: 901,808 of a page's 1,089,961
bytes for chapter 01). It now loads one shared copy, ``attn-mathjax.js``, that the grader writes at the top of
the feedback folder (``grading/feedback/``, two folders up from each page) and at the root of the LMS zip; it
tries ``../../``, ``../`` and ``./``, then the same file on the npm CDN (run only if its bytes match the course's
copy: Subresource Integrity), and else shows its TeX as written, with a note saying why.

Each layout is opened in Chromium (Debian's, driven by Playwright) with the network refused: the grading
folder's page and both LMS layouts (Canvas's pages at the zip's root, Moodle's in participant folders) typeset
their math from the shared copy; a page fetched through nbgrader's exchange (``fetch_feedback`` copies the
``.html`` alone, into ``<assignment>/feedback/<time>/``) shows its TeX and the note offline, and typesets
from the CDN when the CDN answers with the course's bytes, never with other bytes; a student's own file named
``attn-mathjax.js`` in the page's folder is never run in the grading folder (the grader's copy is found first).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from autograder import course
from autograder.records import plugins
from autograder.records.feedback import lms_feedback

A = "01_single_head"
CHROMIUM = Path(os.environ.get("ATTN_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VENDORED = plugins.MATHJAX.is_file()
needs_mathjax = pytest.mark.skipif(not VENDORED, reason="no _vendor/mathjax (run `make install`)")
# A feedback page is nbconvert's classic page: ~123 KB of inlined CSS (bootstrap and nbconvert's style) and the
# notebook: 189,275 bytes for chapter 01, 254,374 for the largest (09, 53 KB as .ipynb). 350 KB leaves ~95 KB
# for answers, verdicts and comments, and is broken by any MathJax embedded again: the whole one was 901,808
# bytes; MathJax's start-up, core and TeX input alone, without output or fonts, are ~123 KB in base64'd gzip.
PAGE_BOUND = 350_000


def rendered(notebook: Path, feedback: Path) -> str:
    """A released notebook through the course's feedback template, as ``nbgrader generate_feedback`` renders
    it into the feedback folder ``feedback``: the resources are the course's preprocessor's
    (``plugins.FeedbackGrades``), less the gradebook (every grade 0), and the student's written answer has
    formulas."""
    from unittest import mock

    import nbformat
    import nbgrader
    from nbconvert.exporters import HTMLExporter
    from nbgrader.preprocessors import GetGrades

    config = course.nbgrader_config()
    config.CourseDirectory.feedback_directory = str(feedback)
    config.HTMLExporter.template_name = "feedback"
    config.HTMLExporter.extra_template_paths = [  # as nbgrader's GenerateFeedback sets it
        str(Path(nbgrader.__file__).parent / "server_extensions" / "formgrader" / "static" / "node_modules" /
            "bootstrap" / "dist" / "css")]
    nb = nbformat.read(str(notebook), as_version=4)
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta and meta.get("grade"):
            meta.setdefault("score", 0.0)
        if meta and meta.get("grade_id") == "written_scale":
            cell.source = "The scores grow like $\\sqrt{d_k}$, so $\\mathrm{softmax}(QK^\\top/\\sqrt{d_k})$ stays soft."
    resources = {"nbgrader": {"notebook": notebook.stem, "score": 0.0, "max_score": 1.0, "late_penalty": 0.0}}
    with mock.patch.object(GetGrades, "preprocess", lambda self, nb, resources: (nb, resources)):
        nb, resources = plugins.FeedbackGrades(config=config).preprocess(nb, resources)
    html, _ = HTMLExporter(config=config).from_notebook_node(nb, resources=resources)
    return html


@pytest.fixture(scope="module")
def page_html(tmp_path_factory) -> str:
    return rendered(course.RELEASE / A / "single_head.ipynb", tmp_path_factory.mktemp("feedback"))


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (it is in requirements.txt)")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium; or set ATTN_CHROMIUM)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def opened(browser, path: Path, cdn: bytes | None = None) -> dict:
    """``path`` opened from disk with the network refused (the CDN answering with ``cdn``, if given): which
    MathJax it loaded, how many formulas it typeset, whether its note shows, what it reads."""
    context = browser.new_context()
    requested: list[str] = []

    def route(r):
        url = r.request.url
        requested.append(url)
        if url.startswith("file:"):
            return r.continue_()
        if cdn is not None and url == plugins.shared_mathjax()["cdn"]:
            return r.fulfill(status=200, body=cdn, content_type="application/javascript",
                             headers={"Access-Control-Allow-Origin": "*"})
        return r.abort()

    context.route("**/*", route)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_function("() => window.attnMathJaxTypeset === true || window.attnMathJaxSource === 'none'",
                           timeout=60000)
    state = page.evaluate("""() => ({
        source: window.attnMathJaxSource, typeset: window.attnMathJaxTypeset,
        formulas: document.querySelectorAll('mjx-container svg').length,
        texErrors: document.querySelectorAll('mjx-merror, [data-mjx-error]').length,
        note: !document.getElementById('attn-mathjax-note').hidden,
        text: document.body.innerText, pwned: window.__pwned === undefined ? null : window.__pwned})""")
    context.close()
    state["requested"] = [u for u in requested if not u.startswith("file:")]
    state["errors"] = errors
    return state


def assert_typeset(state: dict, source: str) -> None:
    assert state["source"] == source, state["source"]
    assert state["typeset"] and not state["note"]
    assert state["formulas"] >= 10 and state["texErrors"] == 0, (state["formulas"], state["texErrors"])
    assert "$d_k = 64$" not in state["text"] and "\\sqrt{d_k}" not in state["text"]  # no raw TeX left
    assert "shown as TeX source" not in state["text"]


def test_the_page_embeds_no_mathjax_and_stays_small(page_html, tmp_path):
    """Every released notebook's feedback page is under PAGE_BOUND bytes and embeds no MathJax; chapter 01's
    was 1,089,961 bytes with it embedded."""
    assert 'type="application/octet-stream"' not in page_html and "DecompressionStream" not in page_html
    sizes = {nb.name: len(rendered(nb, tmp_path).encode()) for nb in sorted(course.RELEASE.glob("*/*.ipynb"))}
    print(sizes)
    assert sizes and max(sizes.values()) < PAGE_BOUND, sizes
    if VENDORED:
        assert "attn-mathjax.js" in page_html and plugins.shared_mathjax()["integrity"] in page_html


@needs_mathjax
def test_shared_copy_is_written_once_and_kept_in_step(tmp_path):
    dest = plugins.share_mathjax(tmp_path / "feedback")
    assert dest == tmp_path / "feedback" / "attn-mathjax.js"
    assert dest.read_bytes() == plugins.MATHJAX.read_bytes() and dest.stat().st_mode & 0o777 == 0o644
    dest.write_text("stale")  # an older MathJax, or a damaged copy, is replaced
    assert plugins.share_mathjax(tmp_path / "feedback") == dest and dest.read_bytes() == plugins.MATHJAX.read_bytes()
    link = tmp_path / "linked"
    link.mkdir()
    (link / "attn-mathjax.js").symlink_to(tmp_path / "elsewhere.js")
    assert plugins.share_mathjax(link) is None and not (tmp_path / "elsewhere.js").exists()  # never through a link


@needs_mathjax
@pytest.mark.slow
def test_grading_folder_page_typesets_offline(browser, page_html, tmp_path):
    """grading/feedback/<student>/<assignment>/page.html with the grader's copy two folders up; a student's
    file of that name beside the page is not run."""
    folder = tmp_path / "feedback" / "alice" / A
    folder.mkdir(parents=True)
    (folder / "single_head.html").write_text(page_html)
    plugins.share_mathjax(tmp_path / "feedback")
    (folder / "attn-mathjax.js").write_text("window.__pwned = 1;")
    state = opened(browser, folder / "single_head.html")
    assert_typeset(state, "../../attn-mathjax.js")
    assert state["pwned"] is None and state["requested"] == [] and not state["errors"], state


@needs_mathjax
@pytest.mark.slow
def test_unzipped_lms_zip_typesets_offline(browser, page_html, tmp_path):
    """The zip of ``python -m autograder lms-feedback`` holds one attn-mathjax.js at its root; unzipped, Canvas's
    pages (at the root) and Moodle's (in participant folders) typeset their math from it."""
    work = tmp_path / "grading"
    records = {"smithbob": {"source": "Canvas download", "files": ["smithbob_4343_99210_single_head.ipynb"]},
               "annlee": {"source": "Moodle download",
                          "files": ["Ann Lee_5151_assignsubmission_file_/single_head.ipynb"]}}
    for student, record in records.items():
        (work / "collected" / A).mkdir(parents=True, exist_ok=True)
        (work / "collected" / A / f"{student}.json").write_text(json.dumps(record))
        (work / "feedback" / student / A).mkdir(parents=True)
        (work / "feedback" / student / A / "single_head.html").write_text(page_html)
    zipped, missing = lms_feedback(work, A, tmp_path / "lms.zip")
    assert sorted(zipped) == ["annlee", "smithbob"] and not missing
    with zipfile.ZipFile(tmp_path / "lms.zip") as z:
        assert sorted(z.namelist()) == ["Ann Lee_5151_assignsubmission_file_/single_head.html", "attn-mathjax.js",
                                        "smithbob_4343_99210_single_head.html"]
        assert z.read("attn-mathjax.js") == plugins.MATHJAX.read_bytes()
        z.extractall(tmp_path / "unzipped")
    unzipped = tmp_path / "unzipped"
    canvas = opened(browser, unzipped / "smithbob_4343_99210_single_head.html")
    assert_typeset(canvas, "attn-mathjax.js")
    moodle = opened(browser, unzipped / "Ann Lee_5151_assignsubmission_file_" / "single_head.html")
    assert_typeset(moodle, "../attn-mathjax.js")
    assert canvas["requested"] == moodle["requested"] == []


def fetched(page_html: str, home: Path) -> Path:
    """The page as ``nbgrader fetch_feedback`` leaves it in a student's home: the .html alone."""
    folder = home / A / "feedback" / "2026-10-03 10:00:00.000000 UTC"
    folder.mkdir(parents=True)
    (folder / "single_head.html").write_text(page_html)
    return folder / "single_head.html"


@needs_mathjax
@pytest.mark.slow
def test_page_fetched_through_the_exchange_offline_shows_tex_and_says_why(browser, page_html, tmp_path):
    state = opened(browser, fetched(page_html, tmp_path))
    assert state["source"] == "none" and not state["typeset"] and state["formulas"] == 0
    assert state["note"] and "shown as TeX source" in state["text"] and "open the page while online" in state["text"]
    assert "$d_k = 64$" in state["text"] and "$\\sqrt{d_k}$" in state["text"]  # the TeX as written, readable
    assert "Score:" in state["text"] and "Question 3.1." in state["text"]  # the rest of the page is whole
    assert state["requested"] == [plugins.shared_mathjax()["cdn"]], state["requested"]
    assert not state["errors"], state["errors"]


@needs_mathjax
@pytest.mark.slow
def test_page_fetched_through_the_exchange_online_runs_only_the_courses_mathjax(browser, page_html, tmp_path):
    path = fetched(page_html, tmp_path)
    assert_typeset(opened(browser, path, cdn=plugins.MATHJAX.read_bytes()), plugins.shared_mathjax()["cdn"])
    tampered = opened(browser, path, cdn=plugins.MATHJAX.read_bytes() + b"\nwindow.__pwned = 1;")
    assert tampered["pwned"] is None and tampered["source"] == "none" and tampered["note"]


@needs_mathjax
def test_the_preprocessor_writes_the_shared_copy_at_the_top_of_the_feedback_folder(page_html, tmp_path):
    """Whichever door renders the pages (``grade``, ``feedback``, ``nbgrader generate_feedback``), the course's
    preprocessor leaves the shared copy where the pages look for it, readable (0644) under umask 077."""
    old = os.umask(0o077)
    try:
        rendered(course.RELEASE / A / "single_head.ipynb", tmp_path / "feedback")
    finally:
        os.umask(old)
    copy = tmp_path / "feedback" / "attn-mathjax.js"
    assert copy.read_bytes() == plugins.MATHJAX.read_bytes() and copy.stat().st_mode & 0o777 == 0o644


def test_without_vendored_mathjax_the_page_keeps_nbconverts_default(monkeypatch, tmp_path):
    """No _vendor/mathjax (no `make install`): nbconvert's own MathJax tag, no note, no shared copy."""
    monkeypatch.setattr(plugins, "MATHJAX", tmp_path / "missing" / "tex-svg.js")
    plugins.shared_mathjax.cache_clear()
    try:
        html = rendered(course.RELEASE / A / "single_head.ipynb", tmp_path / "feedback")
    finally:
        plugins.shared_mathjax.cache_clear()
    assert "attn-mathjax-note" not in html and "attn-mathjax.js" not in html and "cdnjs.cloudflare.com" in html
    assert not (tmp_path / "feedback").exists()
