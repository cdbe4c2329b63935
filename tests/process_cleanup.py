"""Test scaffolding: end by PID what a test started, whatever the test found."""

import os
import signal


def end_parent_and_pids(parent, pids) -> None:
    """SIGKILL each PID still running, then the parent (a Popen with stdin and stdout pipes)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if parent.poll() is None:
        parent.kill()
    parent.wait()
    parent.stdin.close()
    parent.stdout.close()
