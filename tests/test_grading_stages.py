"""Stages of tools/course/grade.py that decide without running anything (the gradings
themselves: tests/test_course.py and tests/test_grading_answers.py)."""

from tools.course.grade import feedback_runs


def _graded(course, student, *notebooks):
    for nb in notebooks:
        (course / "autograded" / student / nb).mkdir(parents=True)


def test_feedback_is_one_run_for_a_class_that_handed_in_everything_and_one_per_notebook_else(
    tmp_path,
):
    for s in ("even", "odd"):
        _graded(tmp_path, s, "01", "02", "03")
    _graded(tmp_path, "late", "02")
    everyone = {"01": ["odd", "even"], "02": ["even", "late", "odd"], "03": ["even", "odd"]}
    assert feedback_runs(tmp_path, everyone) == [("*", ["even", "odd"]), ("02", ["late"])]
    # no student graded in every notebook: one run per notebook
    assert feedback_runs(tmp_path, {"01": ["odd"], "02": ["late"]}) == [
        ("01", ["odd"]),
        ("02", ["late"]),
    ]
    # a notebook graded earlier (not now) in a student's folder: not regenerated with "*"
    assert feedback_runs(tmp_path, {"01": ["even", "odd"], "02": ["even", "odd"]}) == [
        ("01", ["even", "odd"]),
        ("02", ["even", "odd"]),
    ]
