"""The package's shape: no import cycles between its modules, and no module too long to read."""
import ast
from pathlib import Path

from helpers.config import REPO_ROOT

HELPERS = REPO_ROOT / "helpers"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    mods = {}
    for path in HELPERS.rglob("*.py"):
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


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycle_between_project_modules():
    assert _cycle(_imports(_modules())) is None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_no_module_is_too_long_to_read():
    long = {str(p.relative_to(REPO_ROOT)): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules (over {MAX_LINES} lines): {long}"
