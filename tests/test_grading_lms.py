"""Grades out to an LMS (tools/course/lms.py, tools/course/export.py): Canvas's and Moodle's
import files from a real nbgrader gradebook (SQLite, built with nbgrader's own API), compared
with samples written from their documentation (tests/data/lms/), and every bad input refused
with an error that names it, leaving nothing written. The same export through `nbgrader export`
on a graded course is in test_course.py."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from sqlalchemy.exc import SAWarning

from tools.course.export import _rows
from tools.course.lms import export_lms
from tools.course.nbgrader_course import gradebook_at, write_config

SAMPLES = Path(__file__).parent / "data" / "lms"
# notebook -> {exercise: max points}; student -> {exercise: points}; eve handed nothing in
NOTEBOOKS = {"02_logreg": {"nb02-ex1": 3, "nb02-ex2": 2}, "03_opt": {"nb03-ex1": 4}}
SCORES = {"ada": {"nb02-ex1": 3, "nb02-ex2": 1.5, "nb03-ex1": 4}, "bob": {"nb02-ex1": 0}}
ROSTER = [
    {
        "nbgrader_id": "ada",
        "Student": "Lovelace, Ada",
        "ID": "1201",
        "SIS User ID": "S0001",
        "SIS Login ID": "ada.lovelace",
        "Section": "Large-Scale ML 01",
        "Email address": "ada@example.edu",
        "First name": "Ada",
        "Last name": "Lovelace",
    },
    {
        "nbgrader_id": "bob",
        "Student": "Babbage, Charles",
        "ID": "1202",
        "SIS User ID": "S0002",
        "SIS Login ID": "charles.babbage",
        "Section": "Large-Scale ML 01",
        "Email address": "charles@example.edu",
        "First name": "Charles",
        "Last name": "Babbage",
    },
    {"nbgrader_id": "eve", "ID": "1203", "Email address": "eve@example.edu"},  # nothing in
    {"nbgrader_id": "zoe", "ID": "1204", "Email address": "zoe@example.edu"},  # not graded
]


def write_csv(path: Path, rows: list[dict]) -> Path:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course folder as grading leaves it: its nbgrader_config.py and a gradebook.db."""
    folder = tmp_path_factory.mktemp("course")
    write_config(folder, timeout=60)
    return folder


@pytest.fixture(scope="module")
def rows(course):
    """grades.csv's rows from a gradebook that nbgrader's API filled as autograding does."""
    db = course / "gradebook.db"
    with pytest.MonkeyPatch.context() as mp:
        # nbgrader creates the database with `alembic`, by name: this Python's bin/ on PATH
        mp.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
        gb = gradebook_at(db)  # closed below
        # nbgrader's add_submission trips SQLAlchemy's autoflush warning (its own autograde
        # does too): about nbgrader's session handling, not these grades
        mp.setattr(warnings, "filters", list(warnings.filters))  # restored afterwards
        warnings.simplefilter("ignore", SAWarning)
        for nb, cells in NOTEBOOKS.items():
            gb.add_assignment(nb)
            gb.add_notebook(nb, nb)
            for ex, top in cells.items():
                gb.add_grade_cell(f"{ex}-test", nb, nb, max_score=top, cell_type="code")
        for student, scores in SCORES.items():
            gb.add_student(student)
            for nb, cells in NOTEBOOKS.items():
                if not set(cells) & set(scores):
                    continue  # not handed in: no submission
                gb.add_submission(nb, student)
                for ex in cells:
                    grade = gb.find_grade(f"{ex}-test", nb, nb, student)
                    grade.auto_score = scores.get(ex, 0)
        gb.db.commit()
        gb.add_student("eve")

        class AllOfThem:  # what `nbgrader export` passes a plugin with no --student/--assignment
            student, assignment = [], []

        try:
            return _rows(AllOfThem, gb)
        finally:
            gb.close()


def test_canvas_export_has_the_documented_shape_and_each_notebook_s_points(rows, tmp_path):
    roster = write_csv(tmp_path / "roster.csv", ROSTER)
    columns = write_csv(
        tmp_path / "columns.csv",
        [
            {"notebook": "02_logreg", "column": "Lab 2: Logistic regression (4401)"},
            {"notebook": "03_opt", "column": "Lab 3: Optimizers (4402)"},
        ],
    )
    said = []
    dest = export_lms("canvas", rows, roster, tmp_path / "canvas.csv", columns, said.append)
    got, sample = read_rows(dest), read_rows(SAMPLES / "canvas_gradebook_sample.csv")
    assert got[0][:5] == sample[0][:5]  # Student, ID, SIS User ID, SIS Login ID, Section
    assert all(re.fullmatch(r".+ \(\d+\)", h) for h in got[0][5:] + sample[0][5:])
    assert got[1][:5] == sample[1][:5] and got[1][5:] == ["5", "4"]  # Points Possible
    by_id = {r[1]: r for r in got[2:]}
    assert by_id["1201"][5:] == ["4.5", "4"]  # ada: 3 + 1.5, and 4
    assert by_id["1202"][5:] == ["0", "0"]  # bob: 0 in 02, nothing handed in for 03
    assert by_id["1201"][0] == "Lovelace, Ada" and by_id["1201"][4] == "Large-Scale ML 01"
    assert by_id["1203"][5:] == ["0", "0"]  # eve: in the gradebook, nothing handed in
    assert "1204" not in by_id and "zoe" in said[-1]  # zoe: not in the gradebook, said so
    for r in got[2:] + sample[2:]:
        assert len(r) == len(got[0]) and all(float(v) >= 0 for v in r[5:])


def test_moodle_export_has_an_identifier_and_a_column_per_notebook(rows, tmp_path):
    roster = write_csv(tmp_path / "roster.csv", ROSTER)
    dest = export_lms("moodle", rows, roster, tmp_path / "moodle.csv", None, lambda _: None)
    got, sample = read_rows(dest), read_rows(SAMPLES / "moodle_grades_sample.csv")
    assert got[0][:3] == sample[0][:3]  # First name, Last name, Email address
    assert got[0][3:] == ["02_logreg", "03_opt"]
    mail = got[0].index("Email address")
    by_mail = {r[mail]: r[3:] for r in got[1:]}
    assert by_mail["ada@example.edu"] == ["4.5", "4"]
    assert by_mail["charles@example.edu"] == ["0", "0"] and len(got) == 4  # ada, bob, eve
    for r in got[1:] + sample[1:]:
        assert len(r) == len(got[0]) and all(float(v) >= 0 for v in r[3:])


def test_plain_csv_carries_the_roster_s_columns(rows, tmp_path):
    roster = write_csv(tmp_path / "roster.csv", ROSTER)
    got = read_rows(export_lms("csv", rows, roster, tmp_path / "o.csv", None, lambda _: None))
    assert got[0][0] == "nbgrader_id" and got[0][-2:] == ["02_logreg", "03_opt"]
    assert [r[0] for r in got[1:]] == ["ada", "bob", "eve"]


def refused(rows, tmp_path, fmt, roster, match, columns=None):
    """The export fails with an error matching `match`; an existing file at dest is untouched,
    and no temporary file is left beside it."""
    dest = tmp_path / "out" / "lms.csv"
    dest.parent.mkdir()
    dest.write_text("before\n")
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        export_lms(fmt, rows, roster, dest, columns, lambda _: None)
    assert dest.read_text() == "before\n" and list(dest.parent.iterdir()) == [dest]


def test_a_graded_student_missing_from_the_roster_is_named_and_nothing_written(rows, tmp_path):
    roster = write_csv(tmp_path / "roster.csv", [r for r in ROSTER if r["nbgrader_id"] != "eve"])
    refused(rows, tmp_path, "canvas", roster, r"1 graded student\(s\) missing .*: eve")


def test_bad_rosters_and_formats_are_refused_with_what_to_fix(rows, tmp_path):
    no_key = write_csv(
        tmp_path / "a.csv", [{k: v for k, v in r.items() if k != "nbgrader_id"} for r in ROSTER]
    )
    cases = [
        ("canvas", no_key, "no 'nbgrader_id' column .*Student"),
        ("canvas", tmp_path / "nowhere.csv", "nowhere.csv does not exist"),
        (
            "canvas",
            write_csv(tmp_path / "b.csv", [{"nbgrader_id": "ada", "Email address": "x"}]),
            "none of the columns canvas finds a student by",
        ),
        (
            "moodle",
            write_csv(tmp_path / "c.csv", [{"nbgrader_id": "ada", "ID": "1"}]),
            "none of the columns moodle finds a student by",
        ),
        (
            "canvas",
            write_csv(tmp_path / "d.csv", ROSTER + ROSTER[:1]),
            "line 6: nbgrader_id 'ada' appears twice",
        ),
        ("blackboard", write_csv(tmp_path / "e.csv", ROSTER), "unknown format 'blackboard'"),
    ]
    for i, (fmt, roster, match) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        refused(rows, tmp_path / str(i), fmt, roster, match)
    columns = write_csv(tmp_path / "cols.csv", [{"notebook": "09_nope", "column": "x (1)"}])
    (tmp_path / "cols").mkdir()
    refused(
        rows,
        tmp_path / "cols",
        "canvas",
        write_csv(tmp_path / "f.csv", ROSTER),
        "names the notebook '09_nope'",
        columns,
    )


def make_export(course, *args) -> subprocess.CompletedProcess:
    """`make grade-export` as an instructor runs it (-o: the venv is taken as installed)."""
    return subprocess.run(
        ["make", "-s", "-o", ".venv/.installed", "grade-export", f"COURSE={course}", *args],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_make_grade_export_writes_canvas_s_file_through_nbgrader_export(course, rows, tmp_path):
    roster = write_csv(tmp_path / "roster.csv", ROSTER)
    done = make_export(course, "FORMAT=canvas", f"ROSTER={roster}")
    assert done.returncode == 0, done.stderr[-2000:]
    got = read_rows(course / "canvas.csv")
    assert got[0][:5] == read_rows(SAMPLES / "canvas_gradebook_sample.csv")[0][:5]
    assert got[0][5:] == ["02_logreg", "03_opt"] and got[1][5:] == ["5", "4"]
    by_id = {r[1]: r[5:] for r in got[2:]}
    assert by_id["1201"] == ["4.5", "4"]
    assert by_id["1202"] == ["0", ""] and by_id["1203"] == ["", ""]  # bob: no 03; eve: nothing
    assert "zoe" in done.stderr  # nbgrader logs on stderr: who was left out


def test_make_grade_export_refuses_a_roster_missing_a_student_and_names_it(course, rows, tmp_path):
    roster = write_csv(tmp_path / "roster.csv", [r for r in ROSTER if r["nbgrader_id"] != "bob"])
    out = tmp_path / "moodle.csv"
    done = make_export(course, "FORMAT=moodle", f"ROSTER={roster}", f"OUT={out}")
    assert done.returncode != 0 and "missing from the roster: bob" in done.stderr, done.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [roster]
    done = make_export(course, "FORMAT=moodle")
    assert done.returncode == 2 and "make grade-export: name the roster" in done.stderr


def test_a_student_the_lms_cannot_find_is_named(rows, tmp_path):
    roster = [dict(r) for r in ROSTER]
    roster[1]["ID"] = roster[1]["SIS User ID"] = roster[1]["SIS Login ID"] = ""
    refused(rows, tmp_path, "canvas", write_csv(tmp_path / "r.csv", roster), "for bob: canvas")
