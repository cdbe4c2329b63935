"""The code's shape: layers that import only downward, no import cycle, no module too long.

The layers, lowest first (README, "Layout"): helpers' top level (config, files, plots), then
helpers.system, helpers.data, helpers.training, helpers.cluster, helpers.sim, helpers.doctor;
tools sit above all of helpers, and bench above tools (a benchmark may time a tool, never the
other way round). A module may import its own layer and the layers below it, never one above.
"""

import ast
from pathlib import Path

from helpers.config import REPO_ROOT

TREES = ("helpers", "tools", "bench")
MAX_LINES = 470  # 400 before ruff format, which grew the same code by 15% (one argument a line)
LAYERS = [  # (module prefix, layer): the longest matching prefix wins
    ("helpers", 0),
    ("helpers.system", 1),
    ("helpers.data", 2),
    ("helpers.training", 3),
    ("helpers.cluster", 4),
    ("helpers.sim", 5),
    ("helpers.doctor", 6),
    ("tools", 7),
    ("bench", 8),
]


def _modules() -> dict[str, Path]:
    mods = {}
    for tree in TREES:
        for path in (REPO_ROOT / tree).rglob("*.py"):
            name = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Project modules each module imports, at module level or inside functions."""
    edges = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges[name] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.module in mods:
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(mods)
                edges[name] |= subs  # `from package import module` needs only the module
                if len(subs) < len(node.names):
                    edges[name].add(node.module)
    return edges


def layer(module: str) -> int:
    """The layer of a module: the one of the longest LAYERS prefix it falls under."""
    found = [(len(p), n) for p, n in LAYERS if module == p or module.startswith(p + ".")]
    assert found, f"{module} is in no layer: add it to LAYERS"
    return max(found)[1]


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports that reach a higher layer."""
    bad = []
    for a, targets in sorted(edges.items()):
        for b in sorted(targets):
            if layer(b) > layer(a):
                bad.append(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})")
    return bad


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycle_in_helpers_tools_or_bench():
    assert _cycle(_imports(_modules())) is None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_every_import_goes_down_the_layers():
    assert upward(_imports(_modules())) == []


def test_the_layer_check_catches_an_upward_import():
    edges = {
        "helpers.data.mnist": {"helpers.training.models"},
        "helpers.config": set(),
        "tools.course.grade": {"bench.workload", "helpers.cluster.run"},
    }
    assert upward(edges) == [
        "helpers.data.mnist (layer 2) imports helpers.training.models (layer 3)",
        "tools.course.grade (layer 7) imports bench.workload (layer 8)",
    ]
    assert layer("helpers.doctor") == 6 and layer("helpers.plots") == 0
    assert layer("helpers.sim.simulator") == 5


def test_no_module_is_too_long_to_read():
    long = {
        str(p.relative_to(REPO_ROOT)): n
        for p in _modules().values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these modules (over {MAX_LINES} lines): {long}"


MAX_FUNCTION_LINES = 80  # a function fits on a screen (the house style: about 40, 80 at most)
FUNCTION_TREES = ("helpers", "tools")


def long_functions(source: str, name: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions (nested ones too) in `source` longer than `limit` lines, as 'name:line f (n)'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                found.append(f"{name}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_no_function_is_longer_than_a_screen():
    found = []
    for name, path in sorted(_modules().items()):
        if name.split(".")[0] in FUNCTION_TREES:
            found += long_functions(path.read_text(), str(path.relative_to(REPO_ROOT)))
    assert not found, f"split these into named parts (over {MAX_FUNCTION_LINES} lines): {found}"


def test_the_length_check_counts_nested_functions():
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    source = f"def outer():\n    def inner():\n    {body.replace(chr(10), chr(10) + '    ')}\n"
    assert [f.split(" ", 1)[1] for f in long_functions(source, "m.py")] == [
        "outer (82 lines)",
        "inner (81 lines)",
    ]
