"""Tools run as modules (`python -m tools.X`); run as files from anywhere, they become one."""

import subprocess
import sys

from helpers.config import REPO_ROOT


def test_a_tool_run_as_a_file_from_another_folder_runs_as_its_module(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "make_index.py"), "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "up to date" in done.stdout, done.stderr
