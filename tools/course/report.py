"""What grading tells: which cells failed and why, the points from the gradebook, grades.csv,
report.txt, and report.json (what became of each pair, which merging shards reads back)."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import nbformat

from helpers.files import atomic_path, write_json
from tools.course.lessons import cell_id, exercise_of
from tools.course.nbgrader_course import gradebook
from tools.course.tamper import FLAG_NOTE
from tools.notebooks import grade_id, read

REPORT_SCHEMA = 1  # the version of report.json's layout

Outcome = Literal["graded", "kept", "absent", "broken"]  # ran; unchanged; not handed in; invalid


@dataclass
class PairOutcome:
    """What became of one (student, notebook) in a grading run."""

    student: str
    notebook: str
    outcome: Outcome
    seconds: float = 0.0  # how long grading it took (0 when it did not run)
    notes: list[str] = field(default_factory=list)  # what the report says about it


def write_outcomes(course: Path, pairs: list[PairOutcome]) -> None:
    """course/report.json: every pair's outcome, all or nothing."""
    record = {"schema": REPORT_SCHEMA, "pairs": [asdict(p) for p in pairs]}
    write_json(course / "report.json", record, indent=0)


def read_outcomes(course: Path) -> list[PairOutcome]:
    """The pairs' outcomes that write_outcomes left in course/report.json."""
    path = course / "report.json"
    record = json.loads(path.read_text())
    schema = record.get("schema") if isinstance(record, dict) else None
    if schema != REPORT_SCHEMA:
        raise ValueError(
            f"{path} has report schema {schema}, this grader reads {REPORT_SCHEMA}: "
            f"grade that shard again with this version"
        )
    return [PairOutcome(**p) for p in record["pairs"]]


# How a cell's error reads in the report: an interrupted cell is one that ran past the timeout.
_ERROR_NAMES = {
    "KeyboardInterrupt": "ran past the timeout and was interrupted",
    "CellTimeoutError": "ran past the timeout and was interrupted",
}


def _heading(cells, index: int) -> str:
    """The nbgrader id of cell `index`, or the last '## ' heading above it."""
    if grade_id(cells[index]):
        return grade_id(cells[index])
    for cell in reversed(cells[:index]):
        if cell.cell_type == "markdown":
            found = [h.lstrip("#").strip() for h in cell.source.splitlines() if h.startswith("#")]
            if found:
                return f'"{found[-1]}"'
    return "the top of the notebook"


def _error(cell) -> dict | None:
    return next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)


def _describe(error: dict) -> str:
    name = error.get("ename", "error")
    if name in _ERROR_NAMES:
        return _ERROR_NAMES[name]
    value = " ".join(str(error.get("evalue", "")).split())
    return f"raised {name}: {value[:160]}" if value else f"raised {name}"


def cell_errors(autograded: Path, mark: bool = True) -> list[str]:
    """Which solution and test cells raised in an autograded notebook, and why.

    A cell that failed after a cell it may depend on had failed (a lesson cell, or the
    exercise's own solution; not another exercise's cells) names the first such failure: its
    heading or grade id and the last line of its error. With `mark`, the same sentence is added
    to the failing cell's outputs, so the student's feedback page says it too.
    """
    if not autograded.is_file():
        return []
    nb = read(autograded)
    failed = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and _error(c)]
    out = []
    for i in failed:
        gid = grade_id(nb.cells[i])
        if gid is None:
            continue
        own = cell_id(exercise_of(gid), "solution") if exercise_of(gid) else None
        causes = [j for j in failed if j < i and grade_id(nb.cells[j]) in (None, own)]
        name = _error(nb.cells[i]).get("ename", "error")
        line = f"{gid}: {_ERROR_NAMES.get(name, name)}"
        if causes:
            first = causes[0]
            cause = (
                f"after cell {first} {_heading(nb.cells, first)} "
                f"{_describe(_error(nb.cells[first]))}"
            )
            line += f", {cause}"
            if mark:
                nb.cells[i].outputs.append(
                    nbformat.v4.new_output(
                        "stream", name="stderr", text=f"This cell failed {cause}.\n"
                    )
                )
        out.append(line)
    if mark and out:
        nbformat.write(nb, str(autograded))
    return out


def gradebook_rows(course: Path, students: list[str], assignments: list[str]) -> list[dict]:
    """(student, notebook, exercise, points, max points) for every test cell, from the gradebook."""
    with gradebook(course) as gb:
        return exercise_rows(gb, students, assignments)


def exercise_rows(gb, students: list[str], assignments: list[str]) -> list[dict]:
    """gradebook_rows from an open nbgrader Gradebook (also what `nbgrader export` writes)."""
    from nbgrader.api import MissingEntry

    rows = []
    for student in students:
        for assignment in assignments:
            try:
                grades = gb.find_submission_notebook(assignment, assignment, student).grades
            except MissingEntry:
                grades = None
            if grades is None:  # never graded: every test cell scores 0
                cells = gb.find_notebook(assignment, assignment).grade_cells
                pairs = [(c.name, 0.0, c.max_score) for c in cells]
            else:
                pairs = [
                    (g.cell.name, g.score, g.max_score)
                    for g in grades
                    if g.cell.name.endswith("-test")
                ]
            for name, score, max_score in sorted(pairs):
                rows.append(
                    {
                        "student": student,
                        "notebook": assignment,
                        "exercise": name.removesuffix("-test"),
                        "points": float(score or 0),
                        "max_points": float(max_score),
                    }
                )
    return rows


def write_grades_csv(path: Path, rows: list[dict]) -> None:
    """grades.csv: one row per student and exercise, all or nothing."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as out:
        writer = csv.DictWriter(out, ["student", "notebook", "exercise", "points", "max_points"])
        writer.writeheader()
        writer.writerows(rows)


FLAGGED_COLUMNS = ["student", "notebook", "exercise", "cell", "line", "what", "scores_0"]


def write_flagged(path: Path, pairs: list[PairOutcome]) -> int:
    """flagged.csv: every solution cell the scan for tampering flagged (tools/course/tamper.py),
    one row per finding, for the instructor to look at; all or nothing. How many rows."""
    rows = []
    for p in pairs:
        for note in p.notes:
            m = FLAG_NOTE.match(note)
            if m:
                rows.append([p.student, p.notebook, *m.group("exercise", "cell", "line", "what")])
                rows[-1].append(m.group("zeroed"))
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(FLAGGED_COLUMNS)
        writer.writerows(rows)
    return len(rows)


def write_report(course: Path, rows: list[dict], pairs: list[PairOutcome], say=print) -> None:
    """Write grades.csv (rows), flagged.csv and report.txt (points, seconds and notes of each
    pair); say it."""
    write_grades_csv(course / "grades.csv", rows)
    flagged = write_flagged(course / "flagged.csv", pairs)
    lines = []
    for p in pairs:
        mine = [r for r in rows if r["student"] == p.student and r["notebook"] == p.notebook]
        got, top = sum(r["points"] for r in mine), sum(r["max_points"] for r in mine)
        lines.append(
            f"{p.student:16s} {p.notebook:34s} {got:5.1f} / {top:4.1f}  {p.seconds:6.1f} s"
        )
        lines += [f"{'':18s}- {note}" for note in p.notes]
    with atomic_path(course / "report.txt") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    for line in lines:
        say(line)
    say(f"grades: {course / 'grades.csv'}; feedback: {course / 'feedback'}/<student>/<notebook>/")
    if flagged:
        say(
            f"{flagged} solution cell(s) flagged for what could change a check: "
            f"{course / 'flagged.csv'}"
        )
