"""Moving graded work between nbgrader course folders: one graded notebook from the folder it
was graded in into the course, and whole shards (graded elsewhere) into one course.

nbgrader has no command that merges gradebooks (its `export` writes a CSV, `db import` reads
only students and assignments), so this is ours: it copies a submission's rows through
nbgrader's own API (the submission, and each notebook's grades and comments), and the files
nbgrader keeps beside them (submitted/, autograded/, feedback/).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from sqlalchemy.exc import SAWarning

from tools.course.nbgrader_course import gradebook

PARTS = ("submitted", "autograded", "feedback")  # nbgrader's folders of a graded submission


def forget_submission(course: Path, assignment: str, student: str) -> None:
    """Remove a student's graded submission of one notebook from the gradebook, if any."""
    from nbgrader.api import MissingEntry

    with gradebook(course) as gb:
        try:
            gb.remove_submission(assignment, student)
        except MissingEntry:
            pass


def has_submission(course: Path, assignment: str, student: str) -> bool:
    """Whether the gradebook holds a graded submission of this notebook by this student."""
    from nbgrader.api import MissingEntry

    with gradebook(course) as gb:
        try:
            gb.find_submission_notebook(assignment, assignment, student)
        except MissingEntry:
            return False
    return True


def copy_submission(src: Path, dst: Path, assignment: str, student: str) -> None:
    """Copy the graded submission of (assignment, student) from course `src`'s gradebook into
    course `dst`'s, replacing any there: scores, comments, flags, timestamp."""
    forget_submission(dst, assignment, student)
    with gradebook(src) as a, gradebook(dst) as b, warnings.catch_warnings():
        # nbgrader's add_submission trips SQLAlchemy's autoflush warnings (its own autograde
        # prints the same): they are about nbgrader's session handling, not the copy
        warnings.simplefilter("ignore", category=SAWarning)
        sub = a.find_submission(assignment, student)
        b.update_or_create_student(student)
        b.add_submission(assignment, student, timestamp=sub.timestamp, extension=sub.extension)
        for nb in sub.notebooks:
            into = b.find_submission_notebook(nb.name, assignment, student)
            into.flagged, into.late_submission_penalty = nb.flagged, nb.late_submission_penalty
            for g in nb.grades:
                to = b.find_grade(g.name, nb.name, assignment, student)
                to.auto_score, to.manual_score = g.auto_score, g.manual_score
                to.extra_credit, to.needs_manual_grade = g.extra_credit, g.needs_manual_grade
            for c in nb.comments:
                to = b.find_comment(c.name, nb.name, assignment, student)
                to.auto_comment, to.manual_comment = c.auto_comment, c.manual_comment
        b.db.commit()


def replace_files(src: Path, dst: Path, assignment: str, student: str, parts=PARTS) -> None:
    """Make course `dst`'s folders of (student, assignment) those of course `src` (a part
    that `src` lacks goes in `dst` too)."""
    for part in parts:
        there = dst / part / student / assignment
        shutil.rmtree(there, ignore_errors=True)
        here = src / part / student / assignment
        if here.is_dir():
            shutil.copytree(here, there)
