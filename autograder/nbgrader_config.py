"""nbgrader configuration of the course (also used by ``python -m autograder``).

``../nbgrader_config.py`` loads this file, so nbgrader's own commands and
formgrader find it from the course root (``nbgrader formgrader``,
``nbgrader db student import roster.csv``, ``nbgrader zip_collect 01_single_head``,
``nbgrader generate_feedback``, ``nbgrader export --exporter ...``). The folders follow
the course layout: sources in ``solutions/assignments``, releases in
``exercises``; grading state (submissions, autograded copies, feedback and the
gradebook) lives under ``grading/``, which git ignores, where
``python -m autograder grade grading/submitted --assignment NN_topic`` writes it (with
``grading/grades-NN_topic.csv`` and the term's ``grading/grades-term.csv``).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The course's own plugins (this folder's package), whatever else is installed.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# nbgrader runs alembic as a subprocess (`nbgrader db ...` upgrades the gradebook with it): put this Python's
# scripts on PATH, so `.venv/bin/nbgrader db ...` works without activating the virtual environment.
from autograder.course import scripts_on_path  # noqa: E402

scripts_on_path()

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

c.CourseDirectory.root = str(ROOT)
c.CourseDirectory.course_id = "attention-course"
c.CourseDirectory.source_directory = "solutions/assignments"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.submitted_directory = "grading/submitted"
c.CourseDirectory.autograded_directory = "grading/autograded"
c.CourseDirectory.feedback_directory = "grading/feedback"
c.CourseDirectory.db_url = f"sqlite:///{ROOT / 'grading' / 'gradebook.db'}"
try:  # the grader's records: the instructor's alone (another user's command, say a --workdir of their own, goes on)
    (ROOT / "grading").mkdir(mode=0o700, exist_ok=True)
except OSError:
    pass
# nbgrader's exchange, where students' `nbgrader submit` puts their work, `nbgrader collect` fetches it and
# `nbgrader release_feedback` returns the feedback. Without JupyterHub, the course's own folder (no student
# reaches it: LMS-collected work goes back through `python -m autograder lms-feedback`). On a JupyterHub, the
# hub's shared exchange, the one every student's server is configured with (nbgrader's usual location):
#     c.Exchange.root = "/srv/nbgrader/exchange"
# The grader reads submission times from there too (when the exchange received each folder).
c.Exchange.root = str(ROOT / "grading" / "exchange")
if c.Exchange.root == str(ROOT / "grading" / "exchange"):
    try:
        (ROOT / "grading" / "exchange").mkdir(exist_ok=True)
    except OSError:
        pass
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*"]
# Feedback and formgrader pages render students' text: nbconvert's sanitiser on, and the course's feedback
# template (autograder/records/templates/feedback: "awaiting a hand grade", "unanswered", a strict HTML allow-list,
# MathJax from one shared copy for offline reading) in front of nbgrader's (formgrader keeps its own).
import nbgrader  # noqa: E402

c.HTMLExporter.sanitize_html = True
# The same exporter without nbconvert's second parse of every finished page (see the class).
c.GenerateFeedback.exporter_class = "autograder.records.plugins.FeedbackHTMLExporter"
# Formgrader's submission page is the course's too (autograder/records/templates/formgrade: nbgrader's, with the
# course's MathJax embedded, configured as the feedback page's: the shared templates/attn).
c.HTMLExporter.extra_template_basedirs = [
    str(ROOT / "autograder" / "records" / "templates"),
    str(Path(nbgrader.__file__).parent / "server_extensions" / "formgrader" / "templates")]
c.HTMLExporter.filters = {"clean_html": "autograder.records.written.clean_html",
                          "attn_mathjax_data": "autograder.records.plugins.mathjax_data"}
c.GenerateFeedback.preprocessors = ["autograder.records.plugins.FeedbackGrades",
                                    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor"]
c.ExecutePreprocessor.timeout = 120
# nbgrader's own doors agree with the grader (autograder/records/doors.py): its autograde (formgrader's button,
# `nbgrader autograde`) is refused, since it would run student code outside the sandbox, and names the command
# that grades; formgrader lists the gradebook's students only (a removed student stays removed) and shows work
# the grader graded as autograded. To run nbgrader's unsandboxed autograde anyway, set after this line:
#     c.Autograde.exporter_class = "nbconvert.exporters.NotebookExporter"
from autograder.records import doors  # noqa: E402

doors.install(c)
c.Execute.timeout = 120

# Late work: 10% of a notebook's score per day (or part of one) past the due date, at most 100%.
# Due dates: `nbgrader db assignment add 01_single_head --duedate "2026-10-02 23:59:00 UTC"`; an extension
# is granted in the gradebook (see autograder/README.md). `c.PercentPerDayLatePenalty.percent_per_day = 0`
# turns penalties off; nbgrader's own plugin is `nbgrader.plugins.LateSubmissionPlugin`.
c.AssignLatePenalties.plugin_class = "autograder.records.plugins.PercentPerDayLatePenalty"
c.PercentPerDayLatePenalty.percent_per_day = 10.0
c.PercentPerDayLatePenalty.max_percent = 100.0
c.PercentPerDayLatePenalty.grace_minutes = 0.0
# The submission's time is the collector's (the LMS download, nbgrader's exchange), never the student's own
# timestamp.txt alone; every doubt is flagged in the console and the CSV's time_review column. Policy
# (autograder/collector.py): "collector" (default: the collector's time; without one a sound timestamp.txt,
# flagged, else the time the grader first saw it), "latest" (the later of the two) or "timestamp".
c.SubmissionTime.policy = "collector"

# `nbgrader zip_collect NN_topic`: put the LMS's bulk download in downloaded/NN_topic/archive/. Files are
# filed under the roster's id of the student whose lms_user_id the file name carries (an id not in the
# roster is listed and skipped); the zip entry's time (read in zip_timezone) is the submission's time.
c.ZipCollectApp.collector_plugin = "autograder.records.plugins.LmsFileNameCollector"
c.ZipCollectApp.downloaded_directory = "grading/downloaded"
c.LmsFileNameCollector.lms = ["canvas", "moodle"]
# The LMS server's time zone: zip entries carry local times without a zone, and every late penalty is computed
# from them. Canvas and Moodle write them in the server's zone (for instance "America/Chicago").
c.LmsFileNameCollector.zip_timezone = "UTC"

# `nbgrader export --exporter autograder.records.plugins.CanvasExportPlugin --to canvas.csv`; map assignments to
# existing Canvas columns with c.CanvasExportPlugin.assignment_columns = {"01_single_head": "Attention 1 (4321)"}.
c.CanvasExportPlugin.section = ""
# `nbgrader export --to FILE` (nbgrader's plain CSV) through the course's exporter: it refuses late penalties that
# a hand grade has made stale (as the Canvas one does) and neutralises cells a spreadsheet would run as formulas.
c.ExportApp.plugin_class = "autograder.records.plugins.CheckedCsvExportPlugin"
