"""grades.csv as an nbgrader export plugin: `nbgrader export` in a course folder writes the same
one-row-per-exercise table that grading writes (the course's nbgrader_config.py selects it).

nbgrader's own CsvExportPlugin writes one row per student and notebook, with no exercise; this
plugin keeps nbgrader's command, options (--to, --student, --assignment) and gradebook, and
changes only the rows.
"""

from __future__ import annotations

from pathlib import Path

from nbgrader.plugins import ExportPlugin

from tools.course.report import exercise_rows, write_grades_csv


class ExerciseCsvExport(ExportPlugin):
    """Points per student and exercise, from the gradebook, into grades.csv (or --to)."""

    def export(self, gradebook) -> None:
        students = [str(s) for s in self.student] or sorted(s.id for s in gradebook.students)
        assignments = [str(a) for a in self.assignment] or sorted(
            a.name for a in gradebook.assignments
        )
        dest = Path(self.to or "grades.csv")
        self.log.info("Exporting points per exercise to %s", dest)
        write_grades_csv(dest, exercise_rows(gradebook, students, assignments))
