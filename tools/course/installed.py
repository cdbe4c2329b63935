"""Whether a dotted name is an installed module, found on disk without importing it: what the
scan for tampering (tools/course/codescan.py) asks of the imports it reads."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path


def installed(dotted: str) -> bool:
    """Whether a module's top-level package is installed here (found, not imported): a module
    a solution wrote itself and then imports runs code the scan never read."""
    try:
        return importlib.util.find_spec(dotted.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=4096)
def is_module(dotted: str) -> bool:
    """Whether `dotted` names an installed module or package (`numpy.testing`), found on
    disk without importing it (a submodule's spec would import its parents: TensorFlow)."""
    top, *rest = dotted.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None or not rest:
        return spec is not None
    for base in spec.submodule_search_locations or []:
        path = Path(base, *rest)
        if (path / "__init__.py").is_file() or path.with_suffix(".py").is_file():
            return True
        if any(path.parent.glob(f"{path.name}.*.so")):
            return True
    return False
