"""report.json, each pair's outcome, written by grading and read back by merging shards (the
gradings themselves: tests/test_course.py)."""

import json

import pytest

from tools.course.report import PairOutcome, read_outcomes, write_outcomes


def test_outcomes_read_back_as_they_were_written(tmp_path):
    pairs = [
        PairOutcome(
            "ada", "01_doc2vec_dbpedia", "graded", 12.5, ["graded a.ipynb as 01 (renamed)"]
        ),
        PairOutcome("bob", "01_doc2vec_dbpedia", "absent", notes=["not handed in: 0 points"]),
    ]
    write_outcomes(tmp_path, pairs)
    assert read_outcomes(tmp_path) == pairs


def test_a_report_of_another_layout_is_refused_with_what_to_do(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps([["ada", "01", 1.0, [], "graded"]]))
    with pytest.raises(ValueError, match="report schema None, this grader reads 1: grade that"):
        read_outcomes(tmp_path)
