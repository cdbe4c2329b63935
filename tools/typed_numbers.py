"""Find numbers typed into the lessons' prose: markdown cells, code comments, and the helpers'
docstrings and comments.

A number typed into prose goes stale when the run that produced it is repeated on another day
or machine; a sentence about a measured result must be printed by the code instead. A typed
number is fine when it is
- a setting the code also uses: the same value appears as a literal in the notebook's code
  cells (or, for a helper module, in that module's code): `batch 100` beside `BATCH = 100`;
- a reference: a notebook ("notebook 04", "notebooks 05-07"), an exercise, a section, a
  chapter, a software version ("Keras 3"), a paper's year (1900-2039);
- part of a name or a formula: inside `code`, $math$, a link's address, "2-D", "Doc2Vec";
- generated and checked: the "Expected run time" line (tools/make_index.py writes it from
  notebooks/run_times.json and `--check` fails when it is stale);
- on the allow-list (tools/typed_numbers_allowed.py), each entry with its reason.

`python -m tools.typed_numbers` lists every number nothing above accounts for; the test
(tests/test_typed_numbers.py) fails on any.
"""

from __future__ import annotations

if (
    __name__ == "__main__" and not __package__
):  # run as a file: become `python -m tools.typed_numbers`
    from helpers.system.processes import exec_as_module

    exec_as_module("tools.typed_numbers")

import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from tools.notebooks import NOTEBOOK_DIR, notebook_paths, read

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "helpers"

NUMBER = re.compile(r"(?<![\w.$/+-])[-−]?\d[\d,_]*(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])")
# what prose must not hold a number of: stripped before the scan
MASKS = [
    re.compile(r"\$\$.*?\$\$", re.S),  # display math
    re.compile(r"\$[^$\n]+\$"),  # inline math
    re.compile(r"```.*?```", re.S),  # fenced code
    re.compile(r"`[^`\n]+`"),  # inline code
    re.compile(r"\]\([^)\s]+\)"),  # a link's address
    re.compile(r"https?://\S+"),
    re.compile(r"^\*\*Expected run time:\*\*.*$", re.M),  # generated, checked by make_index
    re.compile(r"\b\d-D\b"),  # 2-D, 3-D
    re.compile(r"\b[\w.-]+/[\w.-]+#\d+"),  # an issue or pull request: keras-team/keras#20585
    re.compile(r"\barXiv:\S+", re.I),
    re.compile(r"\b\d+\.\d+\.\d+\.\d+(?::\d+)?"),  # an address: 10.0.0.2:2222
    re.compile(r"[\w.()|]*[*^][\w.()|*^/]*"),  # a formula written inline: l2/2*w^2
]
# in docstrings and comments, also examples of what a call or a message looks like
EXAMPLE_MASKS = [
    re.compile(r'"[^"\n]*"'),  # a quoted example: "worker:1 (pid 123)"
    re.compile(r"'[^'\n]*'"),
    re.compile(r"--[\w-]+[ =]\S+"),  # a command-line option and its value
    re.compile(r"\b\w+=[^\s,)]+"),  # a keyword argument and its value
]
REFERENCE_BEFORE = re.compile(
    r"(?:notebooks?|lessons?|exercises?|sections?|ch\.|chapters?|python|tf|tensorflow|keras|"
    r"nbformat|gensim|ubuntu|debian|macos|version|figure|eq\.|equation|algorithm|rfc|"
    r"dbpedia-|task|worker|ps)\s*$",
    re.I,
)
NOTEBOOK_NUMBER = re.compile(r"^0\d$")  # "05": the lessons' numbering


@dataclass(frozen=True)
class Typed:
    """A number in prose that nothing accounts for."""

    where: str  # "notebooks/05_parameter_server.ipynb cell 33" or "helpers/compare.py:12"
    number: str
    context: str  # the sentence around it

    def __str__(self) -> str:
        return f"{self.where}: {self.number!r} in {self.context!r}"


def value(text: str) -> float | None:
    """The number a literal or a typed figure stands for ('1,000', '1_000', '2e-3', '−1')."""
    try:
        return float(text.replace(",", "").replace("_", "").replace("−", "-"))
    except ValueError:
        return None


def code_literals(source: str) -> set[float]:
    """Every numeric literal in Python source, f-strings' too (negated ones too), as floats."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            found |= {float(node.value), -float(node.value)}
    return found


def imported_helpers(source: str) -> list[Path]:
    """The helper modules a notebook's code imports (`from helpers.x import y`, and
    `from helpers.x import module`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers"):
            base = ROOT.joinpath(*node.module.split("."))
            for alias in node.names:
                for candidate in (base / f"{alias.name}.py", base.with_suffix(".py")):
                    if candidate.is_file():
                        out.append(candidate)
    return out


def comments_and_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment, and of every docstring, in Python source."""
    out = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return out
    out += [(t.start[0], t.string.lstrip("#")) for t in tokens if t.type == tokenize.COMMENT]
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return out
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                out.append((node.body[0].lineno, doc))
    return out


def _masked(text: str, masks=MASKS) -> str:
    for mask in masks:
        text = mask.sub(lambda m: " " * len(m.group(0)), text)
    return text


def _sentence(text: str, start: int, end: int) -> str:
    """The words around a number, up to 80 characters each side, within its sentence."""
    lo = max(text.rfind(". ", 0, start), text.rfind("\n", 0, start), start - 80) + 1
    ends = [i for i in (text.find(". ", end), text.find("\n", end)) if i >= 0]
    hi = min(ends + [len(text), end + 80])
    return " ".join(text[lo:hi].split())


def _code_line(line: str) -> bool:
    """A docstring's example line: Python that assigns or calls (`cfg = validate(...)`)."""
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:
        return False
    return any(isinstance(n, (ast.Assign, ast.Call)) for n in ast.walk(tree))


def typed_numbers(text: str, settings: set[float], prose: bool = True) -> list[tuple[str, str]]:
    """(number, sentence) of each number in `text` that is not a setting or a reference;
    prose=False for a docstring or comment, whose examples (code lines, quoted strings,
    options) are masked too."""
    if not prose:
        text = "\n".join("" if _code_line(line) else line for line in text.split("\n"))
    masked = _masked(text, MASKS if prose else MASKS + EXAMPLE_MASKS)
    out = []
    for m in NUMBER.finditer(masked):
        raw = m.group(0).rstrip(",")
        v = value(raw)
        before = masked[max(0, m.start() - 24) : m.start()]
        if v is None or NOTEBOOK_NUMBER.match(raw) or 1900 <= v < 2040 and raw.isdigit():
            continue
        if REFERENCE_BEFORE.search(before) and re.fullmatch(r"\d+(?:\.\d+)*", raw):
            continue
        if v in settings or v / 100 in settings and masked[m.end() : m.end() + 2].strip() == "%":
            continue
        out.append((raw, _sentence(text, m.start(), m.end())))
    return out


def scan_notebook(path: Path, root: Path = ROOT) -> list[Typed]:
    nb = read(path)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    settings = set().union(*(code_literals(c) for c in cells))
    for module in {m for c in cells for m in imported_helpers(c)}:
        settings |= code_literals(module.read_text())
    rel = path.relative_to(root)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            if "tags" in cell.metadata and "toc" in cell.metadata["tags"]:
                continue  # the index's generated contents
            pieces = [(f"{rel} cell {i}", cell.source)]
        elif cell.cell_type == "code":
            pieces = [
                (f"{rel} cell {i} line {line}", text)
                for line, text in comments_and_strings(cell.source)
            ]
        else:
            continue
        for where, text in pieces:
            prose = cell.cell_type == "markdown"
            found += [Typed(where, n, s) for n, s in typed_numbers(text, settings, prose)]
    return found


def scan_module(path: Path) -> list[Typed]:
    source = path.read_text()
    settings = code_literals(source)
    rel = path.relative_to(ROOT)
    found = []
    for line, text in comments_and_strings(source):
        found += [Typed(f"{rel}:{line}", n, s) for n, s in typed_numbers(text, settings, False)]
    return found


def scan(notebooks: Path = NOTEBOOK_DIR, helpers: Path = HELPERS) -> list[Typed]:
    found = []
    for path in notebook_paths(notebooks):
        found += scan_notebook(path)
    for path in sorted(helpers.rglob("*.py")):
        found += scan_module(path)
    return found


def main(argv=None) -> int:
    from tools.typed_numbers_allowed import ALLOWED, unaccounted

    left = unaccounted(scan(), ALLOWED)
    for t in left:
        print(t)
    print(f"{len(left)} typed number(s) nothing accounts for", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
