"""ResourceMonitor on real processes: RSS counts shared pages in full, PSS splits them, USS
leaves them out."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from helpers.system import resources
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
    parent = subprocess.Popen(
        [sys.executable, "-c", FORKED_PAIR],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
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


def _cgroup_tree(tmp_path, v2_levels=None, v1=None):
    """A fake /sys/fs/cgroup and /proc/self/cgroup with the given limits (bytes)."""
    root = tmp_path / "cgroup"
    if v2_levels is not None:
        folder = root
        for name, (limit, used) in v2_levels:
            folder = folder / name if name else folder
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "memory.max").write_text(f"{limit}\n")
            (folder / "memory.current").write_text(f"{used}\n")
        rel = "/" + "/".join(n for n, _ in v2_levels if n)
        (tmp_path / "self").write_text(f"0::{rel}\n")
    else:
        folder = root / "memory" / "pod"
        folder.mkdir(parents=True)
        (folder / "memory.limit_in_bytes").write_text(f"{v1[0]}\n")
        (folder / "memory.usage_in_bytes").write_text(f"{v1[1]}\n")
        (tmp_path / "self").write_text("4:memory:/pod\n3:cpu,cpuacct:/pod\n")
    return root, tmp_path / "self"


def test_a_pods_memory_limit_is_read_from_its_cgroup_and_its_ancestors(tmp_path):
    mb = 2**20
    root, own = _cgroup_tree(
        tmp_path,
        [("", ("max", 0)), ("kubepods", (4096 * mb, 3000 * mb)), ("pod", ("max", 1000 * mb))],
    )
    assert resources._cgroup_free_mb(root, own) == 1096  # the parent's limit is the tight one
    root, own = _cgroup_tree(tmp_path / "v1", v1=(2048 * mb, 512 * mb))
    assert resources._cgroup_free_mb(root, own) == 1536
    root, own = _cgroup_tree(tmp_path / "none", [("", ("max", 0)), ("user", ("max", 5 * mb))])
    assert resources._cgroup_free_mb(root, own) is None  # no limit anywhere
    assert resources._cgroup_free_mb(root, tmp_path / "missing") is None  # no cgroups (macOS)


def test_labs_memory_mb_lowers_what_is_available_and_bad_values_are_named(monkeypatch):
    monkeypatch.setenv("LABS_MEMORY_MB", "700")
    assert resources.available_memory_mb() == (700, "LABS_MEMORY_MB")
    monkeypatch.setenv("LABS_MEMORY_MB", "lots")
    with pytest.raises(
        ValueError, match="LABS_MEMORY_MB must be a whole number of MB above 0, got 'lots'"
    ):
        resources.available_memory_mb()


def test_a_cluster_that_does_not_fit_is_refused_before_any_process_starts(monkeypatch):
    """What it needs, what is free, and what to lower; no process, no namespace, no run dir."""
    from helpers.cluster import ClusterError, LocalCluster
    from helpers.cluster.tfconfig import TFConfigCluster, TFConfigError

    monkeypatch.setenv("LABS_MEMORY_MB", "1500")
    before = psutil.Process().children(recursive=True)
    cluster = LocalCluster(workers=5, evaluator=True)
    with pytest.raises(ClusterError) as err:
        cluster.start()
    assert str(err.value) == (
        "A cluster of 1 PS, 5 worker(s) and an evaluator needs about 3,360 MB (7 TensorFlow "
        "processes of about 480 MB each), but only 1,500 MB is free here (LABS_MEMORY_MB). "
        "Start fewer workers (workers=1 would fit), close other notebooks or programs, or run on "
        "a machine with more memory."
    )
    assert cluster.procs == {} and cluster.dir is None and not cluster.isolated
    tf_cluster = TFConfigCluster({"worker": 4}, {"kind": "server"}, servers=())
    with pytest.raises(
        TFConfigError,
        match=r"4 tasks needs about 1,920 MB .* Use fewer tasks "
        r"\(3 would fit\)",
    ):
        tf_cluster.start()
    assert tf_cluster.procs == {} and not tf_cluster.network.isolated
    assert psutil.Process().children(recursive=True) == before


def test_a_sampler_samples_until_stopped_and_can_start_again():
    seen = []
    sampler = resources.Sampler(lambda: seen.append(time.monotonic()), interval=0.02)
    for _ in range(2):  # started, stopped, started again
        before = len(seen)
        with sampler:
            deadline = time.monotonic() + 10
            while len(seen) < before + 3:
                assert time.monotonic() < deadline, "the sampler never sampled"
                time.sleep(0.01)
        after_stop = len(seen)
        time.sleep(0.1)  # several intervals: no sample may come after stop
        assert len(seen) == after_stop
    with pytest.raises(ValueError, match="interval must be > 0 seconds, got 0"):
        resources.Sampler(lambda: None, 0)


def test_read_memory_gives_pss_and_uss_only_when_asked():
    me = psutil.Process()
    quick, full = resources.read_memory(me), resources.read_memory(me, full=True)
    assert quick.rss > 0 and quick.pss is None and quick.uss is None
    assert 0 < full.uss <= full.pss <= full.rss * 1.1  # Linux has PSS; pages may come and go


def test_the_notebook_runners_memory_peak_sees_a_child_it_did_not_start_itself():
    """MemoryPeak follows every descendant (a kernel's cluster nodes): here a child holding
    200 MB of its own."""
    from tools.run_notebooks import MemoryPeak

    with MemoryPeak(interval=0.05) as peak:
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; x = b'x' * (200 * 2**20); sys.stdin.read()"],
            stdin=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 30
            while peak.summary().get("peak_pss_mb", 0) < 200:
                assert time.monotonic() < deadline, peak.summary()
                time.sleep(0.05)
        finally:
            child.stdin.close()
            child.wait(10)
    summary = peak.summary()
    assert summary["largest_process_mb"] >= 200 and summary["processes_at_peak"] >= 1
