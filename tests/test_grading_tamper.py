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
    "its own object's attributes, set from a module's functions": "class Net:\n"
    "    def __init__(self, **kw):\n        self.act = np.tanh\n        self.w = 0.0\n"
    "        for k, v in kw.items():\n            setattr(self, k, v)\n\nnet = Net(b=1)\n",
    "a table of optimizers": "opts = {}\nopts['sgd'] = keras.optimizers.SGD\n"
    "opts['adam'] = keras.optimizers.Adam\n",
    "display options and memory": "import pandas as pd\npd.options.display.max_columns = None\n"
    "import gc\ngc.collect()\nimport inspect\ninspect.signature(print)\n",
    "events ordered in a heap": "import heapq\n\nclass Event:\n    def __init__(self, t):\n"
    "        self.t = t\n\n    def __lt__(self, other):\n        return self.t < other.t\n\n"
    "heap = [Event(2), Event(1)]\nheapq.heapify(heap)\n",
    "keras through tensorflow": "from tensorflow import keras\n",
    "output captured": "%%capture\nprint('quiet')\n",
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
        "defines __lt__ in class Yes, an answer that can lie",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "getattr(np.testing, '__dict__')['assert_allclose'] = print": (
        "reaches .__dict__ through getattr()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "getattr(np.testing, '__dict__').update(assert_allclose=print)": (
        "reaches .__dict__ through getattr()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "import sys\ngetattr(sys, 'settrace')(print)": (
        "calls sys.settrace()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "import os\nos.sys.settrace(print)": ("calls os.sys.settrace()", {"nb02-ex2", "nb02-ex3"}),
    "t = np.array([np.testing], dtype=object)[0]\nt.assert_allclose = print": (
        "rebinds t.assert_allclose, which may hold an imported module",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "import timeit\ntimeit.timeit('import numpy; numpy.testing.assert_allclose = print')": (
        "calls timeit.timeit()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    '%timeit -n1 -r1 -s "np.testing.assert_allclose = print" pass': (
        "runs %timeit with '-n1 -r1 -s \"np.testing.assert_allclose =', unread",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "class Ans(float):\n    __sub__ = lambda s, o: 0.0\n": (
        "defines __sub__ in class Ans, an answer that can lie",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "class Ans:\n    pass\n\nAns.__lt__ = lambda s, o: True": (
        "rebinds Ans.__lt__, a protocol an answer can lie with",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "r = 0.5\nr.__class__.__abs__ = print": (
        "rebinds r.__class__.__abs__, a protocol an answer can lie with",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "type(np.float64(1)).sqrt = print": (
        "rebinds type(np.float64(1)).sqrt, a class reached through type()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "class Stop(SystemExit):\n    pass\n\nraise Stop()": ("raises Stop", set()),
    "[abs := (lambda x: 0) for _ in 'x']": (
        "rebinds `abs`, which the test of nb02-ex1 reads",
        {"nb02-ex3"},
    ),
    "import sys\nsys.path[0] = '/tmp'": ("rebinds sys.path", {"nb02-ex2", "nb02-ex3"}),
    "import types\nkeras = types.SimpleNamespace()": (
        "rebinds `keras`, which the test of nb02-ex1 reads",
        {"nb02-ex3"},  # Exercise 3 builds the model with keras
    ),
    "m = (lambda: np)()\nm.testing.assert_allclose = print": (
        "rebinds m.testing.assert_allclose, which may hold an imported module",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "%time np.testing.assert_allclose = print": (
        "rebinds numpy.testing.assert_allclose",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "abs.__self__.abs = lambda x: 0": ("reaches .__self__", {"nb02-ex2", "nb02-ex3"}),  # builtins
    "import typing\ntyping.cast(object, np.testing).assert_allclose = print": (
        "hands the module numpy.testing to typing.cast()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "def off(m):\n    m.assert_allclose = print\n\n\nlist(map(off, [np.testing]))": (
        "hands the module numpy.testing to map()",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "class Box:\n    pass\n\n\nbox = Box()\nbox.m = np.testing\nbox.m.assert_allclose = print": (
        "stores the module numpy.testing in box.m",
        {"nb02-ex2", "nb02-ex3"},
    ),
    "np.testing.assert_allclose.__defaults__ = (1e9,)": (
        "reaches .__defaults__",
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


def test_a_cell_the_student_added_or_a_lesson_cell_they_edited_is_read_too():
    """nbgrader puts back only the cells it tracks: an added cell, or lesson code edited, runs
    as the student wrote it. Each is counted against the first exercise whose test follows."""
    source = read(LOGREG)
    nb = answered(source, {"nb02-ex1": WRONG["nb02-ex1"]})
    at = exercises.exercises(nb)["nb02-ex1"].solution_index
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell("np.testing.assert_allclose = print"))
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i > 2)
    nb.cells[first_code].source += "\nabs = lambda x: 0"
    found = {(f.cell, f.exercise, f.what) for f in scan(nb, source)}
    assert (at + 1, "nb02-ex1", "rebinds numpy.testing.assert_allclose") in found, found
    assert any(c == first_code and "rebinds `abs`" in w for c, _, w in found), found


def test_a_module_kept_in_one_solution_and_used_in_a_later_one_is_followed():
    source = read(LOGREG)
    nb = answered(
        source,
        {
            "nb02-ex2": SECOND["nb02-ex2"] + "\n_keep = [math]",
            "nb02-ex3": SECOND["nb02-ex3"] + "\n_keep[0].sqrt = lambda x: 1.0",
        },
    )
    found = scan(nb, source)
    assert [(f.exercise, f.what) for f in found] == [
        ("nb02-ex3", "rebinds _keep[0].sqrt, which may hold an imported module")
    ], found


def test_a_lesson_object_a_later_test_reads_changed_in_a_solution_is_flagged():
    source = read(NOTEBOOK_DIR / "07_fault_tolerance.ipynb")
    nb = answered(source, {"nb07-ex1": WRONG["nb07-ex1"] + "\nresumed._events = None"})
    found = [(f.exercise, f.what) for f in scan(nb, source)]
    assert ("nb07-ex1", "changes resumed._events, which the lesson made") in found, found
