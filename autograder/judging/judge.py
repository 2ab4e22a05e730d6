"""Grade one submitted notebook: run the student's code in a sandbox, judge the results here.

The flow for one notebook:

1. read it defensively (:mod:`autograder.notebook`); a broken file scores 0 with a reason;
2. plan the cells: the student's answers, with read-only cells from the source and no test cells;
3. read what each part reaches against its vocabulary, the rule the exercise prints (:mod:`attnkit.vocabulary`,
   :mod:`autograder.judging.authorship`): a part that calls outside it earns nothing;
4. start a sandbox, run the planned cells one by one (a cell that hangs or kills the process
   is skipped on a fresh sandbox, so later answers still count);
5. run each check of the assignment's suite against the sandbox; a check that hangs or crashes
   the process fails with that reason and the next check gets a fresh sandbox.

A sandbox is banned for its whole life, from before the first student line, for the bans of the parts it
answers (:func:`autograder.in_sandbox.ban.ban_for_life`): there is one :class:`Session` per set of bans, so a
part whose bans differ (chapter 01's softmax bans torch's softmax, its attention does not) is answered by a
process of its own, in which the notebook's cells ran again.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from autograder.in_sandbox.torch_names import runtime_fragments
from autograder.isolation.sandbox import Limits, Sandbox, SandboxError
from autograder.judging import authorship
from autograder.judging.checks import Backend, CheckFailed, load_suite, reply_value, seed_for
from autograder.notebook import BadNotebook, Plan, SourceNotebook, plan_cells, read_notebook
from autograder.records.results import NotebookResult, TestResult

# Fresh sandboxes after a crash or time-out, per notebook (each costs ~0.1 s). Parts that stopped the process
# share these; a part that never did may go past them by one per part, so its points are not lost to another's crashes.
MAX_RESTARTS = 8
RETRY_TIMEOUT = 5.0  # seconds per call for a part that already timed out once


class SandboxBackend(Backend):
    """Forwards a check's requests to the student's process (a :class:`~autograder.in_sandbox.harness.Runner` there)."""

    def __init__(self, box: Sandbox, limits: Limits, call_timeout: float | None = None) -> None:
        self.box, self.limits = box, limits
        self.call_timeout = call_timeout or limits.call_timeout

    def ask(self, request: dict[str, Any]) -> Any:
        return reply_value(self.box.request(request, timeout=self.call_timeout))


class Session:
    """A sandbox banned for ``bans`` with the planned cells already run; restarted (skipping bad cells) when it
    dies. ``deadline``: the notebook's, shared by its sessions."""

    def __init__(self, plan: Plan, files: Path | None, hide: list[Path], limits: Limits, result: NotebookResult,
                 bans: tuple[str, ...] = (), deadline: float | None = None) -> None:
        self.plan, self.files, self.hide, self.limits, self.result = plan, files, hide, limits, result
        self.bans = bans
        self.skip: set[int] = set()
        self.cell_errors: list[str] = []
        self.box: Sandbox | None = None
        self.restarts = 0
        self.deadline = deadline if deadline is not None else time.monotonic() + limits.notebook_timeout

    def ready(self, extra: int = 0) -> Sandbox | None:
        """A live sandbox with every runnable cell executed, or None once the notebook's budget is spent.

        ``extra``: restarts allowed beyond ``MAX_RESTARTS``, so that a part whose code crashed every
        time cannot use up the restarts that the parts which never crashed need."""
        while self.box is None:
            if self.restarts > MAX_RESTARTS + extra or time.monotonic() >= self.deadline:
                return None
            self.restarts += 1
            box = Sandbox(files=self.files, limits=self.limits, hide=self.hide, bans=self.bans)
            box.deadline = self.deadline
            try:
                box.start()
            except SandboxError as e:
                box.close()
                self.result.log.append(f"the sandbox did not start: {e}")
                if e.kind == "timeout":
                    return None
                continue
            if not any(line.startswith("isolation: ") for line in self.result.log):  # once per notebook
                self.result.log.append("isolation: " + "; ".join(box.isolation))
            self.box = box
            for i, (label, code) in enumerate(self.plan.cells):
                if i in self.skip:
                    continue
                try:
                    reply = box.request({"op": "exec", "code": code, "label": f"<{label}>"}, timeout=self.limits.cell_timeout)
                except SandboxError as e:
                    self.skip.add(i)
                    self._note(f"{label} was stopped and skipped: {e}")
                    box.close()
                    self.box = None
                    break
                if not reply["ok"]:
                    error = f"{label} raised {str(reply.get('error', 'an error'))[:300]}"
                    self._note(error)
                    if error not in self.cell_errors:
                        self.cell_errors.append(error)
        return self.box

    def _note(self, text: str) -> None:
        if text not in self.result.log:
            self.result.log.append(text)

    def lost(self) -> None:
        if self.box is not None:
            for event in self.box.events:  # processes the sandbox ended from outside (see Sandbox.end_others)
                self._note(event)
            self.box.close()
        self.box = None


def grade_notebook(path: Path | None, source: SourceNotebook, assignment: str, *, files: Path | None = None,
                   hide: list[Path] | None = None, limits: Limits | None = None, secret: str = "") -> NotebookResult:
    """Grade the notebook at ``path`` (``None``: missing) against ``source``'s test cells."""
    limits = limits or Limits()
    suite = load_suite(assignment)
    result = NotebookResult(source.name)
    tests = source.tests()

    def fail_all(reason: str) -> NotebookResult:
        result.reason = reason
        result.tests = [TestResult(c.grade_id, suite.checks[c.grade_id].doc if c.grade_id in suite.checks else c.grade_id,
                                   0.0, c.points, reason) for c in tests]
        return result

    if path is None:
        return fail_all(f"no notebook named {source.name}.ipynb was submitted")
    try:
        nb = read_notebook(path)
    except BadNotebook as e:
        return fail_all(str(e))
    plan = plan_cells(source, nb, folder=path.parent)
    result.log += plan.notes
    result.answers = {part: code[:20000] for part, code in plan.answers.items()}
    if not plan.answers:
        return fail_all("the notebook has no answer cells: nothing to grade")

    parts = [c.grade_id for c in source.solutions()]
    student_code = [code for label, code in plan.cells if not label.startswith("setup cell")]  # cell by cell
    setup_code = [code for label, code in plan.cells if label.startswith("setup cell")]
    try:
        delegated = authorship.delegations(student_code, parts, getattr(suite, "forbidden", {}),
                                           provided=authorship.bound_names(setup_code), assignment=assignment,
                                           setup=setup_code)
    except authorship.ScanLimit as e:
        return fail_all(str(e))

    deadline = time.monotonic() + limits.notebook_timeout
    sessions: dict[tuple[str, ...], Session] = {}  # one banned process per set of bans (see the module's docstring)

    def session_for(check_parts: tuple[str, ...]) -> Session:
        bans = tuple(runtime_fragments(suite.bans(check_parts)))
        if bans not in sessions:
            sessions[bans] = Session(plan, files, hide or [], limits, result, bans, deadline)
        return sessions[bans]

    crashed_reasons: list[str] = []
    hung_parts: set[str] = set()
    stopped_parts: set[str] = set()  # parts whose code once stopped the process (crash, time-out, channel)
    try:
        for cell in tests:
            check = suite.checks.get(cell.grade_id)
            if check is None:
                raise KeyError(f"test cell {cell.grade_id!r} has no check in autograder/judging/checks/ch{assignment}.py")
            bad = [delegated[p] for p in check.parts if p in delegated]
            if bad:
                result.tests.append(TestResult(cell.grade_id, check.doc, 0.0, cell.points,
                                               f"earns no points: {bad[0]}; write it yourself (see the "
                                               "exercise's 'What your code may call')"))
                continue
            session = session_for(check.parts)
            box = session.ready(extra=0 if set(check.parts) & stopped_parts else len(parts))
            if box is None:
                reason = "the notebook used up its time limit" if time.monotonic() >= deadline else \
                    "the notebook's process could not be kept running"
                result.tests.append(TestResult(cell.grade_id, check.doc, 0.0, cell.points, reason))
                crashed_reasons.append(reason)
                continue
            # A part that already hung once gets a short leash, so one infinite loop costs one time-out.
            timeout = min(limits.call_timeout, RETRY_TIMEOUT) if set(check.parts) & hung_parts else None
            try:
                suite.run(cell.grade_id, SandboxBackend(box, limits, timeout), seed_for(secret, assignment, cell.grade_id))
                result.tests.append(TestResult(cell.grade_id, check.doc, cell.points, cell.points))
            except CheckFailed as e:
                message = str(e)
                if "nothing named" in message and session.cell_errors:
                    message += f". Your notebook had errors: {'; '.join(session.cell_errors)[:400]}"
                result.tests.append(TestResult(cell.grade_id, check.doc, 0.0, cell.points, message))
            except SandboxError as e:
                msg = {"timeout": "your code did not finish in time", "crash": "your code stopped the process",
                       "protocol": "your code broke the grader's channel"}[e.kind]
                result.tests.append(TestResult(cell.grade_id, check.doc, 0.0, cell.points, f"{msg}: {e}"))
                crashed_reasons.append(f"{cell.grade_id}: {e}")
                stopped_parts.update(check.parts)
                if e.kind == "timeout":
                    hung_parts.update(check.parts)
                session.lost()
            except Exception as e:  # noqa: BLE001 - a check that breaks on odd answers fails alone
                result.log.append(f"{cell.grade_id}: the check itself failed:\n{traceback.format_exc()}")
                result.tests.append(TestResult(cell.grade_id, check.doc, 0.0, cell.points,
                                               f"your answer could not be checked ({type(e).__name__}: {str(e)[:200]}); "
                                               "check the type, dtype and shape of what your code returns"))
    finally:
        for session in sessions.values():
            session.lost()
    skipped = [line for line in result.log if "was stopped and skipped" in line]
    if skipped or crashed_reasons:
        result.reason = "; ".join(skipped + crashed_reasons)[:500]
    return result
