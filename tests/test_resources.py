"""ResourceMonitor on real processes: RSS counts shared pages in full, PSS splits them, USS
leaves them out."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from helpers.system.resources import ResourceMonitor

MB = 2**20
# 200 MB written by a parent, then shared with a forked child (copy-on-write, never written)
FORKED_PAIR = textwrap.dedent("""
    import os, sys
    data = b"x" * (200 * 2**20)
    pid = os.fork()
    if pid == 0:
        sys.stdin.read()  # the child: wait until the test closes stdin
        os._exit(0)
    print(pid, flush=True)
    sys.stdin.read()
    os.waitpid(pid, 0)
""")


def test_pss_splits_pages_two_processes_share_and_uss_leaves_them_out():
    parent = subprocess.Popen([sys.executable, "-c", FORKED_PAIR], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        with ResourceMonitor([parent.pid, child], interval=0.05, pss_every=0.1) as monitor:
            time.sleep(0.5)  # time for a few samples, not a wait for a condition
        usage = monitor.summary()
        for pid in (parent.pid, child):
            u = usage[pid]
            assert u["peak_rss_mb"] > 200, u  # both map all 200 MB
            assert 95 < u["peak_pss_mb"] < u["peak_rss_mb"] - 80, u  # each is charged half
            assert u["peak_uss_mb"] < 60, u  # and owns none of it
    finally:
        parent.stdin.close()
        try:
            parent.wait(10)
        finally:
            for pid in (parent.pid, child):
                if pid and psutil.pid_exists(pid):
                    os.kill(pid, signal.SIGKILL)
            parent.stdout.close()


def test_without_pss_every_only_rss_is_sampled():
    with ResourceMonitor() as monitor:
        pass
    assert set(monitor.summary()[os.getpid()]) == {"cpu_percent", "peak_rss_mb"}
