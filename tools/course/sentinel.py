"""The runtime check beside the scan for tampering (tools/course/tamper.py): what the tests
rely on, noted in the student's kernel before the first solution cell runs and checked
before and after each test cell.

The scan reads the student's code; code it cannot follow is flagged, but a path it misses
(a module handed to a function that changes it, a cast that hides it) is not. This check
sees the effect instead, whatever the path: an object a test relies on that is not the one
the lesson had. The grader adds three kinds of cells to the notebook it grades (taken out
again before feedback): a lock before the first solution cell (tools/course/
sentinel_kernel.py, loaded by path, takes the functions it calls before any student code
runs), and a check before and after each test cell, each printing one JSON line.

A change first seen after a test cell happened while that test ran (a function of the
student's it called): that exercise scores 0. A change first seen before a test cell
happened in the cells since the last check: the exercise of the first of the student's cells
there scores 0. Later exercises keep their points only where their tests do not read what
changed; a changed builtin or hook, or a check that did not report (the kernel ended, its
output went elsewhere, the check itself was removed), costs every later exercise.

Its limit: it runs in the student's kernel. Code that reaches the check itself
(`_labs_sentinel`, through the frames or the garbage collector) could silence it; the scan
flags every such path, and a silenced check is a finding.
"""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import nbformat

from helpers.files import atomic_path
from tools.course import tamper
from tools.course.codescan import ANY, _dotted, imports_of, parse
from tools.course.lessons import EXERCISE_ID
from tools.notebooks import grade_id

KERNEL = Path(__file__).with_name("sentinel_kernel.py")
NAME = "_labs_sentinel"  # the check's name in the student's namespace
META = "labs_sentinel"  # a grader's cell's metadata key: its label
LOCK = """\
# Added by the grader (not in the feedback): notes what the tests rely on, to check before and
# after each test that the code above left it as the lesson had it.
{name} = __import__("runpy").run_path({path!r})["lock"]({chains!r}, globals())"""
CHECK = "{name}({label!r})  # the grader's check (not in the feedback)"


def _role(cell) -> str | None:
    return cell.get("metadata", {}).get(META)


def relied_on(source) -> list[str]:
    """The dotted names the tests of `source` (the course's notebook) read, and the lesson
    functions they call (transitively), rooted at names the lesson imports."""
    imported: dict[str, str] = {}
    defs: dict[str, ast.AST] = {}
    trees = []
    for cell in source.cells:
        tree = parse(cell.source) if cell.cell_type == "code" else None
        if tree is None:
            continue
        m = EXERCISE_ID.match(grade_id(cell) or "")
        if m and m.group(2) == "test":
            trees.append(tree)
        elif not m or m.group(2) != "solution":
            imported.update(imports_of(tree))
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defs[node.name] = node
    todo = [n.id for t in trees for n in ast.walk(t) if isinstance(n, ast.Name) and n.id in defs]
    seen = set(todo)
    while todo:
        for n in ast.walk(defs[todo.pop()]):
            if isinstance(n, ast.Name) and n.id in defs and n.id not in seen:
                seen.add(n.id)
                todo.append(n.id)
    chains = set()
    for tree in trees + [defs[n] for n in seen]:
        for node in ast.walk(tree):
            name = _dotted(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
            if name and name.split(".")[0] in imported:
                chains.add(name)
    return sorted(chains)


def _cell(nb, source: str, label: str):
    cell = nbformat.v4.new_code_cell(source, metadata={META: label})
    if (nb.nbformat, nb.nbformat_minor) < (4, 5):
        cell.pop("id", None)  # nbformat 4.4 notebooks have no cell ids
    return cell


def guarded(nb, source):
    """A copy of the student's notebook `nb` with the grader's cells: the lock before the first
    solution cell, a check before and after each test cell after it. `nb` as is when it has
    no solution cell."""
    first = next(
        (i for i, c in enumerate(nb.cells) if (grade_id(c) or "").endswith("-solution")), None
    )
    out = copy.deepcopy(nb)
    if first is None:
        return out
    lock = LOCK.format(name=NAME, path=str(KERNEL), chains=relied_on(source))
    cells = []
    for i, cell in enumerate(out.cells):
        if i == first:
            cells.append(_cell(nb, lock, "lock"))
        m = EXERCISE_ID.match(grade_id(cell) or "")
        test = i > first and m is not None and m.group(2) == "test"
        if test:
            label = m.group(0)
            check = [CHECK.format(name=NAME, label=f"{w} {label}") for w in ("before", "after")]
            cells += [_cell(nb, check[0], f"before {label}"), cell]
            cells.append(_cell(nb, check[1], f"after {label}"))
        else:
            cells.append(cell)
    out.cells = cells
    return out


def student_index(nb, index: int) -> int:
    """A cell's index in the notebook as the student handed it in, from its index in the
    notebook with the grader's cells."""
    return sum(1 for c in nb.cells[:index] if not _role(c))


def _report(cell, label: str) -> dict | None:
    """The check's JSON line in a grader's cell's output, or None when there is none."""
    for output in cell.get("outputs", []):
        if output.get("output_type") != "stream" or output.get("name") != "stdout":
            continue
        for line in output.get("text", "").splitlines():
            try:
                seen = json.loads(line)
            except ValueError:
                continue
            if isinstance(seen, dict) and seen.get("sentinel") == label:
                return seen
    return None


def _spelled(key: str) -> str:
    kind, _, what = key.partition(" ")
    return f"builtin `{what}`" if kind == "builtin" else f"`{what}`"


def _reach(keys: list[str], calls: dict) -> frozenset | None:
    """The names whose tests a change may have changed: ANY for a builtin or hook (library
    code calls them too), else the root names and the notebook functions that read them."""
    if any(not k.startswith(("name ", "code ")) for k in keys):
        return ANY
    roots = {k.split(" ", 1)[1].split(".")[0].split(" ")[0] for k in keys}
    return frozenset().union(*(tamper.reach_of(r, calls) for r in roots))


def _blame(students: dict, start: int, end: int, label: str):
    """(exercise, cell) to blame for a change first seen at the check `label`, among the
    student's cells from `start` to `end` (their indices in the student's notebook)."""
    when, _, test = label.partition(" ")
    owner = test.rsplit("-", 1)[0]
    if when == "after":  # the check right after the test cell: the cell before it
        return owner, end - 1, "while its test ran"
    mine = [i for i in sorted(students) if start <= i < end]
    if mine:
        return students[mine[0]][0], mine[0], f"before the test of {owner}"
    return owner, start, f"in the lesson's cells before the test of {owner}"


def verdicts(autograded: Path, source):
    """Read the grader's cells of an autograded notebook: one finding per check that saw a
    change first (or did not report); the grader's cells are then taken out of the notebook,
    which is written back. Returns (findings, the notebook without them); no grader's cells:
    no finding, nothing written."""
    nb = nbformat.read(str(autograded), as_version=4)
    submitted = copy.copy(nb)
    submitted.cells = [c for c in nb.cells if not _role(c)]
    if len(submitted.cells) == len(nb.cells):
        return [], submitted
    tests = tamper.tests_of(source, submitted)
    sources = {c.source.strip() for c in source.cells if c.cell_type == "code"}
    students = tamper.students_cells(submitted, sources, tests)
    calls = tamper.callers(submitted)
    found, seen, start, here = [], set(), 0, 0
    for cell in nb.cells:
        label = _role(cell)
        if not label:
            here += 1  # the student's cells so far: this check's place in their notebook
            continue
        report = _report(cell, label)
        if report is None:
            exercise, index, when = _blame(students, start, here, label)
            if label == "lock":
                exercise = next((t.exercise for t in tests if t.index >= here), None)
            if exercise is not None:
                what = f"kept the grader's check ({label}) from reporting {when}"
                found.append(tamper.Finding(exercise, index, 0, what, ANY))
            break
        new = [k for k in report.get("changed", []) if k not in seen]
        if new:
            seen.update(new)
            exercise, index, when = _blame(students, start, here, label)
            names = ", ".join(_spelled(k) for k in new[:5])
            more = f" and {len(new) - 5} more" if len(new) > 5 else ""
            what = f"changed {names}{more} {when} (seen by the grader's check)"
            found.append(tamper.Finding(exercise, index, 0, what, _reach(new, calls)))
        start = here
    with atomic_path(autograded) as tmp:
        nbformat.write(submitted, str(tmp))
    return found, submitted
