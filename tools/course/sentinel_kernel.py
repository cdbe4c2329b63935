"""The kernel's half of the grader's runtime check (tools/course/sentinel.py): run in the
student's kernel, before the first solution cell and around each test cell, it notes the
objects the tests rely on and reports which of them changed since.

Standard library only, loaded by path (`runpy.run_path`) in the cell the grader adds before
the first solution cell, never imported as `tools`: the sandboxed kernel reads the repository
but its code is not a package there. Every function it calls is taken when it is loaded,
before any of the student's code runs, so a later rebinding of a builtin or of `json` does
not change what it reports; each check prints one JSON line.

What it watches, by kind (the first word of each key):
- `name`: an object reached from a module the lesson imported, by an attribute chain its
  tests or lesson helpers spell (`np.testing.assert_allclose`), and each callable or module
  of the modules on that chain;
- `code`: a watched Python function's code, defaults and keyword defaults, and the
  callables of the module it was defined in (`assert_allclose` -> `assert_array_compare`);
- `builtin`: every callable builtin;
- `hook`: what decides how a cell runs or how its error is seen: `sys` hooks, trace and
  profile functions, IPython's exception handlers, input and AST transformers, event
  callbacks not registered by matplotlib, IPython or ipykernel, methods set on the shell.
"""

import builtins
import json
import sys
import threading
import types

_id, _getattr, _isinstance, _callable, _type = id, getattr, isinstance, callable, type
_print, _dumps, _sorted, _len, _str, _vars = print, json.dumps, sorted, len, str, vars
_items, _get = dict.items, dict.get
_module, _function, _method = types.ModuleType, types.FunctionType, types.MethodType
_builtins = vars(builtins)
_get_ipython = _get(_builtins, "get_ipython")

OWN_CALLBACKS = ("matplotlib", "matplotlib_inline", "IPython", "ipykernel", "ipywidgets")
SHELL_METHODS = ("run_cell", "run_cell_async", "run_ast_nodes", "run_code", "showtraceback")
SHELL_METHODS += ("_showtraceback", "showsyntaxerror", "transform_cell", "transform_ast")
SHELL_METHODS += ("should_run_async", "excepthook")
SHELL_LISTS = ("ast_transformers", "input_transformers_cleanup", "input_transformers_post")
MANAGER_LISTS = ("cleanup_transforms", "line_transforms", "token_transformers")


def ident(value):
    """What identifies `value`: its id; a bound method's function and object (a method bound
    again, as ipykernel binds `input` for each cell, is the same method)."""
    if _isinstance(value, _method):
        return f"{_id(value.__func__)}:{_id(value.__self__)}"
    return _id(value)


def mark(value):
    """ident(value); a lazily loading module (a ModuleType subclass) may become the module
    it loads."""
    if _isinstance(value, _module) and _type(value) is not _module:
        return "lazy"
    return ident(value)


def _ids(values) -> str:
    return _str([ident(v) for v in values])


def watch_module(out: dict, spelled: str, module) -> None:
    for key, value in _items(_vars(module)):
        if _callable(value) or _isinstance(value, _module):
            out[f"name {spelled}.{key}"] = mark(value)


def watch_function(out: dict, spelled: str, fn) -> None:
    out[f"code {spelled}.__code__"] = _id(fn.__code__)
    out[f"code {spelled}.__defaults__"] = _id(fn.__defaults__)
    out[f"code {spelled}.__kwdefaults__"] = _id(fn.__kwdefaults__)
    for key, value in _items(fn.__globals__):
        if _callable(value) or _isinstance(value, _module):
            out[f"code {spelled} -> {key}"] = mark(value)


def watch_chains(out: dict, chains, namespace: dict) -> None:
    """Each chain's objects, the modules on it and the functions it reaches."""
    modules, functions = {}, {}
    for chain in chains:
        parts = chain.split(".")
        obj = _get(namespace, parts[0], None)
        if _isinstance(obj, _function):
            functions.setdefault(_id(obj), (parts[0], obj))
        spelled = parts[0]
        for part in parts[1:] if _isinstance(obj, _module) else ():
            if not _isinstance(obj, _module):
                break
            modules.setdefault(_id(obj), (spelled, obj))
            try:
                obj = _getattr(obj, part)
            except Exception:
                break
            spelled = f"{spelled}.{part}"
            out[f"name {spelled}"] = mark(obj)
            if _isinstance(obj, _function):
                functions.setdefault(_id(obj), (spelled, obj))
    for spelled, module in modules.values():
        watch_module(out, spelled, module)
    for spelled, fn in functions.values():
        watch_function(out, spelled, fn)


def watch_hooks(out: dict) -> None:
    for key, value in _items(_builtins):
        if _callable(value) and key != "_":
            out[f"builtin {key}"] = ident(value)
    for key in ("excepthook", "displayhook", "breakpointhook"):
        out[f"hook sys.{key}"] = ident(_getattr(sys, key, None))
    out["hook sys.gettrace()"] = ident(sys.gettrace())
    out["hook sys.getprofile()"] = ident(sys.getprofile())
    for key in ("gettrace", "getprofile"):
        if _getattr(threading, key, None) is not None:
            out[f"hook threading.{key}()"] = ident(_getattr(threading, key)())


def watch_shell(out: dict, shell) -> None:
    """IPython's: what runs a cell, transforms it, shows its error, and event callbacks."""
    out["hook shell class"] = _id(_type(shell))
    out["hook shell.CustomTB"] = ident(_getattr(shell, "CustomTB", None))
    out["hook shell.custom_exceptions"] = _ids(_getattr(shell, "custom_exceptions", ()))
    for key in SHELL_LISTS:
        out[f"hook shell.{key}"] = _ids(_getattr(shell, key, []))
    manager = _getattr(shell, "input_transformer_manager", None)
    for key in MANAGER_LISTS:
        out[f"hook input_transformer_manager.{key}"] = _ids(_getattr(manager, key, []))
    own = _vars(shell)
    for key in SHELL_METHODS:
        out[f"hook shell.{key}"] = ident(_get(own, key, None))
    events = _getattr(shell, "events", None)
    for event, callbacks in _items(_getattr(events, "callbacks", {})):
        foreign = [
            cb
            for cb in callbacks
            if not _str(_getattr(cb, "__module__", None) or "").startswith(OWN_CALLBACKS)
        ]
        out[f"hook event {event}"] = _ids(foreign)


class Sentinel:
    """What the tests rely on, noted when made; called with a label, prints what changed."""

    def __init__(self, chains, namespace: dict):
        self.chains, self.namespace = chains, namespace
        self.shell = _get_ipython() if _get_ipython is not None else None
        self.baseline = self.snapshot()
        _print(_dumps({"sentinel": "lock", "watched": _len(self.baseline), "changed": []}))

    def snapshot(self) -> dict:
        out = {}
        watch_chains(out, self.chains, self.namespace)
        watch_hooks(out)
        if self.shell is not None:
            watch_shell(out, self.shell)
        return out

    def __call__(self, label: str) -> None:
        now, baseline, changed = self.snapshot(), self.baseline, []
        for key, value in _items(now):
            was = _get(baseline, key)
            if was is None:
                baseline[key] = value  # first seen now (imported since): noted from here
            elif was == "lazy" and value != "lazy":
                baseline[key] = value  # the module a lazy loader loaded: noted from here
            elif was != value:
                changed.append(key)
        changed += [key for key in baseline if key not in now]
        _print(_dumps({"sentinel": label, "watched": _len(now), "changed": _sorted(changed)}))


def lock(chains, namespace: dict) -> Sentinel:
    """Note what `chains` (dotted names the tests and lesson helpers read, rooted at names of
    `namespace`, the notebook's globals) and the kernel's hooks are now."""
    return Sentinel(chains, namespace)
