"""Scaling ML Labs: the package behind the notebooks, in layers that import only downward:
the top level (config, files, plots), system, data, training, cluster (helpers/README.md).

Importing it (before TensorFlow) quiets TensorFlow once for the whole collection: its C++
start-up chatter (oneDNN, CPU features, dataset notes) and the INFO lines its Python logger
prints in a notebook ("Using MirroredStrategy ...", one per all-reduce) bury the lessons' own
output. Warnings and errors still show. Child processes inherit the C++ setting.
"""

import importlib.abc as _abc
import importlib.machinery as _machinery
import logging as _logging
import os as _os
import re as _re
import sys as _sys
import tempfile as _tempfile

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF sets its logger to INFO when it sees an interactive session; a filter outlasts that.
_logging.getLogger("tensorflow").addFilter(lambda record: record.levelno >= _logging.WARNING)

# On CPUs where TF turns oneDNN on by default (AVX512 ones), `import tensorflow` prints its
# "oneDNN custom operations are on" notice, each time behind absl's "before
# absl::InitializeLog()" line, before absl's logging is set up: TF_CPP_MIN_LOG_LEVEL does not
# reach it (abseil/abseil-cpp#1718). These exact lines, and nothing else, are dropped from
# what the import writes to stderr; everything else is written back once the import is done.
_IMPORT_NOTICES = _re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|\] oneDNN custom operations are on\. "
)


class _QuietImport(_abc.Loader):
    """Run TensorFlow's own loader with stderr (fd 2) held, then drop the import notices."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):  # everything but exec_module: the real loader's
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        _sys.stderr.flush()
        saved = _os.dup(2)
        with _tempfile.TemporaryFile() as held:
            _os.dup2(held.fileno(), 2)
            try:
                self.inner.exec_module(module)
            finally:
                _os.dup2(saved, 2)
                _os.close(saved)
                held.seek(0)
                for line in held.read().decode(errors="replace").splitlines(keepends=True):
                    if not _IMPORT_NOTICES.search(line):
                        _sys.stderr.write(line)
                _sys.stderr.flush()


class _QuietTensorFlowFinder(_abc.MetaPathFinder):
    """Give `import tensorflow` the quiet loader, once."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        _sys.meta_path.remove(self)
        spec = _machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietImport(spec.loader)
        return spec


if "tensorflow" not in _sys.modules:
    _sys.meta_path.insert(0, _QuietTensorFlowFinder())
