"""The exercises of a lesson and what their tests may read: each exercise's contract.

An exercise is a prompt (markdown), a solution cell and a test cell, told apart by nbgrader
grade ids `nbNN-exK-prompt`, `-solution` and `-test`. Its test may read only

- names the test cell binds itself,
- names the prompt asks the student to define (the leading name of a `backticked` span), and
- names bound before the test outside every solution region, and never rebound inside one
  (a student's answer written another way need not define, or may define differently,
  whatever the reference solution binds).

`contract_violations()` lists the breaches; tests/test_exercise_contract.py runs it on every
lesson. The checks read the code as text (`ast`): nothing is run.
"""

from __future__ import annotations

import ast
import builtins
import re
import textwrap
from dataclasses import dataclass, field

from tools.course.lessons import EXERCISE_ID
from tools.notebooks import grade_id, parse_code, read

SOLUTION = re.compile(
    r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION[^\n]*$", re.S | re.M
)
BACKTICKS = re.compile(r"`([^`]+)`")
BUILTINS = set(dir(builtins))


@dataclass
class Exercise:
    """One exercise of a lesson: its prompt's names, its solution and test cells' positions."""

    id: str
    prompt: str = ""
    solution_index: int | None = None
    test_index: int | None = None
    asked: set[str] = field(default_factory=set)  # names the prompt names in backticks


def prompt_names(markdown: str) -> set[str]:
    """The leading identifier of every `backticked` span: `f(a, b)` -> f, `t["x"]` -> t."""
    out = set()
    for span in BACKTICKS.findall(markdown):
        m = re.match(r"\s*([A-Za-z_]\w*)", span)
        if m:
            out.add(m.group(1))
    return out


def solution_regions(source: str) -> list[tuple[str, str]]:
    """(indent, code) of each BEGIN/END SOLUTION region of a cell's source."""
    return [(m.group(1), m.group(2)) for m in SOLUTION.finditer(source)]


def without_solutions(source: str) -> str:
    """The source as a student receives it: each solution region becomes one `raise`."""
    return SOLUTION.sub(lambda m: f"{m.group(1)}raise NotImplementedError()", source)


class _Bindings(ast.NodeVisitor):
    """Names a piece of code binds at module level (not inside functions, classes, lambdas)."""

    def __init__(self):
        self.names: set[str] = set()

    def visit_Name(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.names.add(node.id)

    def visit_FunctionDef(self, node):
        self.names.add(node.name)
        for d in node.decorator_list:
            self.visit(d)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.names.add(node.name)
        for expr in [*node.bases, *node.decorator_list]:
            self.visit(expr)

    def visit_Lambda(self, node):
        pass

    def _comprehension(self, node):
        pass  # its variables are its own scope; a walrus inside is too rare to follow

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_alias(self, node):
        if node.name != "*":
            self.names.add(node.asname or node.name.split(".")[0])

    def visit_ExceptHandler(self, node):
        if node.name:
            self.names.add(node.name)
        self.generic_visit(node)


def module_bindings(code: str) -> set[str]:
    """Names `code` binds at module level."""
    visitor = _Bindings()
    visitor.visit(parse_code(code))
    return visitor.names


def reads_and_binds(code: str) -> tuple[set[str], set[str]]:
    """(names read, names bound at any depth) of `code`, function arguments included."""
    tree = parse_code(code)
    read_, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read_ if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read_, bound


def exercises(nb) -> dict[str, Exercise]:
    """The exercises of a notebook, by id (`nb02-ex3`), in order."""
    out: dict[str, Exercise] = {}
    for i, cell in enumerate(nb.cells):
        m = EXERCISE_ID.match(grade_id(cell) or "")
        if not m:
            continue
        ex = out.setdefault(m.group(1), Exercise(m.group(1)))
        if m.group(2) == "prompt":
            ex.prompt, ex.asked = cell.source, prompt_names(cell.source)
        elif m.group(2) == "solution":
            ex.solution_index = i
        else:
            ex.test_index = i
    return out


def test_reads(nb, ex: Exercise) -> set[str]:
    """The names an exercise's test cell reads from the notebook (not its own, not builtins)."""
    read_, bound = reads_and_binds(nb.cells[ex.test_index].source)
    return read_ - bound - BUILTINS


def contract_violations(path) -> list[str]:
    """Each test read that breaks its exercise's contract, as 'nbNN-exK: reads `x`, which ...'."""
    nb = read(path)
    problems = []
    for ex in exercises(nb).values():
        if ex.test_index is None or ex.solution_index is None or not ex.prompt:
            problems.append(f"{ex.id}: needs a prompt, a solution and a test cell")
            continue
        outside: set[str] = set()
        inside: dict[str, str] = {}  # name -> the (first) solution cell that binds it
        for cell in nb.cells[: ex.test_index]:
            if cell.cell_type != "code":
                continue
            outside |= module_bindings(without_solutions(cell.source))
            for indent, code in solution_regions(cell.source):
                if indent:  # a function's or class's body: its names are local
                    continue
                gid = grade_id(cell) or "a solution"
                for name in module_bindings(textwrap.dedent(code)):
                    inside.setdefault(name, gid)
        own = f"{ex.id}-solution"
        for name in sorted(test_reads(nb, ex)):
            if name in inside and inside[name] != own:
                problems.append(
                    f"{ex.id}: reads `{name}`, which {inside[name]} binds: a "
                    f"test must not depend on another exercise's answer"
                )
            elif name in ex.asked:
                continue
            elif name in inside:
                problems.append(
                    f"{ex.id}: reads `{name}`, which only {inside[name]} binds: "
                    f"ask for it in the prompt or compute it outside the solution"
                )
            elif name not in outside:
                problems.append(
                    f"{ex.id}: reads `{name}`, which nothing before the test "
                    f"binds outside a solution"
                )
    return problems
