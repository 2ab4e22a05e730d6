"""The built book in a real browser: headless Debian Chromium, driven by Playwright, offline.

Every page of the book is opened from a localhost server. A page passes when it
logs no console error, requests nothing outside localhost (MathJax is local), every
image has loaded, all math is typeset without TeX errors, every internal link and
anchor resolves, notebook pages show their outputs and launch buttons, axe-core
(bundled by the PyPI package axe-playwright-python, nothing fetched) finds no serious
or critical accessibility violation, and a screenshot of it is saved to
_build/screenshots/ for a human to look at.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

pytest.register_assert_rewrite("book_fixtures")
from book_fixtures import (  # noqa: E402
    ROOT, SCREENSHOTS, chapter_docnames, executed_notebook, exercise_docnames, toc_docnames,
)

pytest_plugins = ["book_fixtures"]  # one session-wide build, shared with test_book.py

pytestmark = pytest.mark.slow

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
REPO = "/".join(CONFIG["repository"]["url"].rstrip("/").split("/")[-2:])  # owner/name
BRANCH = CONFIG["repository"]["branch"]
# axe-core rules run: WCAG 2.1 A and AA; a violation of impact "serious" or "critical" fails
AXE_OPTIONS = {"runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]},
               "resultTypes": ["violations"], "preload": False}
AXE_FAILS = {"serious", "critical"}
PAGES = toc_docnames()
NOTEBOOKS = set(chapter_docnames()) | set(exercise_docnames())
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def page(browser, book_url):
    """One browser tab; console errors, page errors, failed and external requests are recorded per visit."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.problems = []

    def external(route):
        tab.problems.append(f"request outside the book (it must work offline): {route.request.url}")
        route.abort()

    context.route(re.compile(r"^(?!" + re.escape(book_url) + r"|data:|blob:|about:).*"), external)
    tab.on("console", lambda msg: msg.type == "error" and tab.problems.append(f"console error: {msg.text}"))
    tab.on("pageerror", lambda exc: tab.problems.append(f"uncaught exception: {exc}"))
    tab.on("response", lambda r: r.status >= 400 and tab.problems.append(f"HTTP {r.status}: {r.url}"))
    tab.on("requestfailed", lambda r: tab.problems.append(f"request failed: {r.url} ({r.failure})"))
    yield tab
    context.close()


def _visit(tab, url: str) -> None:
    tab.problems.clear()
    tab.goto(url, wait_until="load", timeout=TIMEOUT_MS)
    # MathJax typesets asynchronously; wait until it has finished (or is not on the page).
    tab.wait_for_function("() => !window.MathJax || (MathJax.startup && MathJax.startup.promise)",
                          timeout=TIMEOUT_MS)
    tab.evaluate("() => window.MathJax ? MathJax.startup.promise : null")
    tab.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)


@cache
def _anchors(path: Path) -> frozenset[str]:
    return frozenset(re.findall(r'\b(?:id|name)="([^"]+)"', path.read_text(errors="replace")))


def _broken_links(hrefs: list[str], base: str, html_root: Path) -> list[str]:
    broken = []
    for href in sorted(set(hrefs)):
        if not href.startswith(base):
            continue  # external (launch buttons, repository, paper links) or javascript:/mailto:
        parts = urlsplit(href)
        rel = unquote(parts.path)[len(urlsplit(base).path):]
        target = html_root / rel
        if rel == "" or rel.endswith("/"):
            target = target / "index.html"
        if not target.is_file():
            broken.append(f"{href} -> missing {target.relative_to(html_root)}")
        elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _anchors(target):
            broken.append(f"{href} -> no anchor #{parts.fragment} in {target.relative_to(html_root)}")
    return broken


def _expected_outputs(docname: str) -> int:
    """Code cells of the executed notebook that have outputs the page should show."""
    nb = executed_notebook(docname)
    if nb is None:
        return -1  # never executed: test_book reports why
    hidden = {"remove-output", "remove-cell", "remove_output", "remove_cell"}
    return sum(1 for c in nb.cells if c.cell_type == "code" and c.outputs
               and not hidden & set(c.metadata.get("tags", [])))


@pytest.mark.parametrize("docname", PAGES)
def test_page(page, book_url, built_html, docname):
    """Open one page and check everything a reader relies on."""
    url = f"{book_url}{docname}.html"
    _visit(page, url)
    problems = list(page.problems)

    # Images: every <img> has loaded and has a size.
    page.evaluate("""async () => {
        for (const img of document.images) { img.loading = 'eager'; }
        await Promise.all(Array.from(document.images, img => img.complete ? null :
            new Promise(done => { img.onload = img.onerror = done; })));
    }""")
    images = page.evaluate("() => Array.from(document.images, i => [i.currentSrc || i.src, i.naturalWidth])")
    problems += [f"image not loaded: {src}" for src, width in images if width == 0]

    # Math: every math element was typeset by (the local) MathJax, without TeX errors.
    math = page.evaluate("""() => {
        const all = Array.from(document.querySelectorAll('.math'));
        return {total: all.length,
                untypeset: all.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 80)),
                errors: Array.from(document.querySelectorAll('mjx-merror'),
                                   e => e.getAttribute('data-mjx-error') || e.textContent).slice(0, 5),
                mathjax: !!window.MathJax};
    }""")
    if math["total"]:
        if not math["mathjax"]:
            problems.append("the page has math but MathJax did not load (is _vendor/mathjax there? run `make install`)")
        problems += [f"math not typeset: {t!r}" for t in math["untypeset"][:5]]
        problems += [f"TeX error: {e!r}" for e in math["errors"]]

    # Internal links and anchors resolve.
    hrefs = page.evaluate("() => Array.from(document.querySelectorAll('a[href]'), a => a.href)")
    problems += [f"broken link: {b}" for b in _broken_links(hrefs, book_url, built_html)]

    # Notebook pages: launch buttons (Colab, Binder) and the download of the .ipynb.
    if docname in NOTEBOOKS:
        path = f"{docname}.ipynb"
        expected = {
            "Colab": f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/{path}",
            "Binder": f"https://mybinder.org/v2/gh/{REPO}/{BRANCH}?urlpath=tree/{path}",
            "download": f"{book_url}_sources/{path}",
        }
        problems += [f"no {name} button linking {link}" for name, link in expected.items() if link not in hrefs]

    # Chapters show their executed outputs; exercise pages show none (they are not executed).
    outputs = page.evaluate("""() => Array.from(document.querySelectorAll('div.cell_output'),
                                 e => e.getBoundingClientRect().height)""")
    if docname in chapter_docnames():
        want = _expected_outputs(docname)
        if want < 0:
            problems.append("the chapter has no successful execution in the cache (a cell raised or "
                            "timed out: see test_book_builds_without_warnings)")
        elif len(outputs) != want:
            problems.append(f"{len(outputs)} code cell outputs shown, the executed notebook has {want}")
        if not any(h > 0 for h in outputs):
            problems.append("no visible code cell output")
    elif docname.startswith("exercises/") and outputs:
        problems.append(f"exercise page shows {len(outputs)} outputs: it must not be executed")

    problems += _accessibility(page)
    # axe accepts any alt, a file name too: a figure's alt must be the text the notebook gives it
    alts = page.evaluate("""() => Array.from(document.querySelectorAll('div.cell_output img'),
                              e => e.getAttribute('alt') || '')""")
    bad = [a for a in alts if len(a) < 20 or a.lower().endswith((".png", ".svg", ".jpg"))]
    if bad:
        problems.append(f"{len(bad)} figure(s) without a written alt text (mystnb.image.alt), e.g. {bad[0]!r}")

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{docname.replace('/', '__')}.png"), full_page=True)
    assert not problems, f"{url}:\n  " + "\n  ".join(problems)


def _accessibility(tab) -> list[str]:
    """axe-core's serious and critical violations on the open page, one line per element."""
    try:
        from axe_playwright_python.sync_playwright import Axe
    except ImportError:
        pytest.fail("axe-playwright-python is not installed: run `make install` (requirements.txt)")
    violations = Axe().run(tab, options=AXE_OPTIONS).response["violations"]
    found = []
    for v in violations:
        if v.get("impact") not in AXE_FAILS:
            continue
        targets = [", ".join(node["target"]) for node in v["nodes"]][:3]
        found.append(f"axe {v['impact']} {v['id']}: {v['help']} ({len(v['nodes'])} elements, "
                     f"e.g. {targets})")
    return found


def test_accessibility_check_can_fail(page, book_url):
    """The axe check reports a page with an unlabelled image and an empty link."""
    _visit(page, f"{book_url}book/intro.html")
    page.evaluate("""() => {
        const img = document.createElement('img'); img.src = 'data:,'; document.body.append(img);
        const a = document.createElement('a'); a.href = '#'; document.body.append(a);
    }""")
    assert any("image-alt" in p or "link-name" in p for p in _accessibility(page))


def test_search_finds_softmax(page, book_url):
    """The search page (Sphinx's client-side index) finds 'softmax' in chapter 01."""
    _visit(page, f"{book_url}search.html?q=softmax")
    page.wait_for_selector("#search-results ul.search li", timeout=TIMEOUT_MS)
    results = page.evaluate("""() => Array.from(document.querySelectorAll('#search-results ul.search li a'),
                                                a => a.getAttribute('href'))""")
    problems = list(page.problems)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "search_softmax.png"), full_page=True)
    assert any("01_single_head" in r for r in results), f"search for 'softmax' did not find chapter 01: {results}"
    assert not problems, "\n".join(problems)


def test_index_redirects_to_intro(page, book_url):
    """The site root opens the introduction."""
    page.goto(book_url, timeout=TIMEOUT_MS)
    page.wait_for_url("**/book/intro.html", timeout=TIMEOUT_MS)
    assert "Attention, step by step" in page.title()
