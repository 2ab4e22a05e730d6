"""Pages instructors open render no script from students, whatever the markdown's spelling.

A written answer and an added cell carry each spelling of a script link that markdown, entities and browsers
allow (``javascript&colon;``, ``javascript\\:``, a link definition inside a list item, numeric and named entities,
mixed case, control characters and whitespace inside the scheme, ``data:`` and ``vbscript:`` URLs, raw HTML,
SVG, TeX's ``\\href``). The notebook goes through the grader's own path (``clean_markdown`` into the autograded
notebook) and is rendered with formgrader's submission template as formgrader renders it (nbconvert's
``HTMLExporter``, the course's configuration, ``template_name = "formgrade"``, the handler's resources) and
with the feedback template; each page is then opened in Chromium (Debian's, driven by Playwright), every link
is clicked, and no anchor may carry a ``javascript:``/``data:``/``vbscript:`` target, no flag may be set, no
dialog may open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autograder import course
from autograder.records.written import clean_html, clean_markdown

CHROMIUM = Path(os.environ.get("ATTN_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
RUN = "window.__pwned=1;document.title='pwned'"  # what each payload would do if it ran
SPELLINGS = {
    "entity colon": f"[a](javascript&colon;{RUN})",
    "backslash colon": f"[b](javascript\\:{RUN})",
    "definition in a list item": f"- [c]\n\n  [c]: javascript:{RUN}",
    "definition in a nested list": f"1. one\n   - two\n\n     [d][]\n\n     [d]: javascript:{RUN}",
    "numeric entity": f"[e](javascript&#58;{RUN})",
    "hex entity in the scheme": f"[f](&#x6A;avascript:{RUN})",
    "mixed case": f"[g](JaVaScRiPt:{RUN})",
    "tab in the scheme": f"[h](<java\tscript:{RUN}>)",
    "newline entity in the scheme": f"[i](java&#10;script:{RUN})",
    "control character first": f"[j](\x01javascript:{RUN})",
    "angle brackets": f"[k](<javascript:{RUN}>)",
    "autolink": f"<javascript:{RUN}>",
    "data url": "[l](data:text/html;base64,PHNjcmlwdD5wYXJlbnQuX19wd25lZD0xPC9zY3JpcHQ+)",
    "vbscript": "[m](vbscript:msgbox(1))",
    "raw anchor": f'<a href="javascript:{RUN}">n</a>',
    "raw anchor with entities": f'<a href="jav&#x09;ascript&colon;{RUN}">o</a>',
    "raw svg link": f'<svg><a xlink:href="javascript:{RUN}"><text y="10">p</text></a></svg>',
    "image with a handler": f'<img src="x" onerror="{RUN}">',
    "markdown image": f"![q](javascript:{RUN})",
    "script": f"<script>{RUN}</script>",
    "tex href": f"$\\href{{javascript:{RUN}}}{{r}}$",
    "reference link, uppercase entity": f"[s][t]\n\n[t]: JAVASCRIPT&COLON;{RUN}",
}
BAD = ("javascript:", "vbscript:", "data:")
PAGE_HANDLERS = ["span onclick", "span onclick"]  # formgrader's own: the show/hide buttons of the student's name


def browser_scheme(href: str) -> str:
    """The scheme a browser reads from an attribute value as parsed (its entities already decoded, once, by
    :func:`anchors`): control characters and whitespace dropped, any case."""
    import re

    text = re.sub(r"[\x00-\x20\x7f-\xa0\\]+", "", href).lower()
    m = re.match(r"^([a-z][a-z0-9+.\-]*):", text)
    return m[1] + ":" if m else ""


def notebook_with(text: str) -> dict:
    """Exercise 01's release with ``text`` as the written answer and as an added markdown cell, both made inert
    the way the grader writes them into the autograded notebook."""
    import json

    nb = json.loads((course.RELEASE / "01_single_head" / "single_head.ipynb").read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "written_scale":
            cell["source"] = clean_markdown(text)
    nb["cells"].insert(1, {"cell_type": "markdown", "metadata": {}, "source": clean_markdown("My notes\n\n" + text)})
    return nb


def render(nb: dict, template: str) -> str:
    """``nb`` rendered as formgrader renders its submission page (``template="formgrade"``) or as the feedback
    page's template, with the course's configuration."""
    import nbformat
    from nbconvert.exporters import HTMLExporter

    config = course.nbgrader_config()
    config.HTMLExporter.template_name = template
    resources = {"assignment_id": "01_single_head", "notebook_id": "single_head", "submission_id": "x",
                 "index": 0, "total": 1, "base_url": "", "student": "mallory", "last_name": "", "first_name": "",
                 "notebook_path": "autograded/mallory/01_single_head/single_head.ipynb",
                 "nbgrader": {"notebook": "single_head", "score": 0.0, "max_score": 1.0, "late_penalty": 0.0,
                              "awaiting": 0.0}}
    html, _ = HTMLExporter(config=config).from_notebook_node(as_node(nb), resources=resources)
    return html


def as_node(nb: dict):
    import json

    import nbformat

    return nbformat.reads(json.dumps(nb), as_version=4)


def anchors(html: str, handlers: list[str] | None = None) -> list[str]:
    """Every URL attribute's value in ``html``, parsed as a browser parses it (entities decoded once); the names
    of event-handler attributes go to ``handlers``."""
    from html.parser import HTMLParser

    found: list[str] = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            for name, value in attrs:
                if name in ("href", "xlink:href", "src", "action", "formaction") and value is not None:
                    found.append(value)
                if name.startswith("on") and handlers is not None:
                    handlers.append(f"{tag} {name}")

    P().feed(html)
    return found


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_the_rendered_page_carries_no_script_link(spelling):
    """The HTML formgrader sends holds no URL a browser would read as javascript:, data: or vbscript:."""
    html = render(notebook_with(SPELLINGS[spelling]), "formgrade")
    handlers: list[str] = []
    bad = [h for h in anchors(html, handlers) if browser_scheme(h) in BAD]
    assert not bad, (spelling, bad)
    assert handlers == PAGE_HANDLERS, (spelling, handlers)  # nbgrader's own (its name toggle), no other
    assert "<script>window.__pwned" not in html


def test_clean_html_is_an_allow_list_of_schemes_not_of_spellings():
    """Any scheme but http, https and mailto is dropped, whatever its spelling, and ordinary links stay."""
    kept = clean_html('<a href="https://example.org/a">x</a> <a href="#top">y</a> <a href="mailto:a@b.c">z</a>')
    assert anchors(kept) == ["https://example.org/a", "#top", "mailto:a@b.c"]
    for href in ("javascript:x", "JAVASCRIPT:x", "java&#x09;script:x", "javascript&colon;x", "&#106;avascript:x",
                 " javascript:x", "vbscript:x", "data:text/html,x", "livescript:x", "file:///etc/passwd",
                 "JAVASCRIPT&COLON;x", "javascript&#x3A;x", "\x01javascript:x"):
        left = anchors(clean_html(f'<a href="{href}">x</a>'))
        assert [h for h in left if browser_scheme(h)] == [], (href, left)  # none left, or no scheme at all


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


SCRIPT_LINKS = """() => Array.from(document.querySelectorAll('[href], [src], [action], [formaction]'))
    .flatMap(e => Array.from(e.attributes).filter(a => /(^|:)(href|src|action|formaction)$/.test(a.name))
        .map(a => a.value))
    .filter(v => /^(javascript|vbscript|data):/.test(v.replace(/[\\u0000-\\u0020\\u007f-\\u00a0\\\\]+/g, '').toLowerCase()))"""


@pytest.mark.slow
@pytest.mark.parametrize("template", ["formgrade", "feedback"])
def test_no_script_runs_in_the_browser_for_any_spelling(template, browser, tmp_path):
    """Each page, opened in Chromium with the network refused: the course's MathJax typesets (a TeX \\href would
    make a link), every link is clicked, and no javascript:/data:/vbscript: target is on the page, no flag is
    set, no dialog opens."""
    text = "\n\n".join(f"{name}: {source}" for name, source in SPELLINGS.items())
    nb = notebook_with(text + "\n\nThe scores grow with $\\sqrt{d_k}$.")
    if template == "feedback":
        from autograder.records.plugins import share_mathjax, shared_mathjax

        page_html = render_feedback(nb, shared_mathjax())
        share_mathjax(tmp_path)  # the shared copy beside the page (as at the root of the LMS zip)
    else:
        page_html = render(nb, template)
    path = tmp_path / "page.html"
    path.write_text(page_html)
    context = browser.new_context()
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort())
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(path.as_uri())
    if (course.ROOT / "_vendor" / "mathjax" / "tex-svg.js").exists():
        page.wait_for_function("() => window.attnMathJaxTypeset === true", timeout=60000)
    page.wait_for_timeout(500)
    found = page.evaluate(SCRIPT_LINKS)
    for link in page.query_selector_all("a"):
        try:
            link.click(no_wait_after=True, timeout=2000, force=True)
        except Exception:  # noqa: BLE001 - an invisible or detached link: nothing to click
            pass
        if page.url != path.as_uri():
            page.goto(path.as_uri())
    page.wait_for_timeout(500)
    state = page.evaluate("() => ({pwned: window.__pwned === undefined ? null : window.__pwned, "
                          "title: document.title, shown: document.body.innerText})")
    context.close()
    assert found == [], (template, found)
    assert state["pwned"] is None and state["title"] != "pwned", (template, state["pwned"], state["title"])
    assert not dialogs, dialogs
    for name in SPELLINGS:  # each spelling's text is still shown, as text
        assert name in state["shown"], (template, name)


def render_feedback(nb: dict, mathjax: dict) -> str:
    """``nb`` through the feedback template (as ``nbgrader generate_feedback`` renders it, less the gradebook),
    loading MathJax as ``mathjax`` says (``plugins.shared_mathjax()``)."""
    import nbformat
    from nbconvert.exporters import HTMLExporter

    import nbgrader

    config = course.nbgrader_config()
    config.HTMLExporter.template_name = "feedback"
    config.HTMLExporter.extra_template_paths = [  # as nbgrader's GenerateFeedback sets it
        str(Path(nbgrader.__file__).parent / "server_extensions" / "formgrader" / "static" / "node_modules" /
            "bootstrap" / "dist" / "css")]
    resources = {"nbgrader": {"notebook": "single_head", "score": 0.0, "max_score": 1.0, "late_penalty": 0.0,
                              "awaiting": 0.0}, "attn_mathjax_shared": mathjax}
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta and meta.get("grade"):
            meta.setdefault("score", 0.0)
    html, _ = HTMLExporter(config=config).from_notebook_node(as_node(nb), resources=resources)
    return html
