"""Checks a student's code cannot talk out of: a static scan of every solution cell for what
could make a failing test pass, and which exercises' points it costs.

A test cell runs in the student's kernel after the student's code, so whatever that code
rebinds can turn a failing check into a passing one. Read as text (`ast`, after IPython's own
transformation of magics), nothing run, a solution cell is flagged when it

- rebinds an attribute of anything imported (`np.testing.assert_allclose = ...`,
  `math.isclose = ...`, `sys.excepthook = ...`), directly or through a name bound to it;
- rebinds, at the notebook's top level, a name a later test reads that is not the student's
  answer: a builtin (`abs = ...`) or a name the lesson gave (its imports, helpers, data);
  importing the lesson's module again under the same name is not a rebinding;
- installs a hook or ends the run: `sys.settrace`, `signal.signal`, `atexit`, IPython's
  `get_ipython()` (custom exception handlers, events) and its magics and shell commands,
  `os._exit`, `sys.exit`, `exit()`, or raises `SystemExit` or `KeyboardInterrupt`;
- reaches code the scan cannot follow: `exec`, `eval`, `compile`, `__import__`, `setattr`,
  `globals()`, the `builtins`, `gc`, `ctypes`, `importlib` and `inspect` modules, or
  attributes such as `__dict__`, `__globals__`, `f_back`;
- prints a test's own success message ("... passed").

What it costs (`zeroed`): the exercise whose solution holds it scores 0; exercises before it
keep their points. A later exercise keeps its points only when the scan shows its test cannot
have been changed: the finding rebinds named things and that test reads none of them. A hook,
an end of the run, or code the scan cannot follow costs every later exercise.

Why a static scan: it sees the student's code before it runs, costs milliseconds, and its
verdict does not come from the student's kernel, which the student's code controls. Its
limit is code it cannot follow, and that is flagged rather than trusted. A re-check of each
test in a fresh process would need every value the tests read serialised, most of them
TensorFlow models, runs and clusters. nbgrader and otter-grader have no such check: this is ours.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from tools.course.codescan import ANY, CellScan, imports_of, parse
from tools.course.lessons import EXERCISE_ID
from tools.exercises import prompt_names
from tools.notebooks import grade_id


@dataclass(frozen=True)
class Finding:
    """One thing in a solution cell that could change a check's verdict."""

    exercise: str  # whose solution cell holds it
    cell: int  # the cell's index in the notebook
    line: int  # its line in the cell (from 1)
    what: str  # what it does, as the report says it
    reach: frozenset | None  # names whose tests it may change; ANY: every later test


def _shallow(node):
    """The nodes of a top-level statement, not descending into functions, classes, lambdas
    and comprehensions (their names are their own) but yielding the definitions themselves."""
    yield node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return
    for child in ast.iter_child_nodes(node):
        yield from _shallow(child)


def _top_bindings(tree) -> dict[str, ast.AST]:
    """Names a cell binds at its top level, or through `global`: name -> the binding node."""
    out: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            for name in node.names:
                out.setdefault(name, node)
    for stmt in tree.body:
        for sub in _shallow(stmt):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.setdefault(sub.name, sub)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                out.setdefault(sub.id, sub)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                for a in sub.names:
                    out.setdefault(a.asname or a.name.split(".")[0], sub)
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                out.setdefault(sub.name, sub)
    return out


@dataclass(frozen=True)
class Test:
    """An exercise's test cell: where it is, and the names it reads that are not its answer."""

    exercise: str
    index: int
    reads: frozenset


def tests_of(source, submitted=None) -> list[Test]:
    """Every test cell of the course's source notebook (hidden tests included), in order, at
    its place in `submitted` (the student's notebook) when given."""
    place = {grade_id(c): j for j, c in enumerate((submitted or source).cells)}
    prompts = {}
    out = []
    for i, cell in enumerate(source.cells):
        m = EXERCISE_ID.match(grade_id(cell) or "")
        if not m:
            continue
        if m.group(2) == "prompt":
            prompts[m.group(1)] = prompt_names(cell.source)
        elif m.group(2) == "test":
            tree = parse(cell.source)
            if tree is None:
                continue
            loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            own = {
                n.id
                for n in ast.walk(tree)
                if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))
            }
            own |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}  # lambdas' too
            reads = frozenset(loads - own - prompts.get(m.group(1), set()))
            out.append(Test(m.group(1), place.get(grade_id(cell), i), reads))
    return out


def callers(nb) -> dict[str, set]:
    """Name -> the functions and classes defined at the top level of the notebook's code cells
    whose code reads that name as a global: what a rebinding reaches beyond the name itself."""
    out: dict[str, set] = {}
    for cell in nb.cells:
        tree = parse(cell.source) if cell.cell_type == "code" else None
        for node in tree.body if tree is not None else []:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            names = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
            local = {n.id for n in names if isinstance(n.ctx, (ast.Store, ast.Del))}
            local |= {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
            for n in names:
                if isinstance(n.ctx, ast.Load) and n.id not in local:
                    out.setdefault(n.id, set()).add(node.name)
    return out


def reach_of(name: str, calls: dict[str, set]) -> frozenset:
    """`name` and every notebook function that reads it, directly or through another."""
    seen, todo = {name}, [name]
    while todo:
        for f in calls.get(todo.pop(), ()):
            if f not in seen:
                seen.add(f)
                todo.append(f)
    return frozenset(seen)


def scan(submitted, source) -> list[Finding]:
    """What the solution cells of `submitted` (a student's notebook, its nbgrader cells in
    the release's order) do that could change a check's verdict, read against the course's
    `source` notebook (its lesson code, reference solutions and hidden tests)."""
    imported: dict[str, str] = {}
    reference: dict[str, set] = {}
    for cell in source.cells:
        tree = parse(cell.source) if cell.cell_type == "code" else None
        if tree is None:
            continue
        if (grade_id(cell) or "").endswith("-solution"):
            reference[grade_id(cell)] = set(_top_bindings(tree))
        imported.update(imports_of(tree))
    lesson = dict(imported)
    tests = tests_of(source, submitted)
    trees = {}
    for i, cell in enumerate(submitted.cells):
        m = EXERCISE_ID.match(grade_id(cell) or "")
        if m and m.group(2) == "solution" and cell.cell_type == "code":
            trees[i] = (m.group(1), parse(cell.source))
    own = {
        name
        for _, tree in trees.values()
        if tree is not None
        for name, node in _top_bindings(tree).items()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    found, calls = [], callers(submitted)
    for i, (exercise, tree) in trees.items():
        if tree is None:  # a syntax error fails by itself
            continue
        visitor = CellScan(imported, own)
        visitor.visit(tree)
        imported = visitor.imported
        found += [Finding(exercise, i, line, what, reach) for line, what, reach in visitor.found]
        readers = [t for t in tests if t.index > i]
        mine = reference.get(f"{exercise}-solution", set())
        for name, node in _top_bindings(tree).items():
            reach = reach_of(name, calls)
            by = [t.exercise for t in readers if reach & t.reads]
            if not by or name in mine:
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)) and name in lesson:
                again = imports_of(ast.Module(body=[node], type_ignores=[]))
                if again.get(name) == lesson[name]:
                    continue  # `import numpy as np` again: the same module
            what = f"rebinds `{name}`, which the test of {by[0]} reads"
            found.append(Finding(exercise, i, node.lineno, what, reach))
    return found


def zeroed(findings: list[Finding], submitted, source) -> dict[str, str]:
    """Exercise -> why it scores 0: the one whose solution holds a finding, and each later
    one whose test the finding may have changed (every later one, for a hook, an end of the
    run or code the scan cannot follow). Earlier exercises keep their points."""
    out: dict[str, str] = {}
    for f in findings:
        where = f"cell {f.cell}, line {f.line}"
        out.setdefault(f.exercise, f"its solution {f.what} ({where})")
        for t in tests_of(source, submitted):
            if t.index <= f.cell or t.exercise == f.exercise:
                continue
            if f.reach is ANY or f.reach & t.reads:
                why = "may have changed any later check" if f.reach is ANY else "its test reads"
                out.setdefault(
                    t.exercise, f"{f.exercise}'s solution {f.what} ({where}), which {why}"
                )
    return out


FLAG = "tampering: "  # how a note about a finding starts (report.txt, report.json)
FLAG_NOTE = re.compile(
    r"^tampering: (?P<exercise>\S+) cell (?P<cell>\d+) line (?P<line>\d+): (?P<what>.*); "
    r"scores 0: (?P<zeroed>.*)$"
)


def flag_notes(findings: list[Finding], submitted, source) -> list[tuple[str, dict]]:
    """Each finding as a report note, with the exercises it costs and why (for the gradebook);
    FLAG_NOTE reads a note back (flagged.csv)."""
    out = []
    for f in findings:
        lost = zeroed([f], submitted, source)
        note = f"{FLAG}{f.exercise} cell {f.cell} line {f.line}: {f.what}; scores 0: "
        out.append((note + ", ".join(lost), lost))
    return out
