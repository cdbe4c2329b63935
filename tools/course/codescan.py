"""The reading half of the scan for tampering (tools/course/tamper.py): one cell's code, as
IPython runs it, walked with `ast` for what could change a check's verdict. Each finding is
(line, what it does, reach): reach is ANY when every later test may have been changed, else the
names whose tests it can change. Nothing is run."""

from __future__ import annotations

import ast
import builtins
import functools
import re

from tools.course.installed import installed, is_module
from tools.notebooks import parse_code

ANY = None  # a finding's reach when every later test may have been changed
CALLS = {"exec", "eval", "compile", "__import__", "globals", "locals", "vars", "setattr"}
CALLS |= {"delattr", "get_ipython", "exit", "quit", "breakpoint"}
DOTTED = re.compile(
    r"^(os\.(_exit|kill|killpg|abort|system|popen|exec\w*|spawn\w*|fork\w*)|"
    r"sys\.(exit|settrace|setprofile|_getframe|addaudithook|setrecursionlimit)|"
    r"threading\.(settrace|setprofile)\w*|signal\.\w+|atexit\.\w+|faulthandler\.\w+|"
    r"subprocess\.\w+|pty\.\w+|importlib\.\w+|ctypes\.\w+|"
    r"IPython\.\w+|ipykernel\.\w+|builtins\.\w+|runpy\.\w+|sys\.path\.\w+|site\.\w+|"
    r"pkgutil\.\w+|zipimport\.\w+|copyreg\.\w+|marshal\.\w+|pickle\.(loads?|Unpickler)|"
    r"types\.(FunctionType|CodeType|LambdaType|ModuleType)|gc\.get_\w+|"
    r"inspect\.(currentframe|stack|getouterframes|getinnerframes|trace)|timeit\.\w+|"
    r"code\.\w+|cProfile\.\w+|profile\.\w+|pdb\.\w+|doctest\.\w+|trace\.\w+|"
    r"pandas\.read_pickle|dill\.\w+|cloudpickle\.\w+|joblib\.load)$"
)
MODULES = {"builtins", "ctypes", "importlib", "IPython", "ipykernel", "code", "pdb"}
MODULES |= {"__main__", "faulthandler", "pty", "subprocess", "runpy", "site", "marshal"}
# stores into these are settings, not the library's code: pd.options.display.max_columns = None
SAFE_STORES = re.compile(r"^(pandas\.options\.|matplotlib\.rcParams)")
# an answer object that can lie to a check: comparisons with arithmetic, truth, numbers,
# numpy's protocols. A class with comparisons alone (ordering events in a heap) is honest.
COMPARES = {"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"}
LIARS = {"__bool__", "__abs__", "__float__", "__int__", "__index__", "__round__", "__complex__"}
LIARS |= {"__array__", "__array_ufunc__", "__array_function__", "__instancecheck__"}
LIARS |= {"__subclasscheck__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__"}
LIARS |= {"__rmul__", "__truediv__", "__rtruediv__", "__neg__", "__pow__", "__sub__"}
VALUES = {"float", "int", "complex", "str", "bool", "tuple", "list", "dict", "set", "frozenset"}
ATTRS = {"__dict__", "__globals__", "__builtins__", "__code__", "__closure__", "__subclasses__"}
ATTRS |= {"__bases__", "__mro__", "__getattribute__", "__setattr__", "__delattr__", "f_back"}
ATTRS |= {"f_globals", "f_locals", "f_builtins", "tb_frame", "gi_frame", "cr_frame", "modules"}
ATTRS |= {"excepthook", "displayhook", "stdout", "stderr", "stdin"}  # sys's, when assigned
ATTRS |= {"__self__", "__objclass__", "__defaults__", "__kwdefaults__"}  # abs.__self__: builtins
# calls that only look at a module handed to them; any other call may change it out of sight
VIEWERS = {"print", "repr", "str", "dir", "help", "type", "id", "isinstance", "hasattr"}
VIEWERS |= {"callable", "getattr", "sorted", "len"}
ENDS = {"SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseException"}
PASSED = re.compile(r"\bexercise\s+\d+\s+passed\b", re.I)  # a test's own line
SAFE_MAGICS = {"time", "timeit", "matplotlib", "capture"}
BUILTIN_NAMES = set(dir(builtins))


SELF = {"self", "cls"}  # setattr(self, name, value) in a class of one's own is honest
REACHED = {"sys", "os", "builtins", "importlib", "signal", "subprocess"}  # os.sys.settrace too
MUTATORS = {"update", "setdefault", "__setitem__", "__delitem__", "pop", "popitem", "clear"}


def _getattr_dotted(node) -> str | None:
    """'sys.settrace' for getattr(sys, "settrace"), else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
    ):
        base = _dotted(node.args[0])
        return f"{base}.{node.args[1].value}" if base else None
    return None


def python_of(source: str) -> str:
    """A cell's source as the kernel runs it: IPython's magics and `!` commands become calls
    (get_ipython().run_line_magic(...), .system(...)), which the scan then sees."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def _dotted(node) -> str | None:
    """'np.testing.assert_allclose' for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _is_ipython(node) -> bool:
    """Whether `node` is the call get_ipython()."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "get_ipython"
    )


def _root(node) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def imports_of(tree) -> dict[str, str]:
    """Name -> the dotted name it was imported as (`np` -> numpy, `isclose` -> math.isclose)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


@functools.lru_cache(maxsize=1024)  # each cell is read by several passes: parse it once
def parse(source: str):
    try:
        return parse_code(python_of(source))
    except (SyntaxError, ValueError):  # it fails on its own; nothing to follow
        return None


class CellScan(ast.NodeVisitor):
    """The findings of one solution cell; `imported` maps names to what they were imported as
    (the lesson's imports and this cell's), `own` the functions solutions define."""

    def __init__(self, imported: dict, own: set[str], tainted=(), lesson=()):
        self.imported, self.own = dict(imported), own
        self.imports = set(imported)  # names bound by an import statement
        self.tainted: set[str] = set(tainted)  # names that may hold a module or a part of one
        self.lesson = set(lesson)  # names the lesson's own code binds (its objects, data)
        self.ends: set[str] = set()  # classes of its own that end the run (SystemExit's kind)
        self.found: list[tuple[int, str, frozenset | None]] = []

    def holds(self, node) -> bool:
        """Whether an expression may evaluate to something imported or a part of it (a
        module, its functions): `np.testing`, `[np]`, `getattr(np, 'x')`, `(lambda: np)()`;
        not the result of calling it (`np.array(...)`, `tf.keras.Sequential(...)`)."""
        if node is None:
            return False
        chain = _dotted(node)
        if chain is not None:
            return chain.split(".")[0] in self.imported or chain.split(".")[0] in self.tainted
        if isinstance(node, ast.Call):
            called = _dotted(node.func)
            if called and called.split(".")[0] in self.tainted - set(self.imported):
                return True  # g() where g returns a module, C.t() on a class holding one
            if called and called.split(".")[0] in self.imported:
                # what a library returns is its data (np.zeros(..., dtype=np.int8)), unless a
                # module went in inside a container: np.array([np.testing], dtype=object)
                held = [a for a in node.args if not isinstance(a, (ast.Name, ast.Attribute))]
                return any(self.holds(a) for a in held)
            parts = [*node.args, *(k.value for k in node.keywords)]
            if called is None:
                parts.append(node.func)
            return any(self.holds(p) for p in parts)
        if isinstance(node, ast.Lambda):
            return self.holds(node.body)
        return any(self.holds(c) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr))

    def module_in(self, node) -> str | None:
        """The module `node` is or holds in a literal (`math`, `np.testing`, `[math]`,
        `{"m": math}`), reached from a name an import statement bound, as imported; else None.
        (A module bound to a name by assignment is followed by the taint and, past that, by
        the runtime check, tools/course/sentinel.py.)"""
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return next(filter(None, map(self.module_in, node.elts)), None)
        if isinstance(node, ast.Dict):
            return next(filter(None, map(self.module_in, node.values)), None)
        if isinstance(node, ast.Starred):
            return self.module_in(node.value)
        chain = _dotted(node)
        if chain is None or chain.split(".")[0] not in self.imports:
            return None
        full = self.resolve(chain)
        return full if is_module(full) else None

    def taint(self, target, value) -> None:
        """Names in `target` bound from `value`: held modules are followed."""
        if not self.holds(value):
            return
        names = [target]
        while names:  # the names bound (a, (b, *c)), not a container stored into (self.x)
            n = names.pop()
            if isinstance(n, ast.Name):
                self.tainted.add(n.id)
            elif isinstance(n, (ast.Tuple, ast.List)):
                names += n.elts
            elif isinstance(n, ast.Starred):
                names.append(n.value)
        chain = _dotted(value)
        if isinstance(target, ast.Name) and chain and chain.split(".")[0] in self.imported:
            self.imported[target.id] = self.resolve(chain)  # `t = np.testing`: an alias

    def add(self, node, what, reach=ANY):
        self.found.append((getattr(node, "lineno", 1), what, reach))

    def resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        base = self.imported.get(head)
        return f"{base}.{rest}".rstrip(".") if base else dotted

    def target(self, node, verb: str):
        """An assignment's or deletion's target: attributes of anything imported."""
        if isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                self.target(elt, verb)
            return
        if isinstance(node, ast.Starred):
            return self.target(node.value, verb)
        if not isinstance(node, (ast.Attribute, ast.Subscript)):
            return
        root, text = _root(node), ast.unparse(node)
        if isinstance(node, ast.Attribute) and (
            node.attr in LIARS | COMPARES or "__class__" in text
        ):
            return self.add(node, f"{verb} {text}, a protocol an answer can lie with")
        if isinstance(root, ast.Name) and root.id == "type" and isinstance(node, ast.Attribute):
            return self.add(node, f"{verb} {text}, a class reached through type()")
        direct = isinstance(root, ast.Name) and root.id in self.imported and _dotted(node.value)
        if direct:
            name = self.resolve(_dotted(node) or _dotted(node.value) or text)
            if SAFE_STORES.match(name):
                return
            if isinstance(node, ast.Subscript) and not re.search(
                r"\b(modules|path|meta_path|path_hooks|__dict__|__builtins__)\b", text
            ):
                return  # plt.rcParams[...] = ..., os.environ[...] = ...
            # library code reads module attributes when it runs: any later check may call
            # what was rebound, so every later test is reached
            return self.add(node, f"{verb} {name}")
        if self.holds(node.value):
            return self.add(node, f"{verb} {text}, which may hold an imported module")
        if isinstance(root, ast.Name) and root.id in self.lesson:
            # the lesson's own object changed: reaches the tests that read it (tamper.scan)
            self.add(node, f"changes {text}, which the lesson made", frozenset({root.id}))

    def visit_Assign(self, node):
        held = self.module_in(node.value)
        for t in node.targets if held else []:
            if isinstance(t, (ast.Attribute, ast.Subscript)):  # self.m = math: out of sight
                self.add(node, f"stores the module {held} in {ast.unparse(t)}")
        for t in node.targets:
            self.target(t, "rebinds")
            self.taint(t, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self.target(node.target, "rebinds")
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        self.target(node.target, "rebinds")
        self.taint(node.target, node.value)
        self.generic_visit(node)

    def visit_NamedExpr(self, node):
        self.taint(node.target, node.value)
        self.generic_visit(node)

    def visit_For(self, node):
        self.taint(node.target, node.iter)
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_comprehension(self, node):
        self.taint(node.target, node.iter)
        self.generic_visit(node)

    def visit_With(self, node):
        for item in node.items:
            if item.optional_vars is not None:
                self.taint(item.optional_vars, item.context_expr)
        self.generic_visit(node)

    visit_AsyncWith = visit_With

    def visit_arguments(self, node):
        args = [*node.posonlyargs, *node.args]
        for arg, default in zip(args[len(args) - len(node.defaults) :], node.defaults):
            self.taint(ast.Name(arg.arg), default)
        for arg, default in zip(node.kwonlyargs, node.kw_defaults):
            self.taint(ast.Name(arg.arg), default)
        self.generic_visit(node)

    def visit_Delete(self, node):
        for t in node.targets:
            self.target(t, "deletes")
        self.generic_visit(node)

    def visit_Import(self, node):
        for a in node.names:
            if a.name.split(".")[0] in MODULES:
                self.add(node, f"imports {a.name}")
            elif not installed(a.name):
                self.add(node, f"imports {a.name}, which is not an installed module")
            self.imported[a.asname or a.name.split(".")[0]] = (
                a.name if a.asname else a.name.split(".")[0]
            )
            self.imports.add(a.asname or a.name.split(".")[0])

    def visit_ImportFrom(self, node):
        module = node.module or ""
        for a in node.names:
            full = f"{module}.{a.name}"
            if module.split(".")[0] in MODULES or DOTTED.match(full) or a.name == "*":
                self.add(node, f"imports {full}")
            elif node.level or not installed(module):
                self.add(node, f"imports from {module or '.'}, which is not an installed module")
            self.imported[a.asname or a.name] = full
            self.imports.add(a.asname or a.name)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and _is_ipython(func.value):
            return self.ipython(node, func.attr)
        if isinstance(func, ast.Name) and func.id in CALLS and func.id not in self.imported:
            first = node.args[0] if node.args else None
            if not (func.id == "setattr" and isinstance(first, ast.Name) and first.id in SELF):
                self.add(node, f"calls {func.id}()")
            for part in [*node.args, *node.keywords]:
                self.visit(part)
            return
        self.getattr_call(node)
        dotted = _dotted(func) or _getattr_dotted(func)
        if dotted:
            full = self.resolve(dotted)
            parts = full.split(".")
            tails = [".".join(parts[k:]) for k in range(len(parts)) if parts[k] in REACHED]
            if any(DOTTED.match(t) for t in [full, *tails]):
                self.add(node, f"calls {full}()")
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS and not _dotted(func.value):
            if self.holds(func.value):  # getattr(np.testing, "__dict__").update(...)
                self.add(node, f"calls {ast.unparse(func)}() on what may hold a module")
        viewer = isinstance(func, ast.Name) and func.id in VIEWERS
        for arg in [] if viewer else [*node.args, *(k.value for k in node.keywords)]:
            held = self.module_in(arg)
            if held and not (isinstance(func, ast.Name) and func.id in self.own):
                self.add(node, f"hands the module {held} to {ast.unparse(func)}()")
        if isinstance(func, ast.Name) and func.id in self.own:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if self.holds(arg):  # a module handed to one's own function, to rebind there
                    chain = _dotted(arg)
                    held = self.resolve(chain) if chain else ast.unparse(arg)
                    self.add(node, f"passes {held} to {func.id}()")
        if isinstance(func, ast.Name) and func.id == "print":
            # the printed text as written: f-strings' braces and the quotes taken off
            text = re.sub(r"""\bf(?=['"])|[{}'"]""", "", " ".join(map(ast.unparse, node.args)))
            if PASSED.search(text):
                self.add(node, "prints a test's success message", frozenset())
        self.generic_visit(node)

    def ipython(self, node, method: str):
        """get_ipython().<method>(...): a magic or a shell command. %time and %timeit (and
        %matplotlib) only time or plot: the code they run is read like any other; every other
        use of the shell is flagged."""
        args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
        if method in ("run_line_magic", "run_cell_magic") and args and args[0] in SAFE_MAGICS:
            for code in args[1:]:
                if not isinstance(code, str) or not code.strip():
                    continue
                tree = parse(code)
                if tree is None:  # options, or code the scan cannot read: not trusted
                    return self.add(node, f"runs %{args[0]} with {code[:40]!r}, unread")
                self.visit(tree)
            return
        if method == "system":
            self.add(node, f"runs the shell command !{args[0] if args else ''}")
        elif method in ("run_line_magic", "run_cell_magic") and args:
            self.add(node, f"runs the magic %{args[0]}")
        else:
            self.add(node, f"calls get_ipython().{method}()")

    def visit_Attribute(self, node):
        if node.attr in ATTRS and not (
            node.attr in {"stdout", "stderr", "stdin", "excepthook", "displayhook", "modules"}
            and isinstance(node.ctx, ast.Load)
            and node.attr != "modules"
        ):
            self.add(node, f"reaches .{node.attr}")
        self.generic_visit(node)

    def getattr_call(self, node) -> None:
        """getattr(x, "__dict__") reaches what the scan cannot follow, as does getattr on a
        module with a name computed at run time."""
        func = node.func
        if not (isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2):
            return
        name = node.args[1]
        if isinstance(name, ast.Constant) and str(name.value).startswith("__"):
            self.add(node, f"reaches .{name.value} through getattr()")
        elif not isinstance(name, ast.Constant) and self.holds(node.args[0]):
            self.add(node, f"calls getattr() on {ast.unparse(node.args[0])} with a computed name")

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        returns = [n.value for n in ast.walk(node) if isinstance(n, (ast.Return, ast.Yield))]
        if any(self.holds(r) for r in returns):
            self.tainted.add(node.name)  # `def g(): return np.testing`, then g().x = ...

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.generic_visit(node)
        bases = {(_dotted(b) or "").split(".")[-1] for b in node.bases}
        defined = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        defined |= {
            t.id
            for n in node.body
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        value = bool(bases & VALUES) or any(self.holds(b) for b in node.bases)
        lies = defined & LIARS or (defined & COMPARES and value)
        if lies or (defined & COMPARES and defined & LIARS):
            what = ", ".join(sorted(defined & (LIARS | COMPARES)))
            self.add(node, f"defines {what} in class {node.name}, an answer that can lie")
        if bases & ENDS:
            self.ends.add(node.name)
            self.add(node, f"defines {node.name}, a kind of {sorted(bases & ENDS)[0]}", frozenset())
        held = [n.value for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))]
        if any(self.holds(v) for v in held) or any(self.holds(b) for b in node.bases):
            self.tainted.add(node.name)  # `class C: t = np.testing`, then C.t.x = ...

    def visit_Name(self, node):
        if node.id == "__builtins__":
            self.add(node, "reaches __builtins__")
        elif node.id.startswith("_labs_"):  # the grader's runtime check (sentinel.py)
            self.add(node, f"reaches the grader's check {node.id}")
        elif node.id in CALLS and node.id not in self.imported and isinstance(node.ctx, ast.Load):
            self.add(node, f"uses {node.id}")  # `f = setattr`: called later under another name

    def visit_Raise(self, node):
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(exc, ast.Name) and exc.id in ENDS | self.ends:
            self.add(node, f"raises {exc.id}", frozenset())
        self.generic_visit(node)
