"""The static scan of solution cells (tools/course/tamper.py) on the real lessons: no reference
solution, second answer or wrong answer is flagged, nor are honest but unusual answers; and
each way below of making a failing test pass is flagged in the solution that holds it, costing
that exercise and, only where its test could have been changed, the later ones. That grading
applies it (points, report, flagged.csv) is in test_course.py."""

from __future__ import annotations

import nbformat
import pytest

from tests.exercise_answers import SECOND, WRONG
from tools import exercises
from tools.course.tamper import scan, zeroed
from tools.notebooks import NOTEBOOK_DIR, notebook_paths, read

LESSONS = [p for p in notebook_paths() if p.name != "00_index.ipynb"]
LOGREG = NOTEBOOK_DIR / "02_logreg_lr_schedules.ipynb"  # exercises 1-3; tests use np, abs, math


def answered(source, answers: dict[str, str]):
    """The lesson with the given exercises' solution cells replaced."""
    nb = nbformat.from_dict(source)
    for ex_id, ex in exercises.exercises(nb).items():
        if ex_id in answers:
            nb.cells[ex.solution_index].source = answers[ex_id]
    return nb


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_no_reference_second_or_wrong_answer_is_flagged(path):
    source = read(path)
    assert scan(source, source) == []
    ids = list(exercises.exercises(source))
    for pool in (SECOND, WRONG):
        assert scan(answered(source, {i: pool[i] for i in ids}), source) == [], pool is SECOND


HONEST = {
    "a helper named like numpy's": "def mean(xs):\n    return sum(xs) / len(xs)\n",
    "its own class, monkeypatched": "class Mine:\n    pass\n\nMine.twice = lambda self, x: 2 * x\n",
    "numpy imported again": "import numpy as np\nfrom numpy import testing\n",
    "seeds set": "np.random.seed(0)\nimport random\nrandom.seed(1)\n",
    "a lot printed": "for i in range(1000):\n    print(i, 'passes through; my checks passed')\n",
    "a timing magic": "%time total = sum(range(10))\n",
    "plot and environment settings": "import os\nos.environ['X'] = '1'\n",
    "its own object's attributes": "class Box:\n    pass\n\nbox = Box()\nbox.value = 3\n",
    "a dataclass of its own": "from dataclasses import dataclass\n\n@dataclass\nclass Run:\n"
    "    loss: float\n\nruns = sorted([Run(0.2), Run(0.1)], key=lambda r: r.loss)\n",
    "a library's result changed": "grid = np.zeros((2, 2), dtype=np.int8)\ngrid[0, 0] = 1\n"
    "grid.shape = (4,)\nimport matplotlib.pyplot as plt\nplt.rcParams['figure.dpi'] = 80\n",
}


@pytest.mark.parametrize("extra", HONEST.values(), ids=HONEST.keys())
def test_honest_but_unusual_answers_are_not_flagged(extra):
    source = read(LOGREG)
    nb = answered(source, {"nb02-ex1": extra + "\n" + SECOND["nb02-ex1"]})
    assert scan(nb, source) == []


# attack -> (what the finding says, the later exercises that lose their points)
ATTACKS = {
    "np.testing.assert_allclose = lambda *a, **k: None": (
        "rebinds numpy.testing.assert_allclose",
        {"nb02-ex2", "nb02-ex3"},  # both later tests read np
    ),
    "import builtins\nbuiltins.abs = lambda x: 0": ("imports builtins", {"nb02-ex2", "nb02-ex3"}),
    "abs = lambda x: 0": ("rebinds `abs`, which the test of nb02-ex1 reads", {"nb02-ex3"}),
    "import math\nmath.isclose = lambda *a, **k: True": (
        "rebinds math.isclose",
        {"nb02-ex2", "nb02-ex3"},  # library code may read it: every later test
    ),
    "raise SystemExit": ("raises SystemExit", set()),
    "print(f'Exercise {1} passed.')": ("prints a test's success message", set()),
    "raise KeyboardInterrupt()": ("raises KeyboardInterrupt", set()),
    "get_ipython().set_custom_exc((AssertionError,), lambda *a, **k: None)": (
        "calls get_ipython().set_custom_exc()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "import sys\nsys.settrace(lambda *a: None)": ("calls sys.settrace()", {"nb02-ex2", "nb02-ex3"}),
    "import sys\nsys.excepthook = lambda *a: None": (
        "rebinds sys.excepthook",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "print('Exercise 1 passed.')\nimport os\nos._exit(0)": (
        "calls os._exit()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "t = np.testing\nt.assert_allclose = print": (
        "rebinds numpy.testing.assert_allclose",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "def off(m):\n    m.assert_allclose = print\n\noff(np.testing)": (
        "passes numpy.testing to off()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "setattr(__import__('num' + 'py').testing, 'assert_allclose', print)": (
        "calls setattr()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "exec('np.testing.assert_allclose = print')": ("calls exec()", {"nb02-ex2", "nb02-ex3"}),
    "!kill -9 $PPID": ("runs the shell command !kill -9 $PPID", {"nb02-ex2", "nb02-ex3"}),
    "globals()['abs'] = lambda x: 0": ("calls globals()", {"nb02-ex2", "nb02-ex3"}),
    "%config IPCompleter.greedy = True": ("runs the magic %config", {"nb02-ex2", "nb02-ex3"}),
    "held = [np.testing]\nheld[0].assert_allclose = print": (
        "rebinds held[0].assert_allclose, which may hold an imported module",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "d = getattr(np.testing, '__di' + 'ct__')\nd['assert_allclose'] = print": (
        "rebinds d['assert_allclose'], which may hold an imported module",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "def off(m=np.testing):\n    m.assert_allclose = print\n\noff()": (
        "rebinds numpy.testing.assert_allclose",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "for m in (np.testing,):\n    m.assert_allclose = print": (
        "rebinds m.assert_allclose, which may hold an imported module",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "put = setattr\nput(np.testing, 'assert_allclose', print)": (
        "uses setattr",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "class C:\n    t = np.testing\n\nC.t.assert_allclose = print": (
        "rebinds C.t.assert_allclose, which may hold an imported module",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "def g():\n    return np.testing\n\ng().assert_allclose = print": (
        "rebinds g().assert_allclose, which may hold an imported module",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "import sys\nsys.path.insert(0, '/tmp')\nimport patch_numpy": (
        "imports patch_numpy, which is not an installed module",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "import pickle\npickle.loads(b'payload')": ("calls pickle.loads()", {"nb02-ex2", "nb02-ex3"}),
    "class Yes(float):\n    def __lt__(self, other):\n        return True\n": (
        "defines __lt__, with which an answer can lie to a check",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "m = (lambda: np)()\nm.testing.assert_allclose = print": (
        "rebinds m.testing.assert_allclose, which may hold an imported module",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "%time np.testing.assert_allclose = print": (
        "rebinds numpy.testing.assert_allclose",
        {"nb02-ex2", "nb02-ex3"},
    ),
}


@pytest.mark.parametrize("attack", ATTACKS, ids=range(len(ATTACKS)))
def test_a_way_to_pass_a_failing_test_is_flagged_and_costs_what_it_could_change(attack):
    what, later = ATTACKS[attack]
    source = read(LOGREG)
    nb = answered(source, {"nb02-ex1": WRONG["nb02-ex1"] + "\n" + attack})
    found = scan(nb, source)
    assert found and all(f.exercise == "nb02-ex1" for f in found), found
    assert what in [f.what for f in found], found
    lost = zeroed(found, nb, source)
    assert set(lost) == {"nb02-ex1"} | later, lost
    assert f"cell {found[0].cell}, line" in lost["nb02-ex1"]


def test_an_attack_in_a_later_solution_leaves_the_earlier_exercises_their_points():
    source = read(LOGREG)
    nb = answered(source, {"nb02-ex2": SECOND["nb02-ex2"] + "\nnp.isclose = lambda *a: True"})
    lost = zeroed(scan(nb, source), nb, source)
    assert set(lost) == {"nb02-ex2", "nb02-ex3"}, lost  # nb02-ex1 ran before it
