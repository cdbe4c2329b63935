"""The nbgrader course, with the real nbgrader and its SQLite gradebook, on a small course.

The course is made from the lessons' own cells: notebook 01's set-up and Exercise 2 (count the
vocabulary), notebook 06's Exercise 2 (the true stability boundary) and notebook 07's
Exercise 2 (Young's interval), with their real solutions, visible and hidden tests.
Students are folders the test writes; the points are read back from the gradebook.
"""

from __future__ import annotations

import csv
import difflib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import zipfile

import nbformat
import psutil
import pytest
from nbformat.corpus.words import generate_corpus_id

from helpers.config import REPO_ROOT as ROOT
from tools.course import grade, lessons, nbgrader_course, release, sandbox
from tools.course.collect import collect
from tools.notebooks import NOTEBOOK_DIR, grade_id, notebook_paths, read

# runs nbgrader release and autograde on real notebooks: `make unit` leaves it out
pytestmark = pytest.mark.slow

DOC2VEC, BOUNDS = "01_doc2vec_exercises", "02_convergence_exercises"
MINI = {
    DOC2VEC: [
        (
            "01_doc2vec_dbpedia",
            [
                "from helpers.data import dbpedia",
                "MIN_COUNT = 2",
                "train_corpus = dbpedia.DbpediaCorpus(",
                "models[name] = doc2vec.train_doc2vec(",
            ],
            "nb01-ex2",
        )
    ],
    BOUNDS: [
        (
            "06_stragglers_and_backup_workers",
            ["from helpers.cluster import LocalCluster", "def spectral_radius("],
            "nb06-ex2",
        ),
        ("07_fault_tolerance", [], "nb07-ex2"),
    ],
}
FULL = {"nb01-ex2": 2.0, "nb06-ex2": 2.0, "nb07-ex2": 2.0}

BISECTION = textwrap.dedent("""\
    lo, hi = 0.0, 2.0
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        if spectral_radius(2.0, 0.5, [mid]) < 1:
            lo = mid
        else:
            hi = mid
    beta_max = lo
""")
# Passes notebook 07's visible checker (its three cases are looked up), not the hidden tests.
GAMED = textwrap.dedent("""\
    def young_interval(c_seconds, mtbf_seconds):
        seen = {(2, 86400): 587.877538, (30, 3600): 464.758002, (0.5, 600): 24.494897}
        return seen.get((c_seconds, mtbf_seconds), 1.0)
""")
ANSWER_YOUNG = textwrap.dedent("""\
    def young_interval(c_seconds, mtbf_seconds):
        return (2 * c_seconds * mtbf_seconds) ** 0.5
""")
# Starts a TensorFlow server process that leaves the kernel's process group, then dies. The
# server's command line carries a mark, by which the test looks for it afterwards.
CRASH_MARK = "crash-server-of-cora"
CRASH = textwrap.dedent(f"""\
    import os, subprocess, sys, time
    server = subprocess.Popen(
        [sys.executable, "-c", "import tensorflow as tf; tf.distribute.Server("
         "tf.train.ClusterSpec({{'ps': ['localhost:0']}}), 'ps', 0, start=True).join()",
         "{CRASH_MARK}"], start_new_session=True)
    time.sleep(3)
    os._exit(1)
""")


def mini_course(dest):
    """Write the two small lessons into `dest` and return it."""
    dest.mkdir()
    for name, parts in MINI.items():
        nb = nbformat.v4.new_notebook(
            metadata=read(NOTEBOOK_DIR / "01_doc2vec_dbpedia.ipynb").metadata
        )
        nb.cells.append(nbformat.v4.new_markdown_cell(f"# {name}"))
        for lesson, setup, exercise in parts:
            cells = read(NOTEBOOK_DIR / f"{lesson}.ipynb").cells
            for marker in setup:
                [cell] = [c for c in cells if c.cell_type == "code" and marker in c.source]
                nb.cells.append(cell)
            nb.cells += [c for c in cells if lessons.exercise_of(grade_id(c)) == exercise]
        for cell in nb.cells:  # cells from nbformat 4.4 lessons have no id; 4.5 wants one
            cell.setdefault("id", generate_corpus_id())
        nbformat.write(nb, str(dest / f"{name}.ipynb"))
    return dest


def answer(nb, exercise, source):
    """Put `source` into the solution cell of `exercise`."""
    nbgrader_course.nbgrader_cells(nb)[f"{exercise}-solution"].source = source
    return nb


def hand_in(folder, student, name, nb):
    path = folder / student / f"{name}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def points(rows):
    """{(student, exercise): points} of grades.csv rows."""
    return {(r["student"], r["exercise"]): float(r["points"]) for r in rows}


def grading_processes():
    """Processes that any grading run of this test session started and that are still alive
    (with pytest-xdist, another worker's gradings are not this one's: a grading's processes
    inherit the worker's PYTEST_XDIST_WORKER)."""
    left = []
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if "LABS_GRADING_TOKEN" in env and env.get("PYTEST_XDIST_WORKER") == worker:
                left.append(p)
        except (psutil.Error, OSError):
            continue
    return left


@pytest.fixture(scope="module")
def graded(tmp_path_factory, request):
    """Release the small course, hand in five students' work, grade it once, two at once."""
    request.getfixturevalue("shared_data")
    tmp = tmp_path_factory.mktemp("course")
    src, where = mini_course(tmp / "lessons"), tmp / "course"
    release.release(os.path.relpath(where), src, timeout=60)  # as `make release` passes it
    ref = {n: read(src / f"{n}.ipynb") for n in MINI}
    rel = {n: read(where / "release" / n / f"{n}.ipynb") for n in MINI}
    subs = tmp / "submissions"
    for name in MINI:  # ada: the reference solutions
        hand_in(subs, "ada", name, ref[name])
    hand_in(subs, "bob", DOC2VEC, rel[DOC2VEC])  # bob: the release untouched ...
    bob = answer(
        answer(read(where / "release" / BOUNDS / f"{BOUNDS}.ipynb"), "nb06-ex2", BISECTION),
        "nb07-ex2",
        GAMED,
    )  # ... but one right, one gamed
    hand_in(subs, "bob", BOUNDS, bob)
    # cora: a notebook that is not JSON, and one that starts a TF server and kills its kernel
    (subs / "cora").mkdir()
    (subs / "cora" / f"{DOC2VEC}.ipynb").write_text('{"cells": [')
    crash = answer(
        answer(nbformat.from_dict(rel[BOUNDS]), "nb06-ex2", BISECTION), "nb07-ex2", CRASH
    )
    hand_in(subs, "cora", BOUNDS, crash)
    # dan: deleted the test cell of Exercise 2 (06), and handed in only that notebook
    dan = nbformat.from_dict(ref[BOUNDS])
    dan.cells = [c for c in dan.cells if grade_id(c) != "nb06-ex2-test"]
    hand_in(subs, "dan", BOUNDS, dan)
    # eve: renamed her notebook, in nbgrader's own submitted/<student>/<assignment>/ layout
    hand_in(subs / "eve", DOC2VEC, f"{DOC2VEC} (1)", ref[DOC2VEC])
    lines = []
    rows = grade.grade(subs, where, quick=True, timeout=60, src=src, say=lines.append, jobs=2)
    return {
        "course": where,
        "rows": rows,
        "report": "\n".join(lines),
        "src": src,
        "subs": subs,
        "ref": ref,
        "outcome": outcome(where),
    }


def gradebook_dump(course):
    """Every graded submission in the course's gradebook, as sorted plain data (no times)."""
    out = []
    with nbgrader_course.gradebook(course) as gb:
        for assignment in gb.assignments:
            for sub in assignment.submissions:
                for nb in sub.notebooks:
                    out.append(
                        (
                            sub.student.id,
                            assignment.name,
                            nb.name,
                            nb.flagged,
                            sorted(
                                (
                                    g.name,
                                    g.auto_score,
                                    g.manual_score,
                                    g.extra_credit,
                                    g.needs_manual_grade,
                                )
                                for g in nb.grades
                            ),
                            sorted((c.name, c.auto_comment, c.manual_comment) for c in nb.comments),
                        )
                    )
    return sorted(out)


# What differs between any two runs of the same notebook: widget ids (random) and the
# seconds a lesson measured and printed ("trained in 2 s").
RUN_TO_RUN = re.compile(
    rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    rb"|\b[0-9a-f]{32}\b|\b\d+(\.\d+)? s\b"
)
# and where the kernel cut a cell's printed text into stream messages (timing: CI once saw
# "Exercise 2 passed.\n" arrive as two), which the feedback renders as adjacent stdout blocks
STREAM_CUT = re.compile(
    rb"</pre>\s*</div>\s*</div>\s*<div class=\"output_area\">\s*"
    rb"<div class=\"prompt\"></div>\s*<div class=\"output_subarea "
    rb"output_stream output_stdout output_text\">\s*<pre>"
)


def outcome(course):
    """What a grading leaves that people read: grades.csv, the report without its timings,
    every feedback file (but for what differs from run to run), and the gradebook."""
    report = [
        re.sub(r"\s+[\d.]+ s$", "", line)
        for line in (course / "report.txt").read_text().splitlines()
    ]
    feedback = {
        str(p.relative_to(course / "feedback")): RUN_TO_RUN.sub(
            b"~", STREAM_CUT.sub(b"", p.read_bytes())
        )
        for p in sorted((course / "feedback").rglob("*"))
        if p.is_file()
    }
    return {
        "grades.csv": (course / "grades.csv").read_text(),
        "report": report,
        "feedback": feedback,
        "gradebook": gradebook_dump(course),
    }


def of_students(out: dict, students: list[str]) -> dict:
    """outcome() with only these students: their rows of grades.csv, their pairs' lines of the
    report (a pair's line and its notes), their feedback files and gradebook entries."""
    header, *rows = out["grades.csv"].splitlines(keepends=True)
    report, keep = [], False
    for line in out["report"]:
        if not line.startswith(" "):  # a pair's line: "<student> <notebook> points"
            keep = line.split()[0] in students
        if keep:
            report.append(line)
    return {
        "grades.csv": header + "".join(r for r in rows if r.split(",")[0] in students),
        "report": report,
        "feedback": {k: v for k, v in out["feedback"].items() if k.split("/")[0] in students},
        "gradebook": [e for e in out["gradebook"] if e[0] in students],
    }


def same_feedback(got: dict, want: dict) -> None:
    """Assert two gradings left the same feedback; on a difference, show where."""
    assert sorted(got) == sorted(want)
    for name in sorted(got):
        if got[name] != want[name]:
            diff = difflib.unified_diff(
                want[name].decode(errors="replace").splitlines(),
                got[name].decode(errors="replace").splitlines(),
                "first grading",
                "this grading",
                n=1,
                lineterm="",
            )
            raise AssertionError(f"feedback {name} differs:\n" + "\n".join(list(diff)[:60]))


# The students the sharded grading grades: between them every way a pair ends that merging
# handles (graded, not handed in, not a notebook, a kernel that died), a renamed notebook, and
# both lessons; ada's and bob's pairs end as graded, as dan's and eve's do.
SHARDED = ["cora", "dan", "eve"]


def test_two_shards_each_one_at_a_time_merged_equal_grading_two_at_once(graded, tmp_path):
    """Two shards, graded as separate processes at the same time, each one notebook at a
    time, then merged: for the students they grade, the same grades, report, gradebook and
    feedback as the fixture's grading, which graded everything in one process, two notebooks
    at once."""
    where = tmp_path / "course"
    cmd = [
        sys.executable,
        "-m",
        "tools.course",
        "grade",
        str(graded["subs"]),
        "--course",
        str(where),
        "--lessons",
        str(graded["src"]),
        "--timeout",
        "60",
        "--jobs",
        "1",
        "--students",
        ",".join(SHARDED),
    ]
    # as a Slurm array task and a Kubernetes Indexed Job pod would run them: SHARD=2 names
    # the number of shards, the index comes from the scheduler's variable
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "JOB_COMPLETION_INDEX")
    }
    shards = [
        subprocess.Popen(
            cmd + ["--shard", "2"],
            env=dict(env, SLURM_ARRAY_TASK_ID="0"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            cmd + ["--shard", "2"],
            env=dict(env, JOB_COMPLETION_INDEX="1"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ),
    ]
    outs = [p.communicate(timeout=900)[0].decode(errors="replace") for p in shards]
    assert [p.returncode for p in shards] == [0, 0], outs
    assert sorted(p.name for p in (where / "shards").iterdir()) == ["0-of-2", "1-of-2"]
    merged = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.course",
            "merge",
            "--course",
            str(where),
            "--lessons",
            str(graded["src"]),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "merged 2 shard(s): 0-of-2, 1-of-2" in merged.stdout
    assert not (where / "shards" / "0-of-2").exists()
    got, want = outcome(where), of_students(graded["outcome"], SHARDED)
    assert {e[0] for e in got["gradebook"]} == set(SHARDED)
    assert got == of_students(got, SHARDED)  # no other student's grade came into the course
    for key in ("grades.csv", "report", "gradebook"):
        assert got[key] == want[key], key
    same_feedback(got["feedback"], want["feedback"])
    assert grading_processes() == []


def test_releasing_again_an_unchanged_lesson_runs_nothing(graded):
    logs = {p: p.stat().st_mtime_ns for p in (graded["course"] / "logs").glob("release-*")}
    assert len(logs) == len(MINI)
    release.release(graded["course"], graded["src"], timeout=60)
    assert {p: p.stat().st_mtime_ns for p in logs} == logs  # nbgrader was not run again


def test_the_release_has_no_solution_no_hidden_test_and_no_output(graded):
    for name in MINI:
        released = read(graded["course"] / "release" / name / f"{name}.ipynb")
        text = "\n".join(c.source for c in released.cells)
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
        assert "spectral_radius(2.0, 0.5, [mid])" not in text  # the reference bisection
        assert text.count("raise NotImplementedError()") >= (2 if name == BOUNDS else 1)
        assert all(c.outputs == [] for c in released.cells if c.cell_type == "code")
        cells = nbgrader_course.nbgrader_cells(released)
        assert {
            g: c.metadata["nbgrader"].get("points")
            for g, c in cells.items()
            if c.metadata["nbgrader"].get("grade")
        } == {g + "-test": lessons.POINTS[g + "-test"] for g in FULL if g + "-test" in cells}


def test_reference_solutions_get_full_points(graded):
    got = points(graded["rows"])
    assert {e: got["ada", e] for e in FULL} == FULL


def test_release_untouched_and_a_gamed_answer_get_exactly_what_they_earned(graded):
    got = points(graded["rows"])
    assert got["bob", "nb01-ex2"] == 0.0  # NotImplementedError
    assert got["bob", "nb06-ex2"] == 2.0  # answered
    assert got["bob", "nb07-ex2"] == 0.0  # passes the visible checker, fails the hidden test
    visible = nbgrader_course.nbgrader_cells(
        read(graded["course"] / "release" / BOUNDS / f"{BOUNDS}.ipynb")
    )["nb07-ex2-test"].source
    namespace = {}
    exec(GAMED + visible, namespace)  # the visible checker alone is fooled
    assert "nb07-ex2-test: AssertionError" in graded["report"]
    # bob left Exercise 2 of notebook 01 unanswered: its test fails after its solution did, and
    # both the report and bob's feedback page say so
    cause = "after cell 6 nb01-ex2-solution raised NotImplementedError"
    assert f"nb01-ex2-test: NameError, {cause}" in graded["report"], graded["report"]
    html = (graded["course"] / "feedback" / "bob" / DOC2VEC / f"{DOC2VEC}.html").read_text()
    assert f"This cell failed {cause}" in html


def test_invalid_json_costs_only_that_notebook_and_a_dead_kernel_leaves_no_process(graded):
    got = points(graded["rows"])
    assert got["cora", "nb01-ex2"] == 0.0
    assert "is not a valid notebook" in graded["report"]
    assert got["cora", "nb06-ex2"] == 2.0, graded["report"]  # earned before the crash
    assert got["cora", "nb07-ex2"] == 0.0
    assert [
        p for p in psutil.process_iter(["cmdline"]) if CRASH_MARK in (p.info["cmdline"] or [])
    ] == []
    assert grading_processes() == []


def test_deleted_test_cells_are_put_back_and_graded(graded):
    got = points(graded["rows"])
    assert got["dan", "nb06-ex2"] == 2.0 and got["dan", "nb07-ex2"] == 2.0
    assert got["dan", "nb01-ex2"] == 0.0
    assert "put back deleted cells: nb06-ex2-test" in graded["report"]
    assert "not handed in: 0 points" in graded["report"]


def test_a_renamed_notebook_in_nbgraders_layout_is_graded(graded):
    got = points(graded["rows"])
    assert got["eve", "nb01-ex2"] == 2.0
    assert f"graded {DOC2VEC} (1).ipynb as {DOC2VEC}.ipynb (renamed)" in graded["report"]


def test_grades_csv_and_feedback_come_from_the_gradebook(graded):
    where = graded["course"]
    with open(where / "grades.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r for r in rows if r["student"] == "ada"] == [
        {
            "student": "ada",
            "notebook": DOC2VEC,
            "exercise": "nb01-ex2",
            "points": "2.0",
            "max_points": "2.0",
        },
        {
            "student": "ada",
            "notebook": BOUNDS,
            "exercise": "nb06-ex2",
            "points": "2.0",
            "max_points": "2.0",
        },
        {
            "student": "ada",
            "notebook": BOUNDS,
            "exercise": "nb07-ex2",
            "points": "2.0",
            "max_points": "2.0",
        },
    ]
    assert {r["student"] for r in rows} == {"ada", "bob", "cora", "dan", "eve"}
    with nbgrader_course.gradebook(where) as gb:
        assert gb.find_submission("02_convergence_exercises", "bob").score == 2.0
    for student, score in [("ada", "4.0 / 4.0"), ("bob", "2.0 / 4.0"), ("dan", "4.0 / 4.0")]:
        html = (where / "feedback" / student / BOUNDS / f"{BOUNDS}.html").read_text()
        assert f"{BOUNDS} (Score: {score})" in html, student
    assert not (where / "feedback" / "eve" / BOUNDS).exists()  # nothing handed in
    for name in MINI:  # the sources and the release are not touched by grading
        assert read(graded["src"] / f"{name}.ipynb") == graded["ref"][name]


def test_nbgrader_export_in_the_course_folder_writes_what_grading_wrote(graded, tmp_path):
    """The course's nbgrader_config.py selects our export plugin (tools/course/export.py):
    nbgrader's own command gives the same points per student and exercise as grades.csv."""
    where, out = graded["course"], tmp_path / "exported.csv"
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", "export", "--to", str(out)],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    def rows(path):
        with open(path) as f:
            return sorted(tuple(r.values()) for r in csv.DictReader(f))

    assert rows(out) == rows(where / "grades.csv") and len(rows(out)) > 0


# Wrong answers to notebook 07's exercise that pass its checks by changing what they call.
WRONG_YOUNG = "def young_interval(c_seconds, mtbf_seconds):\n    return 1.0\n"
TAMPERED = {
    "abe": WRONG_YOUNG + "abs = lambda x: 0\nmin = lambda *a: float('inf')\n",  # builtins shadowed
    "bea": WRONG_YOUNG + "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.min = max\n",
    "cal": GAMED + "print('Exercise 2 passed.')\nimport os\nos._exit(0)\n",  # ends the kernel
    # builtins reached through a module the scan cannot tell is one: the runtime check sees it
    "fay": WRONG_YOUNG
    + "import pydoc\n\n\ndef f(m):\n    m.abs = lambda x: 0\n    m.min = lambda *a: float('inf')\n"
    + "\n\nlist(map(f, [pydoc.builtins]))\n",
}


def test_tampering_scores_0_is_flagged_and_leaves_earlier_exercises_their_points(graded, tmp_path):
    """Hand-written hostile answers through grading (tools/course/tamper.py): each wrong answer
    that disables its exercise's checks scores 0 there, with the reason in report.txt,
    flagged.csv and the feedback; the exercise before it keeps its points, and a finding
    that cannot reach the next test (a raise) leaves that test its points."""
    where = graded["course"]
    rel = read(where / "release" / BOUNDS / f"{BOUNDS}.ipynb")
    for student, source in TAMPERED.items():
        hand_in(
            tmp_path / "subs",
            student,
            BOUNDS,
            answer(answer(rel, "nb06-ex2", BISECTION), "nb07-ex2", source),
        )
    dee = answer(
        answer(rel, "nb06-ex2", "beta_max = 1.0\nraise SystemExit"), "nb07-ex2", ANSWER_YOUNG
    )
    hand_in(tmp_path / "subs", "dee", BOUNDS, dee)
    lines: list[str] = []
    rows = grade.grade(
        tmp_path / "subs",
        where,
        quick=True,
        timeout=60,
        src=graded["src"],
        say=lines.append,
        jobs=2,
    )
    got = points(rows)
    for student in TAMPERED:
        assert (got[student, "nb06-ex2"], got[student, "nb07-ex2"]) == (2.0, 0.0), (student, lines)
    assert (got["dee", "nb06-ex2"], got["dee", "nb07-ex2"]) == (0.0, 2.0), lines
    with nbgrader_course.gradebook(where) as gb:  # the shadowed checks did pass in the kernel
        for student in ("abe", "bea", "fay"):
            g = gb.find_grade("nb07-ex2-test", BOUNDS, BOUNDS, student)
            assert (g.auto_score, g.manual_score, g.score) == (2.0, 0.0, 0.0), student
    with open(where / "flagged.csv", newline="") as f:
        flagged = list(csv.DictReader(f))
    said = {(r["student"], r["what"]): r["scores_0"] for r in flagged}
    assert said[("abe", "rebinds `abs`, which the test of nb07-ex2 reads")] == "nb07-ex2"
    assert said[("bea", "rebinds builtins.abs")] == "nb07-ex2"
    assert said[("cal", "calls os._exit()")] == "nb07-ex2"
    assert said[("dee", "raises SystemExit")] == "nb06-ex2"
    fay = [r for r in flagged if r["student"] == "fay"]  # the scan saw nothing: one finding
    assert [(r["exercise"], r["line"], r["scores_0"]) for r in fay] == [
        ("nb07-ex2", "", "nb07-ex2")
    ]
    assert "builtin `abs`, builtin `min`" in fay[0]["what"], fay
    assert any("tampering: nb07-ex2 cell" in line and "abe" not in line for line in lines)
    page = (where / "feedback" / "abe" / BOUNDS / f"{BOUNDS}.html").read_text()
    # the feedback page renders the comment as markdown: both findings, the names as code
    assert "0 points: its solution rebinds <code>abs</code>" in page
    assert "its solution rebinds <code>min</code>" in page
    assert grading_processes() == []


def test_a_canvas_download_is_collected_graded_and_exported_for_canvas(graded, tmp_path):
    """The LMS round trip: a zip in Canvas's "Download Submissions" naming, made here, is
    collected through the roster (tools/course/collect.py), graded, and the gradebook exported
    as Canvas's import file through `nbgrader export` (tools/course/lms.py)."""
    where, ref = graded["course"], graded["ref"]
    with zipfile.ZipFile(tmp_path / "canvas.zip", "w") as zf:  # ida: late, renamed by Canvas
        zf.writestr(f"okaforida_LATE_1301_9001_{BOUNDS}-1.ipynb", nbformat.writes(ref[BOUNDS]))
        zf.writestr(f"strangerx_1399_9002_{BOUNDS}.ipynb", nbformat.writes(ref[BOUNDS]))
    with nbgrader_course.gradebook(where) as gb:
        known = sorted(s.id for s in gb.students)
    roster = tmp_path / "roster.csv"
    with open(roster, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["nbgrader_id", "Student", "ID", "SIS User ID", "SIS Login ID", "Section"])
        for i, sid in enumerate(known + ["ida"]):
            writer.writerow(
                [sid, f"Student, {sid}", 1400 + i if sid != "ida" else 1301, "", "", ""]
            )
    lines: list[str] = []
    got = collect(tmp_path / "canvas.zip", roster, tmp_path / "subs", say=lines.append)
    assert got.files == {"ida": [f"{BOUNDS}.ipynb"]} and got.late == ["ida"], lines  # -1 off
    assert got.unmapped == ["strangerx (1399)"], lines
    rows = grade.grade(tmp_path / "subs", where, quick=True, timeout=60, src=graded["src"])
    mine = {e: p for (s, e), p in points(rows).items() if s == "ida"}
    assert mine == {"nb06-ex2": 2.0, "nb07-ex2": 2.0, "nb01-ex2": 0.0}, mine
    done = subprocess.run(
        [
            "make",
            "-s",
            "-o",
            ".venv/.installed",
            "grade-export",
            f"COURSE={where}",
            "FORMAT=canvas",
            f"ROSTER={roster}",
            f"OUT={tmp_path / 'canvas.csv'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "canvas.csv", newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", DOC2VEC, BOUNDS]
    assert table[1] == ["    Points Possible", "", "", "", "", "2", "4"]
    assert {r[1]: r[5:] for r in table[2:]}["1301"] == ["", "4"]  # ida: 02 only, in full
    assert grading_processes() == []


def test_a_hanging_cell_times_out_and_other_students_keep_their_grades(graded, tmp_path):
    where = graded["course"]
    before = {k: v for k, v in points(graded["rows"]).items() if k[0] != "hal"}
    rel = read(where / "release" / BOUNDS / f"{BOUNDS}.ipynb")
    hang = answer(
        answer(rel, "nb06-ex2", "import time\ntime.sleep(10_000)"),
        "nb07-ex2",
        "def young_interval(c_seconds, mtbf_seconds):\n"
        "    return (2 * c_seconds * mtbf_seconds) ** 0.5",
    )
    hand_in(tmp_path / "late", "hal", BOUNDS, hang)
    (tmp_path / "late" / "ada").mkdir()  # ada hands in nothing new: her grades stay
    lines = []
    rows = grade.grade(
        tmp_path / "late", where, quick=True, timeout=30, src=graded["src"], say=lines.append
    )  # 30 s: the notebook's first cell imports TensorFlow, which must not time out itself
    got = points(rows)
    assert got["hal", "nb06-ex2"] == 0.0 and got["hal", "nb07-ex2"] == 2.0, lines
    assert {e: got["ada", e] for e in FULL} == FULL
    assert sum("kept its grade from an earlier run" in line for line in lines) == 2, lines
    for name in MINI:  # and her feedback stays
        assert (where / "feedback" / "ada" / name / f"{name}.html").is_file()
    assert any("nb06-ex2-solution: ran past the timeout" in line for line in lines), lines
    assert any(
        "nb06-ex2-test: NameError, after cell" in line
        and "nb06-ex2-solution ran past the timeout" in line
        for line in lines
    ), lines
    with nbgrader_course.gradebook(where) as gb:
        for (student, exercise), value in before.items():
            nb_id = DOC2VEC if exercise.startswith("nb01") else BOUNDS
            try:
                sub = gb.find_submission_notebook(nb_id, nb_id, student)
            except Exception:
                assert value == 0.0
                continue
            score = {g.cell.name: g.score for g in sub.grades}[f"{exercise}-test"]
            assert score == value, (student, exercise)
    assert grading_processes() == []


def _autograded_mtimes(course, student):
    return {
        n: (course / "autograded" / student / n / f"{n}.ipynb").stat().st_mtime_ns
        for n in MINI
        if (course / "autograded" / student / n).is_dir()
    }


def test_students_and_unchanged_notebooks_keep_their_grades_unless_regraded(graded, tmp_path):
    where = tmp_path / "course"
    shutil.copytree(graded["course"], where)  # release() rewrites its config for the new place
    ada_before = {k: v for k, v in points(graded["rows"]).items() if k[0] == "ada"}
    mtimes = _autograded_mtimes(where, "ada")
    assert set(mtimes) == set(MINI)  # kept too by the gradings that found no notebook of hers
    lines = []
    rows = grade.grade(
        graded["subs"],
        where,
        quick=True,
        timeout=60,
        src=graded["src"],
        say=lines.append,
        students=["ada"],
    )
    assert {r["student"] for r in rows} == {"ada"} and points(rows) == ada_before
    assert sum("unchanged since it was graded" in line for line in lines) == len(MINI), lines
    assert _autograded_mtimes(where, "ada") == mtimes  # nothing ran again
    # a changed notebook is graded again; the unchanged one keeps its grade
    subs = tmp_path / "subs"
    changed = read(graded["subs"] / "ada" / f"{BOUNDS}.ipynb")
    changed.cells.append(nbformat.v4.new_markdown_cell("Checked again."))
    hand_in(subs, "ada", BOUNDS, changed)
    shutil.copy(graded["subs"] / "ada" / f"{DOC2VEC}.ipynb", subs / "ada")
    lines = []
    rows = grade.grade(subs, where, quick=True, timeout=60, src=graded["src"], say=lines.append)
    after = _autograded_mtimes(where, "ada")
    assert set(after) == set(mtimes), lines
    assert after[DOC2VEC] == mtimes[DOC2VEC] and after[BOUNDS] > mtimes[BOUNDS], lines
    assert points(rows) == ada_before
    # REGRADE: the same file runs again (the one graded just now; the other is not handed in)
    (subs / "ada" / f"{DOC2VEC}.ipynb").unlink()
    lines = []
    grade.grade(
        subs, where, quick=True, timeout=60, src=graded["src"], say=lines.append, regrade=True
    )
    assert not any("unchanged since" in line for line in lines), lines
    assert _autograded_mtimes(where, "ada")[BOUNDS] > after[BOUNDS]
    assert grading_processes() == []


def test_students_naming_a_missing_folder_is_an_error_that_names_it(graded):
    with pytest.raises(ValueError, match="STUDENTS names zed, with no folder"):
        grade.grade(graded["subs"], graded["course"], students=["ada", "zed"])


def test_bad_submissions_folder_is_named_in_the_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*one sub-folder per student"):
        grade.grade(tmp_path / "nowhere", tmp_path / "course")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty holds no student folder"):
        grade.grade(tmp_path / "empty", tmp_path / "course")


def test_every_test_cell_of_the_lessons_has_points_and_every_point_a_cell():
    ids = set()
    for path in notebook_paths():  # every lesson, 00_index has no test cells
        cells = nbgrader_course.nbgrader_cells(read(path))
        ids |= {g for g, c in cells.items() if c.metadata["nbgrader"].get("grade")}
        for g, c in cells.items():
            meta = c.metadata["nbgrader"]
            if meta.get("solution"):
                assert "### BEGIN SOLUTION" in c.source, g
            if meta.get("grade"):
                assert "### BEGIN HIDDEN TESTS" in c.source, g
    assert ids == set(lessons.POINTS)
    assert all(isinstance(v, int) and v > 0 for v in lessons.POINTS.values())


def test_a_failed_reference_run_raises_and_leaves_nothing(tmp_path):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("raise RuntimeError('this lesson is broken')")]
    )
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, str(lessons / "01_broken.ipynb"))
    where = tmp_path / "course"
    with pytest.raises(RuntimeError, match="reference run of 01_broken failed"):
        grade.reference_runs(
            where, "01_broken", quick=True, timeout=60, src=lessons, say=lambda _: None
        )
    assert list((where / "reference" / "quick").iterdir()) == []  # no partial folder either
    with pytest.raises(FileNotFoundError, match="02_missing.ipynb is missing"):
        grade.reference_runs(where, "02_missing", quick=True, timeout=60, src=lessons)
    assert grading_processes() == []


def hostile(course, subs, root, port):
    """Solutions of notebook 07's exercise 2 that attack the grading, by name; each knows the
    real paths (the worst case: a student who read this repository)."""
    db = course / "gradebook.db"
    source = course / "source" / BOUNDS / f"{BOUNDS}.ipynb"
    return {
        "gradebook": f"""
import sqlite3
con = sqlite3.connect("file:{db}?mode=rw", uri=True)
con.execute("UPDATE grade SET manual_score = 0")
con.commit()
""",
        "sources": f"""
errors = []
for path in ["{source}", "{root / "notebooks" / "07_fault_tolerance.ipynb"}"]:
    try:
        with open(path, "a") as f:
            f.write("# every student gets full points")
    except OSError as exc:
        errors.append(exc)
raise errors[-1]  # both failed (a write that worked would show in the test)
""",
        "peek": f"""
print(open("{subs / "ada" / f"{BOUNDS}.ipynb"}").read()[:100])
""",
        "network": f"""
import socket
socket.create_connection(("127.0.0.1", {port}), timeout=5).sendall(b"hello from the sandbox")
""",
        "symlink": f"""
import os
os.remove("{BOUNDS}.ipynb")  # nbgrader writes the graded notebook back here: make it a link
os.symlink("{source}", "{BOUNDS}.ipynb")
""",
        "hog": """
hog = []
while True:
    hog.append(b"x" * (100 * 2**20))  # written, so resident
""",
    }


def test_hostile_submissions_fail_inside_the_sandbox_and_touch_nothing_else(graded, tmp_path):
    where = tmp_path / "course"
    shutil.copytree(graded["course"], where)
    before = gradebook_dump(where)
    protected = [
        where / "source" / BOUNDS / f"{BOUNDS}.ipynb",
        where / "release" / BOUNDS / f"{BOUNDS}.ipynb",
        ROOT / "notebooks" / "07_fault_tolerance.ipynb",
        graded["subs"] / "ada" / f"{BOUNDS}.ipynb",
    ]
    sums = {p: p.read_bytes() for p in protected}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    subs = tmp_path / "hostile"
    rel = read(where / "release" / BOUNDS / f"{BOUNDS}.ipynb")
    attacks = hostile(where, graded["subs"], ROOT, listener.getsockname()[1])
    for name, code in attacks.items():
        hand_in(
            subs,
            name,
            BOUNDS,
            answer(answer(nbformat.from_dict(rel), "nb06-ex2", BISECTION), "nb07-ex2", code),
        )
    lines = []
    try:
        rows = grade.grade(
            subs,
            where,
            quick=True,
            timeout=60,
            src=graded["src"],
            say=lines.append,
            jobs=2,
            memory_mb=2000,
        )
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    finally:
        listener.close()
    report = "\n".join(lines)
    got = points(rows)
    for name in attacks:  # each failed, and earned the points of the other exercise
        assert (got[name, "nb06-ex2"], got[name, "nb07-ex2"]) == (2.0, 0.0), (name, report)
    for name, error in [
        ("gradebook", "OperationalError"),
        ("sources", "OSError"),
        ("peek", "FileNotFoundError"),
        ("network", "ConnectionRefusedError"),
        ("symlink", "OSError"),
    ]:
        assert re.search(
            rf"^{name} +{BOUNDS} .*\n +- nb07-ex2-solution: {error}\n", report, re.MULTILINE
        ), (name, report)
    assert (
        "nb07-ex2-solution: ended the kernel (it used more than the memory limit of 2,000 MB)"
        in report
    ), report
    after = gradebook_dump(where)
    assert [r for r in after if r[0] not in attacks] == before  # every other grade as it was
    assert {p: p.read_bytes() for p in protected} == sums
    assert grading_processes() == []


def test_without_a_sandbox_grading_stops_with_the_reason_unless_turned_off(
    graded, tmp_path, monkeypatch
):
    subs = tmp_path / "subs"
    shutil.copytree(graded["subs"] / "ada", subs / "ada")
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap (nor anything else) on PATH
    assert "bwrap (bubblewrap) is not on PATH" in sandbox.unavailable_reason()
    with pytest.raises(RuntimeError, match="cannot sandbox students' code here: bwrap.*SANDBOX=0"):
        grade.grade(subs, tmp_path / "course", src=graded["src"])
    assert not (tmp_path / "course").exists()  # stopped before it wrote anything
    monkeypatch.undo()
    lines = []
    rows = grade.grade(
        subs,
        tmp_path / "course",
        quick=True,
        timeout=60,
        src=graded["src"],
        say=lines.append,
        sandboxed=False,
    )
    assert {e: points(rows)["ada", e] for e in FULL} == FULL
    assert sum(grade.UNSANDBOXED in line for line in lines) == len(MINI), lines
    assert grading_processes() == []


def test_ctrl_c_while_two_notebooks_are_graded_ends_every_process(graded, tmp_path):
    where = tmp_path / "course"
    shutil.copytree(graded["course"], where)
    rel = read(where / "release" / BOUNDS / f"{BOUNDS}.ipynb")
    for student in ("sleepy", "dozy"):
        hand_in(
            tmp_path / "subs",
            student,
            BOUNDS,
            answer(nbformat.from_dict(rel), "nb06-ex2", "import time\ntime.sleep(10_000)"),
        )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.course",
            "grade",
            str(tmp_path / "subs"),
            "--course",
            str(where),
            "--lessons",
            str(graded["src"]),
            "--jobs",
            "2",
            "--timeout",
            "600",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        kernels = set()  # the grading tokens of running kernels: one per graded notebook
        while time.monotonic() < deadline and len(kernels) < 2:  # until both kernels run
            time.sleep(0.5)
            for p in grading_processes():
                try:
                    if "ipykernel_launcher" in " ".join(p.cmdline()):
                        kernels.add(p.environ()["LABS_GRADING_TOKEN"])
                except psutil.Error:
                    continue
        assert len(kernels) == 2, proc.communicate(timeout=60)
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted; every grading process was ended" in err
    assert grading_processes() == []
