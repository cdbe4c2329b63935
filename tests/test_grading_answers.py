"""Every exercise of the real lessons, graded through nbgrader: second answers get full points,
wrong answers get 0 for exactly their exercise, and each notebook is graded on its own.

Two students hand in the lessons, answered from tests/exercise_answers.py: `odd` gives
the wrong answer to exercises 1, 3, ... and the second answer to 2, 4, ...; `even` the other
way round. So every second answer and every wrong answer is graded once, each next to
exercises of the other kind. Notebook 02 in `odd`'s answers is handed in by a third student,
`late`, alone and renamed: 02 reads notebook 01's features, which come from the course's
reference run, not from the student's own 01 (late has none), so its second answers get
full points; a later grading asking for that reference run again gets it without running 01.
(Late's 02 stands in for odd's: 02 runs twice, as every lesson does, not three times.) All three are
graded in one run, two pairs at once. Quick mode; points are read back from nbgrader's
gradebook. (An untouched release, every answer missing, is graded in tests/test_course.py, on
a small course.)
"""

from __future__ import annotations

import nbformat
import pytest

from tests.exercise_answers import SECOND, WRONG
from tools import exercises
from tools.course import grade, lessons, release
from tools.notebooks import notebook_paths, read

# grades every lesson with nbgrader, twice: `make unit` leaves it out
pytestmark = pytest.mark.slow

LESSONS = [p.stem for p in notebook_paths() if p.name != "00_index.ipynb"]
LATE = "02_logreg_lr_schedules"  # handed in by `late` alone, with odd's answers


def answered(release_nb, pick):
    """The release with each exercise's solution cell replaced by pick(exercise number, id)."""
    nb = nbformat.from_dict(release_nb)
    for ex_id, ex in exercises.exercises(nb).items():
        nb.cells[ex.solution_index].source = pick(int(ex_id.split("-ex")[1]), ex_id)
    return nb


def hand_in(folder, student, name, nb):
    path = folder / student / f"{name}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def points(rows):
    return {(r["student"], r["exercise"]): float(r["points"]) for r in rows}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, request):
    request.getfixturevalue("shared_data")
    tmp = tmp_path_factory.mktemp("answers")
    where, subs = tmp / "course", tmp / "submissions"
    release.release(where, timeout=600)
    released = {a: read(where / "release" / a / f"{a}.ipynb") for a in LESSONS}
    odd = {a: answered(released[a], lambda k, i: (WRONG if k % 2 else SECOND)[i]) for a in LESSONS}
    for a in LESSONS:
        if a != LATE:
            hand_in(subs, "odd", a, odd[a])
        hand_in(
            subs, "even", a, answered(released[a], lambda k, i: (SECOND if k % 2 else WRONG)[i])
        )
    hand_in(subs, "late", "logreg (final)", odd[LATE])
    said = []
    rows = grade.grade(subs, where, quick=True, timeout=600, say=said.append, jobs=2)
    # what a later grading of 02 does first: ask for the reference run of 01 (pair_settings)
    again = []
    reference = grade.reference_runs(where, "01_doc2vec_dbpedia", True, 600, say=again.append)
    return {
        "rows": rows,
        "report": "\n".join(said),
        "again": again,
        "reference": reference,
        "course": where,
    }


def test_second_answers_full_points_and_wrong_answers_zero_for_exactly_their_exercise(graded):
    got = points(graded["rows"])
    expect = {}
    for gid, max_points in lessons.POINTS.items():
        ex_id = gid.removesuffix("-test")
        k = int(ex_id.split("-ex")[1])
        odd = "late" if ex_id.startswith("nb02-") else "odd"
        expect[odd, ex_id] = 0.0 if k % 2 else float(max_points)
        expect["even", ex_id] = float(max_points) if k % 2 else 0.0
    assert {key: got[key] for key in expect} == expect, graded["report"]


def test_a_notebook_handed_in_alone_without_its_01_gets_its_points_from_the_reference_run(graded):
    got = points(graded["rows"])
    seconds = 0
    for gid, max_points in lessons.POINTS.items():
        ex_id = gid.removesuffix("-test")
        if gid.startswith("nb02-") and int(ex_id.split("-ex")[1]) % 2 == 0:  # second answers
            assert got["late", ex_id] == max_points, graded["report"]
            seconds += 1
        elif gid.startswith("nb01-"):  # not handed in
            assert got["late", ex_id] == 0.0
    assert seconds >= 1
    assert (
        "graded logreg (final).ipynb as 02_logreg_lr_schedules.ipynb (renamed)" in graded["report"]
    )
    # the features 02 read came from the course's own run of notebook 01, made once: the
    # grading made it, and a later grading gets the same one without running 01 again
    runs = graded["course"] / "reference" / "quick" / "01_doc2vec_dbpedia" / "runs"
    assert (runs / "features" / "doc2vec_dbpedia" / "metadata.json").is_file()
    assert "reference run of 01_doc2vec_dbpedia" in graded["report"]
    assert graded["reference"] == runs and graded["again"] == []
