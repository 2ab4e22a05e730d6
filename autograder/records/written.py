"""Answers graded by hand: which cells need a manual grade, and what the student wrote in them.

nbgrader marks a cell for manual grading when it is an answer cell with points
(``solution`` and ``grade``, markdown or code) or a task (``task``). The judge
never grades these; the batch carries the student's text for them, and the
cells the student added (helpers, notes), into the autograded notebook, where
formgrader shows them with a manual score and comment box.

Students' text is inert wherever the grader writes it: :func:`clean_markdown` escapes
every HTML tag and attribute outside a strict allow-list in a markdown cell (``<script>``,
``<img onerror>``, ``<iframe srcdoc>`` show as text) and disables ``javascript:`` and other
active link targets; :func:`clean_html` does the same to rendered HTML (the feedback
template's ``attn_clean`` filter).

Imports: :mod:`autograder.notebook` (reading a submission), :mod:`autograder.records.results`.
Third party: bleach (a dependency of nbconvert).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from autograder.notebook import canonical_text, cell_text, defined_names, nbgrader_meta, read_notebook
from autograder.records.results import StudentCells

MAX_ADDED_CELLS = 50  # added cells carried into the autograded notebook, per notebook
MAX_CELL_CHARS = 20000  # characters kept of each carried cell

# What a student's markdown may contain as HTML: text formatting only. No images, frames, forms, styles,
# scripts or event handlers; links only to http, https and mailto.
SAFE_TAGS = frozenset({"a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "div", "dl", "dt", "em",
                       "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "kbd", "li", "ol", "p", "pre", "s", "span",
                       "strong", "sub", "sup", "table", "tbody", "td", "th", "thead", "tr", "ul"})
SAFE_ATTRIBUTES = {"a": ["href", "title"], "abbr": ["title"], "td": ["align", "colspan", "rowspan"],
                   "th": ["align", "colspan", "rowspan"], "*": ["class", "id"]}
SAFE_PROTOCOLS = frozenset({"http", "https", "mailto"})
# A markdown link or reference definition whose target is not one of SAFE_PROTOCOLS (nor relative).
_LINK_TARGET = re.compile(r"(\]\(\s*<?|^\s{0,3}\[[^\]]*\]:\s*<?)([^\s)>]*)", re.MULTILINE)
_SCHEME = re.compile(r"^([a-z][a-z0-9+.\-]*):", re.IGNORECASE)


def _bleach(text: str) -> str:
    import bleach

    return bleach.clean(text, tags=SAFE_TAGS, attributes=SAFE_ATTRIBUTES, protocols=SAFE_PROTOCOLS,
                        strip=False, strip_comments=True)


def _safe_target(m: re.Match) -> str:
    target = re.sub(r"[\x00-\x20]|&#?\w+;?", "", m.group(2))  # what a browser would read as the scheme
    scheme = _SCHEME.match(target)
    if scheme and scheme.group(1).lower() not in SAFE_PROTOCOLS:
        return m.group(1) + "#unsafe-link-removed"
    return m.group(0)


def clean_markdown(text: str) -> str:
    """A student's markdown made inert: HTML outside :data:`SAFE_TAGS` is escaped (shown as text, so the
    grader sees what was written), and link targets with a scheme outside :data:`SAFE_PROTOCOLS`
    (``javascript:``, ``data:``, ...) are replaced."""
    return _LINK_TARGET.sub(_safe_target, _bleach(text))


def clean_html(html_text: str) -> str:
    """Rendered HTML restricted to :data:`SAFE_TAGS`, :data:`SAFE_ATTRIBUTES` and :data:`SAFE_PROTOCOLS`."""
    return _bleach(str(html_text))


def is_manual(cell: dict[str, Any]) -> bool:
    """True for a cell nbgrader grades by hand: an answer with points, or a task."""
    meta = nbgrader_meta(cell)
    return bool(meta.get("task") or (meta.get("solution") and meta.get("grade")))


def student_cells(path: Path | None, release: dict[str, Any]) -> StudentCells:
    """The student's answers to the manual cells of ``release`` and the cells they added.

    A student cell answers a manual cell when it carries that cell's ``grade_id``.
    A cell is the student's own when its ``grade_id`` (if any) is not one of the
    release's, its text is not a release cell's, and (for code) it does not define
    an auto-graded part (those are answers, carried by the judge's result).
    """
    out = StudentCells()
    if path is None:
        return out
    nb = read_notebook(path)  # size-capped; raises BadNotebook
    cells = [c for c in release.get("cells", []) if isinstance(c, dict)]
    ids = {nbgrader_meta(c).get("grade_id") for c in cells} - {None, ""}
    manual = {nbgrader_meta(c)["grade_id"] for c in cells if is_manual(c) and nbgrader_meta(c).get("grade_id")}
    parts = {nbgrader_meta(c).get("grade_id") for c in cells if nbgrader_meta(c).get("solution")} - manual
    texts = {canonical_text(cell_text(c.get("source"))) for c in cells}
    after = ""
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown"):
            continue
        gid = nbgrader_meta(cell).get("grade_id")
        gid = gid if isinstance(gid, str) else ""
        source = cell_text(cell.get("source"))[:MAX_CELL_CHARS]
        if gid in manual:
            out.written.setdefault(gid, source)
        if gid in ids:
            after = gid
            continue
        if not source.strip() or canonical_text(source) in texts:
            continue
        if cell["cell_type"] == "code" and defined_names(source) & parts:
            continue
        if len(out.added) < MAX_ADDED_CELLS:
            out.added.append((after, cell["cell_type"], source))
    released = {nbgrader_meta(c)["grade_id"]: canonical_text(cell_text(c.get("source"))) for c in cells
                if nbgrader_meta(c).get("grade_id") in manual | parts}
    answers = {g for g in manual if not any(nbgrader_meta(c).get("grade_id") == g and nbgrader_meta(c).get("task")
                                            for c in cells)}  # a task is answered elsewhere
    out.unanswered = sorted(g for g in answers if g not in out.written or canonical_text(out.written[g]) == released[g])
    # Parts the judge grades: the student's cell with the part's grade_id, else a code cell defining its name.
    code = [c for c in nb["cells"] if isinstance(c, dict) and c.get("cell_type") == "code"]
    for gid in sorted(parts):
        mine = [cell_text(c.get("source")) for c in code if nbgrader_meta(c).get("grade_id") == gid] or \
               [cell_text(c.get("source")) for c in code if gid in defined_names(cell_text(c.get("source")))]
        if not mine or all(canonical_text(m) == released[gid] for m in mine):
            out.unanswered.append(gid)
    out.unanswered.sort()
    out.answer_ids = sorted(answers | parts)
    return out
