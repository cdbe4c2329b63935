"""The runtime check beside the scan (tools/course/sentinel.py), in a real kernel: a notebook
of three exercises, with the grader's cells added, run by nbclient as nbgrader runs it (errors
allowed), then read. Each kernel start costs about a second; no TensorFlow."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from tools.course import sentinel, tamper

LESSON = (
    "import math\nimport numpy as np\n\n\ndef close(a, b):\n    return bool(np.isclose(a, b))\n"
)
TESTS = {  # each exercise's test reads one thing of the lesson's
    "nb98-ex1": "assert abs(x - 1.0) < 1e-9",
    "nb98-ex2": "assert math.isclose(y, 2.0)",
    "nb98-ex3": "np.testing.assert_allclose(z, 3.0)\nassert close(z, 3.0)",
}
RIGHT = {"nb98-ex1": "x = 1.0", "nb98-ex2": "y = 2.0", "nb98-ex3": "z = 3.0"}


def cell(kind, source, gid=None, **flags):
    make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
    c = make(source)
    if gid:
        c.metadata["nbgrader"] = {"grade_id": gid, "locked": not flags.get("solution"), **flags}
    return c


def notebook(answers: dict[str, str]):
    nb = nbformat.v4.new_notebook()
    nb.cells = [cell("code", LESSON)]
    for ex, test in TESTS.items():
        nb.cells += [
            cell("markdown", f"Define `{RIGHT[ex][0]}`.", f"{ex}-prompt"),
            cell("code", answers.get(ex, RIGHT[ex]), f"{ex}-solution", solution=True),
            cell("code", test, f"{ex}-test", grade=True, points=1),
        ]
    return nb


def run(answers: dict[str, str], tmp_path):
    """(findings, the notebook without the grader's cells, the cells' outputs as run)."""
    source, submitted = notebook({}), notebook(answers)
    guarded = sentinel.guarded(submitted, source)
    NotebookClient(guarded, timeout=60, kernel_name="python3", allow_errors=True).execute()
    path = tmp_path / "graded.ipynb"
    nbformat.write(guarded, str(path))
    found, stripped = sentinel.verdicts(path, source)
    assert [c.source for c in stripped.cells] == [c.source for c in submitted.cells]
    assert nbformat.read(str(path), as_version=4).cells == stripped.cells  # written back
    return found, tamper.zeroed(found, stripped, source), guarded


def test_an_honest_notebook_reports_nothing_changed_at_every_check(tmp_path):
    """Unusual but honest: numpy imported again, a seed set, a helper named like a numpy
    function, a lot printed, a class of the student's own patched, pyplot imported."""
    honest = {
        "nb98-ex1": "import numpy as np\nnp.random.seed(0)\nx = 1.0\nprint('x' * 5000)",
        "nb98-ex2": "def isclose(a, b):\n    return a == b\n\n\nclass C:\n    pass\n\n\n"
        "C.f = lambda self: 2.0\ny = C().f()",
        "nb98-ex3": "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 2])\nz = 3.0",
    }
    found, lost, ran = run(honest, tmp_path)
    assert found == [] and lost == {}
    checks = [c for c in ran.cells if c.metadata.get(sentinel.META)]
    assert len(checks) == 1 + 2 * 3  # the lock, and a check before and after each test
    assert all('"changed": []' in c.outputs[0]["text"] for c in checks)
    assert '"watched": ' in checks[0].outputs[0]["text"]


def test_a_builtin_changed_out_of_the_scans_sight_costs_its_exercise_and_every_later_one(
    tmp_path,
):
    """A module the scan cannot tell is one (pydoc's `builtins`) handed to map(): the scan
    finds nothing, the check before exercise 2's test sees `abs` changed."""
    answer = (
        "import pydoc\n\n\ndef f(m):\n    m.abs = lambda v: 0\n\n\n"
        "list(map(f, [pydoc.builtins]))\ny = 2.0"
    )
    found, lost, _ = run({"nb98-ex2": answer}, tmp_path)
    assert [(f.exercise, f.cell, f.reach) for f in found] == [("nb98-ex2", 5, None)]
    assert "builtin `abs`" in found[0].what and "before the test of nb98-ex2" in found[0].what
    assert set(lost) == {"nb98-ex2", "nb98-ex3"}  # a builtin: library code calls it too


def test_a_change_made_while_its_test_runs_is_blamed_on_that_test(tmp_path):
    """The answer changes np.isclose (which the lesson's `close` calls) when the test turns it
    into an array: after the check before the test, seen by the check after it."""
    answer = (
        "def patch(m):\n    m.isclose = lambda *a, **k: True\n\n\n"
        "class Sneaky:\n    def __array__(self, dtype=None, copy=None):\n"
        "        list(map(patch, [np]))\n        return np.asarray(9.0)\n\n\n"
        "z = Sneaky()"
    )
    found, lost, _ = run({"nb98-ex3": answer}, tmp_path)
    assert [f.exercise for f in found] == ["nb98-ex3"]
    assert "while its test ran" in found[0].what and "`np.isclose`" in found[0].what
    assert set(lost) == {"nb98-ex3"}


@pytest.mark.parametrize(
    "answer",
    [
        "import sys, io\ny = 2.0\nsys.stdout = io.StringIO()",  # the checks print nowhere
        "y = 2.0\ndel _labs_sentinel",  # the check removed
    ],
    ids=["output-redirected", "check-removed"],
)
def test_a_check_that_does_not_report_costs_every_later_exercise(answer, tmp_path):
    found, lost, _ = run({"nb98-ex2": answer}, tmp_path)
    assert [(f.exercise, f.reach) for f in found] == [("nb98-ex2", None)]
    assert "kept the grader's check" in found[0].what
    assert set(lost) == {"nb98-ex2", "nb98-ex3"}  # exercise 1 keeps its points
