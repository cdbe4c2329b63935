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
limit is code it cannot follow, and that is flagged rather than trusted; a path it does not
see at all (a module it cannot tell is one, handed to `map()`) is left to the runtime check
beside it (tools/course/sentinel.py), which sees what changed instead. A re-check of each
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
            elif isinstance(sub, (ast.MatchAs, ast.MatchStar)) and sub.name:
                out.setdefault(sub.name, sub)  # `case abs:` binds abs
    for node in ast.walk(tree):  # a walrus binds in the enclosing scope, even in a comprehension
        if isinstance(node, ast.NamedExpr) and not _in_function(tree, node):
            out.setdefault(node.target.id, node)
    return out


def _in_function(tree, target) -> bool:
    """Whether `target` sits inside a function, lambda or class of `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            if any(n is target for n in ast.walk(node)):
                return True
    return False


@dataclass(frozen=True)
class Test:
    """An exercise's test cell: where it is, and the names it reads that are not its answer."""

    exercise: str
    index: int
    reads: frozenset  # every name its cell reads and does not bind itself
    asked: frozenset  # the names its prompt asks the student to define


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
            asked = frozenset(prompts.get(m.group(1), set()))
            out.append(
                Test(m.group(1), place.get(grade_id(cell), i), frozenset(loads - own), asked)
            )
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


def _lesson_of(source):
    """From the course's source notebook: its imports (name -> module), the names its lesson
    code binds, each reference solution's top-level names, and its code cells' sources."""
    imported: dict[str, str] = {}
    lesson: set[str] = set()
    reference: dict[str, set] = {}
    sources: set[str] = set()
    for cell in source.cells:
        tree = parse(cell.source) if cell.cell_type == "code" else None
        if tree is None:
            continue
        sources.add(cell.source.strip())
        gid = grade_id(cell) or ""
        if gid.endswith("-solution"):  # what it binds, and the objects it changes (roots)
            reference[gid] = set(_top_bindings(tree)) | _store_roots(tree)
        else:
            lesson |= set(_top_bindings(tree))
        imported.update(imports_of(tree))
    return imported, lesson, reference, sources


def _store_roots(tree) -> set[str]:
    """The names whose objects a piece of code changes: roots of attribute and item stores."""
    out = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            while isinstance(t, (ast.Attribute, ast.Subscript)):
                t = t.value
            if isinstance(t, ast.Name):
                out.add(t.id)
    return out


def students_cells(submitted, sources: set[str], tests: list[Test]) -> dict:
    """Index -> (exercise, tree) of every code cell the student's code runs in: the solution
    cells, and any other code cell that is not the lesson's as released (added, or edited:
    nbgrader puts back only the cells it tracks), counted against the first exercise whose
    test runs after it. Cells no test runs after cannot change a verdict."""
    out = {}
    for i, cell in enumerate(submitted.cells):
        if cell.cell_type != "code":
            continue
        m = EXERCISE_ID.match(grade_id(cell) or "")
        if m and m.group(2) == "solution":
            out[i] = (m.group(1), parse(cell.source))
        elif grade_id(cell) is None and cell.source.strip() not in sources:
            owner = next((t.exercise for t in tests if t.index > i), None)
            if owner is not None:
                out[i] = (owner, parse(cell.source))
    return out


def scan(submitted, source) -> list[Finding]:
    """What the student's code cells of `submitted` (a student's notebook, its nbgrader cells
    in the release's order) do that could change a check's verdict, read against the course's
    `source` notebook (its lesson code, reference solutions and hidden tests)."""
    imported, lesson, reference, sources = _lesson_of(source)
    tests = tests_of(source, submitted)
    answers = set().union(*(t.asked for t in tests)) - lesson  # the names prompts ask for
    cells = {i: c for i, c in students_cells(submitted, sources, tests).items() if c[1]}
    own = {
        name
        for _, tree in cells.values()
        for name, node in _top_bindings(tree).items()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    # two passes: what a later cell binds to a module is known when an earlier one is read
    visitor = CellScan(imported, own, lesson=lesson - answers)
    for _, tree in cells.values():
        visitor.visit(tree)
    tainted, found, calls = visitor.tainted, [], callers(submitted)
    visitor = CellScan(imported, own, tainted, lesson - answers)
    for i, (exercise, tree) in cells.items():
        visitor.found = []
        visitor.visit(tree)
        readers = [t for t in tests if t.index > i]
        mine = reference.get(f"{exercise}-solution", set())
        for line, what, reach in visitor.found:
            if what.startswith("changes ") and (
                reach & mine  # the exercise asks for this object to be changed
                or not any(reach_of(n, calls) & t.reads for n in reach for t in readers)
            ):
                continue  # or no later test reads it
            found.append(Finding(exercise, i, line, what, reach))
        mine = mine | answers
        for name, node in _top_bindings(tree).items():
            reach = reach_of(name, calls)
            by = [t.exercise for t in readers if reach & t.reads]
            if not by or name in mine or _same_import(node, name, imported):
                continue
            what = f"rebinds `{name}`, which the test of {by[0]} reads"
            found.append(Finding(exercise, i, node.lineno, what, reach))
    return found


def _same_import(node, name: str, lesson_imports: dict) -> bool:
    """Whether a binding is the lesson's own import again (`import numpy as np`; `from
    tensorflow import keras` for `import keras`: the same last name)."""
    if not isinstance(node, (ast.Import, ast.ImportFrom)) or name not in lesson_imports:
        return False
    again = imports_of(ast.Module(body=[node], type_ignores=[])).get(name, "")
    return again.split(".")[-1] == lesson_imports[name].split(".")[-1]


def zeroed(findings: list[Finding], submitted, source) -> dict[str, str]:
    """Exercise -> why it scores 0: the one whose solution holds a finding, and each later
    one whose test the finding may have changed (every later one, for a hook, an end of the
    run or code the scan cannot follow). Earlier exercises keep their points."""
    out: dict[str, str] = {}
    tests = tests_of(source, submitted)
    for f in findings:
        where = f"cell {f.cell}, line {f.line}" if f.line else f"cell {f.cell}"
        out.setdefault(f.exercise, f"its solution {f.what} ({where})")
        for t in tests:
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
    r"^tampering: (?P<exercise>\S+) cell (?P<cell>\d+)(?: line (?P<line>\d+))?: (?P<what>.*); "
    r"scores 0: (?P<zeroed>.*)$"
)


def flag_notes(findings: list[Finding], submitted, source) -> list[tuple[str, dict]]:
    """Each finding as a report note, with the exercises it costs and why (for the gradebook);
    FLAG_NOTE reads a note back (flagged.csv)."""
    out = []
    for f in findings:
        lost = zeroed([f], submitted, source)
        what = f.what.replace("\n", "\\n")  # one line each: flagged.csv reads them back
        line = f" line {f.line}" if f.line else ""  # 0: seen when it ran (sentinel.py)
        note = f"{FLAG}{f.exercise} cell {f.cell}{line}: {what}; scores 0: "
        out.append((note + ", ".join(lost), lost))
    return out
