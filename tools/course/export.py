"""The course's nbgrader export plugins. `nbgrader export` in a course folder writes, by
default, the same one-row-per-exercise table that grading writes (the course's
nbgrader_config.py selects ExerciseCsvExport); with `--exporter=tools.course.export.LmsExport`
it writes the file an LMS's gradebook import reads (tools/course/lms.py):

    nbgrader export --exporter=tools.course.export.LmsExport --LmsExport.lms_format=canvas \
        --LmsExport.roster=roster.csv [--LmsExport.columns=columns.csv] [--to canvas.csv]

(`make grade-export FORMAT=canvas ROSTER=roster.csv [COLUMNS_CSV=columns.csv]` runs it.)
nbgrader's own CsvExportPlugin writes one row per student and notebook, with no exercise; these
plugins keep nbgrader's command, options (--to, --student, --assignment) and gradebook, and
change only the rows.
"""

from __future__ import annotations

from pathlib import Path

from nbgrader.plugins import ExportPlugin
from traitlets import Enum, Unicode

from tools.course.lms import FORMATS, export_lms
from tools.course.report import exercise_rows, write_grades_csv


def _rows(plugin, gradebook) -> list[dict]:
    """Points per student and exercise, for the students and assignments asked (default all)."""
    students = [str(s) for s in plugin.student] or sorted(s.id for s in gradebook.students)
    assignments = [str(a) for a in plugin.assignment] or sorted(
        a.name for a in gradebook.assignments
    )
    return exercise_rows(gradebook, students, assignments)


def _handed_in(gradebook, rows: list[dict]) -> set[tuple[str, str]]:
    """The (student, notebook) pairs of `rows` with a submission in the gradebook."""
    from nbgrader.api import MissingEntry

    out = set()
    for student, notebook in {(r["student"], r["notebook"]) for r in rows}:
        try:
            gradebook.find_submission(notebook, student)
            out.add((student, notebook))
        except MissingEntry:
            pass
    return out


class ExerciseCsvExport(ExportPlugin):
    """Points per student and exercise, from the gradebook, into grades.csv (or --to)."""

    def export(self, gradebook) -> None:
        dest = Path(self.to or "grades.csv")
        self.log.info("Exporting points per exercise to %s", dest)
        write_grades_csv(dest, _rows(self, gradebook))


class LmsExport(ExportPlugin):
    """Points per student and notebook, from the gradebook, in an LMS's import format."""

    lms_format = Enum(list(FORMATS), "csv", help="canvas, moodle or csv").tag(config=True)
    roster = Unicode("", help="CSV: nbgrader_id and the LMS's id columns").tag(config=True)
    columns = Unicode("", help="optional CSV: notebook,column (its header)").tag(config=True)

    def export(self, gradebook) -> None:
        dest = Path(self.to or f"{self.lms_format}.csv")
        try:
            if not self.roster:
                raise ValueError("no roster: give --LmsExport.roster=roster.csv (ROSTER=...)")
            rows = _rows(self, gradebook)
            export_lms(
                self.lms_format,
                rows,
                self.roster,
                dest,
                columns_path=self.columns or None,
                say=self.log.info,
                submitted=_handed_in(gradebook, rows),
            )
        except (ValueError, FileNotFoundError) as exc:
            self.log.error("%s", exc)
            raise SystemExit(2) from None
