"""helpers/__init__.py: importing TensorFlow after helpers drops exactly its import notices."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{cwd}:{ROOT}"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_quiet_loader_drops_the_notices_and_keeps_everything_else(tmp_path):
    # a stand-in module that writes to fd 2 from "C" as TF 2.21 does, notices and a real error
    (tmp_path / "noisy.py").write_text(
        textwrap.dedent("""
        import os
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are "
                    b"written to STDERR\\n")
        os.write(2, b"I0000 00:00:1.0  7 port.cc:153] oneDNN custom operations are on. You "
                    b"may see slightly different numerical results\\n")
        os.write(2, b"E0000 a real error from C++\\n")
        VALUE = 42
        """)
    )
    done = run(
        """
        import sys
        from importlib.machinery import PathFinder
        import helpers
        spec = PathFinder.find_spec("noisy")
        spec.loader = helpers._QuietImport(spec.loader)
        module = __import__("importlib.util").util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(module.VALUE)
        print("after", file=sys.stderr)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"
    assert done.stderr.splitlines() == ["E0000 a real error from C++", "after"]


def test_importing_tensorflow_after_helpers_prints_nothing(tmp_path):
    done = run(
        """
        import helpers
        import tensorflow as tf
        print(int(tf.constant(2) + 1))
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3"
    assert done.stderr == ""
