"""Every exercise's test reads only what its student defines or what the lesson gives everyone.

Read statically (tools/exercises.py), for every exercise of every lesson: the names its test
cell reads, against the names its prompt asks for and the names bound outside solution
regions. Also: every exercise has a second, independent answer and a wrong answer in
tests/exercise_answers.py (graded through nbgrader by tests/test_grading_answers.py).
"""

from __future__ import annotations

import ast

import nbformat
import pytest

from tests.exercise_answers import SECOND, WRONG
from tools import exercises
from tools.notebooks import NOTEBOOK_DIR, notebook_paths, read

LESSONS = [p for p in notebook_paths() if p.name != "00_index.ipynb"]


def all_exercises():
    return {
        ex_id: (path, ex)
        for path in LESSONS
        for ex_id, ex in exercises.exercises(read(path)).items()
    }


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_every_test_reads_only_what_its_prompt_asks_for_or_the_lesson_gives(path):
    assert exercises.contract_violations(path) == []


def test_there_are_31_exercises_each_with_prompt_solution_and_test():
    found = all_exercises()
    assert len(found) == 31
    for ex_id, (_path, ex) in found.items():
        assert ex.prompt and ex.solution_index is not None and ex.test_index is not None, ex_id
        assert ex.solution_index < ex.test_index, ex_id


def lesson(cells):
    """A notebook of (cell type, grade id or None, source) triples, with nbgrader metadata."""
    nb = nbformat.v4.new_notebook()
    for kind, gid, source in cells:
        cell = (nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell)(
            source
        )
        if gid:
            cell.metadata["nbgrader"] = {
                "grade_id": gid,
                "solution": gid.endswith("-solution"),
                "grade": gid.endswith("-test"),
                "locked": True,
            }
        nb.cells.append(cell)
    return nb


def violations_of(tmp_path, cells):
    path = tmp_path / "99_made_up.ipynb"
    nbformat.write(lesson(cells), str(path))
    return exercises.contract_violations(path)


def test_a_test_that_reads_a_name_only_the_solution_binds_is_named(tmp_path):
    found = violations_of(
        tmp_path,
        [
            ("code", None, "import numpy as np\nx = np.arange(3)"),
            ("md", "nb99-ex1-prompt", "Store the total of `x` in `total`."),
            (
                "code",
                "nb99-ex1-solution",
                "### BEGIN SOLUTION\nparts = list(x)\ntotal = sum(parts)\n### END SOLUTION",
            ),
            ("code", "nb99-ex1-test", "assert total == sum(parts) == np.sum(x)"),
        ],
    )
    assert found == [
        "nb99-ex1: reads `parts`, which only nb99-ex1-solution binds: ask for it "
        "in the prompt or compute it outside the solution"
    ]


def test_a_name_rebound_in_a_solution_or_taken_from_another_exercise_is_named(tmp_path):
    found = violations_of(
        tmp_path,
        [
            ("code", None, "ours = 1"),
            ("md", "nb99-ex1-prompt", "Define `size`."),
            ("code", "nb99-ex1-solution", "### BEGIN SOLUTION\nsize = 3\n### END SOLUTION"),
            ("code", "nb99-ex1-test", "assert size == 3"),
            ("md", "nb99-ex2-prompt", "Write `double(v)`, using `size`."),
            (
                "code",
                "nb99-ex2-solution",
                "def double(v):\n    ### BEGIN SOLUTION\n    n = 2\n"
                "    return n * v\n    ### END SOLUTION\n"
                "### BEGIN SOLUTION\nours = double(size)\n### END SOLUTION",
            ),
            ("code", "nb99-ex2-test", "assert double(size) == ours == 6 and undefined_name"),
        ],
    )
    assert found == [
        "nb99-ex2: reads `ours`, which only nb99-ex2-solution binds: ask for it in the prompt "
        "or compute it outside the solution",
        "nb99-ex2: reads `size`, which nb99-ex1-solution binds: a test must not depend on "
        "another exercise's answer",
        "nb99-ex2: reads `undefined_name`, which nothing before the test binds outside a solution",
    ]


def test_names_local_to_a_function_in_a_solution_do_not_count():
    assert exercises.module_bindings(
        "def f(a):\n    b = a\n    return b\n[c for c in ()]\n"
        "import os.path as p, sys\nfor i in range(2):\n    j = i"
    ) == {"f", "p", "sys", "i", "j"}
    assert exercises.prompt_names('Write `f(a, b)`, store `t["x"]` and `n`; use `np.log`.') == {
        "f",
        "t",
        "n",
        "np",
    }


def test_every_exercise_has_a_second_answer_and_a_wrong_one_that_parse():
    ids = set(all_exercises())
    assert set(SECOND) == ids and set(WRONG) == ids
    for ex_id in sorted(ids):
        ast.parse(SECOND[ex_id])
        ast.parse(WRONG[ex_id])
        assert WRONG[ex_id] != SECOND[ex_id], ex_id  # the mistake was really made


def test_second_answers_are_not_the_reference_solutions():
    """Written apart: no second answer repeats a line of the reference's solution region
    (signatures the prompt prescribes aside)."""
    for ex_id, (path, ex) in all_exercises().items():
        source = read(path).cells[ex.solution_index].source
        reference = {
            line.strip()
            for _, code in exercises.solution_regions(source)
            for line in code.splitlines()
            if len(line.strip()) > 25 and not line.strip().startswith("def ")
        }
        shared = reference & {line.strip() for line in SECOND[ex_id].splitlines()}
        assert not shared, (ex_id, shared)


def test_the_lessons_hold_no_second_answer():
    sources = [c.source for p in LESSONS for c in read(p).cells]
    assert len(sources) > 100 and NOTEBOOK_DIR.is_dir()
    for ex_id, answer in SECOND.items():
        assert not any(answer in s for s in sources), ex_id
