"""The similarity report ranks copied answers first and changes nothing it reads.

A small fabricated class answers exercise 01: alice writes an answer, bob copies it
with every name changed and the comments rewritten, carol and dave write their own,
and erin pastes attnkit's softmax. The report must rank alice and bob first, find
erin's paste among the matches with the course's code, and leave the submissions
(and any gradebook beside them) untouched.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("copydetect", reason="copydetect is in requirements.txt: run `make install`")

from autograder import course  # noqa: E402
from autograder.records import similarity  # noqa: E402
from autograder.cli import main  # noqa: E402

ASSIGNMENT = "01_single_head"

ALICE = '''
def softmax(x, dim=-1):
    # subtract the row maximum so exp cannot overflow
    biggest = x.amax(dim=dim, keepdim=True)
    biggest = torch.where(torch.isfinite(biggest), biggest, torch.zeros_like(biggest))
    expd = torch.exp(x - biggest)
    norm = expd.sum(dim=dim, keepdim=True)
    return expd / torch.where(norm > 0, norm, torch.ones_like(norm))
'''

ALICE_SDPA = '''
def scaled_dot_product_attention(query, key, value, mask=None):
    d_k = query.shape[-1]
    raw = query @ key.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        raw = raw.masked_fill(~mask, float("-inf"))
    attn = softmax(raw, dim=-1)
    return attn @ value, attn
'''

# bob: alice's answer, every identifier renamed, comments changed
BOB = '''
def softmax(t, dim=-1):
    # stability trick
    top = t.amax(dim=dim, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    ex = torch.exp(t - top)
    tot = ex.sum(dim=dim, keepdim=True)
    return ex / torch.where(tot > 0, tot, torch.ones_like(tot))
'''

BOB_SDPA = '''
def scaled_dot_product_attention(query, key, value, mask=None):
    width = query.shape[-1]
    s = query @ key.transpose(-2, -1) / math.sqrt(width)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = softmax(s, dim=-1)
    return w @ value, w
'''

CAROL = '''
def softmax(x, dim=-1):
    lse = torch.logsumexp(x, dim=dim, keepdim=True)
    out = torch.exp(x - lse)
    return torch.nan_to_num(out, nan=0.0)
'''

CAROL_SDPA = '''
def scaled_dot_product_attention(query, key, value, mask=None):
    scale = 1.0 / query.size(-1) ** 0.5
    logits = torch.einsum("...nd,...md->...nm", query, key) * scale
    if mask is not None:
        logits = torch.where(mask, logits, torch.full_like(logits, -math.inf))
    probs = softmax(logits)
    return torch.einsum("...nm,...mv->...nv", probs, value), probs
'''

DAVE = '''
def softmax(x, dim=-1):
    x = x.movedim(dim, -1)
    rows = []
    for row in x.reshape(-1, x.shape[-1]):
        finite = row[torch.isfinite(row)]
        if len(finite) == 0:
            rows.append(torch.zeros_like(row))
            continue
        e = (row - finite.max()).exp()
        rows.append(e / e.sum())
    return torch.stack(rows).reshape(x.shape).movedim(-1, dim)
'''

DAVE_SDPA = '''
def scaled_dot_product_attention(query, key, value, mask=None):
    scores = torch.matmul(query, key.mT) * query.shape[-1] ** -0.5
    if mask is not None:
        scores = scores + torch.zeros_like(scores).masked_fill(~mask, -math.inf)
    weights = softmax(scores, -1)
    return torch.matmul(weights, value), weights
'''


def _erin() -> str:
    """erin pastes attnkit's softmax whole (docstring and all)."""
    source = (course.ROOT / "solutions" / "attnkit" / "attention.py").read_text()
    start = source.index("def softmax(")
    return source[start:source.index("\ndef ", start + 1)]


def _submit(root: Path, student: str, answers: dict[str, str]) -> None:
    """Copy the released notebook and fill the solution cells named in ``answers``."""
    release = course.RELEASE / ASSIGNMENT
    for path in sorted(release.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if cell.metadata.get("nbgrader", {}).get("solution") and grade_id in answers:
                cell.source = answers[grade_id].strip()
        target = root / student / ASSIGNMENT / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)


@pytest.fixture(scope="module")
def class_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("submitted")
    sdpa = "scaled_dot_product_attention"
    _submit(root, "alice", {"softmax": ALICE, sdpa: ALICE_SDPA})
    _submit(root, "bob", {"softmax": BOB, sdpa: BOB_SDPA})
    _submit(root, "carol", {"softmax": CAROL, sdpa: CAROL_SDPA})
    _submit(root, "dave", {"softmax": DAVE, sdpa: DAVE_SDPA})
    _submit(root, "erin", {"softmax": _erin(), sdpa: DAVE_SDPA.replace("weights", "a")})
    (root / "gradebook.db").write_bytes(b"a gradebook the report must not touch")
    return root


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_copied_pair_ranks_first(class_folder, tmp_path):
    """alice and bob (renamed copy) are the most similar pair, clearly above any honest pair."""
    between, _ = similarity.run(class_folder, ASSIGNMENT, tmp_path / "report.html")
    assert between, "no pair of students compared"
    top = between[0]
    assert {top.left, top.right} == {"alice", "bob"}, [(p.left, p.right, p.score) for p in between]
    honest = [p.score for p in between if {p.left, p.right} != {"alice", "bob"}
              and "erin" not in (p.left, p.right)]
    assert top.score > 0.5 and all(s < top.score - 0.2 for s in honest), (top.score, honest)


def test_paste_from_the_course_is_found(class_folder, tmp_path):
    """erin's softmax, pasted from attnkit, is the best match with the course's code."""
    _, against = similarity.run(class_folder, ASSIGNMENT, tmp_path / "report.html")
    erin = [p for p in against if p.left == "erin"]
    assert erin and erin[0].right.endswith("attnkit_attention"), [(p.left, p.right, p.score) for p in against]
    assert erin[0].score >= max((p.score for p in against if p.left in {"carol", "dave"}), default=0)


def test_cli_writes_the_page_and_changes_nothing(class_folder, tmp_path, capsys):
    """`python -m autograder similarity` writes one HTML page; submissions and gradebook are unchanged."""
    before = _digest(class_folder)
    out = tmp_path / "similarity.html"
    assert main(["similarity", str(class_folder), "--assignment", ASSIGNMENT, "--out", str(out)]) == 0
    page = out.read_text()
    assert "changes no grade" in page and "alice" in page and "bob" in page
    assert page.index("alice") < page.index("carol"), "the copied pair must come first on the page"
    assert _digest(class_folder) == before, "the report modified the submissions folder"
    assert "wrote" in capsys.readouterr().out


def test_missing_folder_is_a_clear_error(tmp_path, capsys):
    """No submissions folder: exit status 2 and a message naming the expected layout."""
    code = main(["similarity", str(tmp_path / "nowhere"), "--assignment", ASSIGNMENT,
                 "--out", str(tmp_path / "x.html")])
    assert code == 2 and "nbgrader's layout" in capsys.readouterr().err


def test_a_copy_of_the_reference_solution_is_found(class_folder, tmp_path):
    """frank hands in the published reference solution verbatim: near 100% similar to it."""
    import json
    import shutil

    from checking import answered_release

    folder = tmp_path / "submitted"
    shutil.copytree(class_folder, folder, ignore=shutil.ignore_patterns("gradebook.db"))
    for path in sorted((course.RELEASE / ASSIGNMENT).glob("*.ipynb")):
        target = folder / "frank" / ASSIGNMENT / path.name
        target.parent.mkdir(parents=True)
        target.write_text(json.dumps(answered_release(ASSIGNMENT, path.name)))
    _, against = similarity.run(folder, ASSIGNMENT, tmp_path / "report.html")
    frank = [p for p in against if p.left == "frank"]
    assert frank and frank[0].right.startswith("course__solution_"), [(p.right, p.score) for p in frank]
    assert frank[0].score >= 0.95, frank[0].score
