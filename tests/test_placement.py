"""A cluster placed on several hosts over SSH: three network namespaces with an sshd each stand
in for three machines (tests/hosts.py). The runs are real: TF's servers on the hosts' own
addresses, the launcher's control channel through ssh, the events back in one run folder.

What is checked: the engine trains in sync and async with 2 PS tasks and the event logs hold
the invariants; sync ends with the same parameters as on one machine; a host's clock offset is
estimated to 10 ms; a host that dies, or drops off the network, is named within 10 s; a
SIGKILLed driver leaves nothing running on any host; every host is checked before anything
starts, one line per host at fault.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from helpers.cluster import ClusterError, LocalCluster, placement
from helpers.cluster.placement import SSH
from tests import hosts as hosts_
from tests.process_cleanup import end_parent_and_pids
from tests.test_cluster_integration import check_views, steps_of, updates

pytestmark = pytest.mark.slow

SMALL = dict(batch_size=64, lr=0.2, train_size=3000, test_size=1000, progress=False, seed=0)
SHIFT = 0.25  # seconds: worker 1's clock, as the test makes it read


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = hosts_.unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the multi-host tests: {reason}")
        pytest.skip(reason)
    with hosts_.NamespacedHosts(3, tmp_path_factory.mktemp("hosts")) as h:
        yield h
    assert h.wait_empty(0) == {}


def ssh(hosts, **kw):
    return SSH(hosts.addresses, ssh_config=str(hosts.ssh_config), **kw)


@pytest.fixture(scope="module")
def cluster(hosts, shared_data):
    """2 PS tasks and 2 workers on 3 hosts; worker 1's clock reads SHIFT s ahead."""
    os.environ["LABS_CLOCK_SHIFT"] = f"worker:1={SHIFT}"
    try:
        with LocalCluster(workers=2, ps=2, placement=ssh(hosts)) as c:
            yield c
        assert not (c.dir / "tmp").exists()  # TF's files for traced functions went with it
    finally:
        del os.environ["LABS_CLOCK_SHIFT"]


def test_the_processes_are_spread_over_the_hosts(cluster, hosts):
    assert cluster.nodes.hosts == {
        "ps:0": hosts.addresses[0],
        "ps:1": hosts.addresses[1],
        "worker:0": hosts.addresses[2],
        "worker:1": hosts.addresses[0],
    }
    spec = json.loads((cluster.dir / "cluster.json").read_text())
    assert spec["ps"] == [f"{hosts.addresses[0]}:2222", f"{hosts.addresses[1]}:2222"]
    assert spec["worker"] == [f"{hosts.addresses[2]}:2222", f"{hosts.addresses[0]}:2223"]
    with pytest.raises(ValueError, match=r"kill\(\) signals processes of this machine"):
        cluster.kill("worker:0")
    with pytest.raises(ValueError, match=r"faults \['ps:1'\] stop or kill PS tasks other than 0"):
        cluster.train(mode="async", steps=10, faults={"ps:1": {"kind": "hang", "at": 3}}, **SMALL)
    for i in range(3):  # each node runs in its host's namespace
        assert set(hosts.pids_in(i)) & set(cluster.nodes.node_pids.values())


def test_sync_across_hosts_matches_one_machine_and_recovers_a_clock_offset(
    cluster, tmp_path, monkeypatch
):
    run = cluster.train(mode="sync", steps=60, checkpoint_every=60, **SMALL)
    offsets = json.loads((run.dir / "clocks.json").read_text())["offsets"]
    assert abs(offsets["worker-1"] - SHIFT) < 0.010, offsets
    assert all(abs(v) < 0.010 for k, v in offsets.items() if k != "worker-1"), offsets
    # the invariants, with worker 1's times put back on the driver's clock
    up = updates(run)
    assert len(up) == 60 and all(sorted(w) == [0, 1] for w in up.workers)
    assert steps_of(run).groupby("worker").size().tolist() == [60, 60]
    check_views(run, tmp_path)
    with np.load(run.dir / "ckpt" / f"ckpt-{60:07d}.npz") as f:
        placed = [f[k] for k in sorted(f.files)]
    monkeypatch.delenv("LABS_CLOCK_SHIFT")  # one machine, one clock
    with LocalCluster(workers=2, ps=2) as local:
        here = local.train(mode="sync", steps=60, checkpoint_every=60, **SMALL)
    with np.load(here.dir / "ckpt" / f"ckpt-{60:07d}.npz") as f:
        for one, two in zip(placed, [f[k] for k in sorted(f.files)]):
            np.testing.assert_allclose(one, two, rtol=0, atol=1e-6)


def test_async_across_hosts(cluster, tmp_path):
    run = cluster.train(mode="async", steps=80, **SMALL)
    assert len(updates(run)) == 80
    assert set(steps_of(run).worker) == {0, 1}
    check_views(run, tmp_path)
    hosts_.tf_files_in_the_cluster_folder(cluster)


def test_a_killed_host_is_named_within_10_s(cluster, hosts):
    """Every process on worker 1's host (PS task 0's too) SIGKILLed in the middle of a run.
    The last test of the shared cluster: the failed run ends it."""
    host = cluster.nodes.hosts["worker:1"]
    err, killed = hosts_.kill_mid_run(
        cluster, host, f"killhost-{os.getpid()}", mode="sync", steps=10**6, **SMALL
    )
    assert isinstance(err, ClusterError) and time.monotonic() - killed < 10
    assert f"on host {host}" in str(err)
    assert hosts.wait_empty(10) == {}, "nothing runs on any host after the failed run"


LAUNCHER = textwrap.dedent("""
    import json, sys
    from helpers.cluster import LocalCluster
    from helpers.cluster.placement import SSH
    hosts, config, hung = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3] == "hung"
    placement = SSH(hosts, ssh_config=config, port_base=2300)  # the shared cluster has 2222+
    c = LocalCluster(workers=2, ps=1, placement=placement).start()
    faults = {0: {"kind": "hang", "at": 5}} if hung else {}  # async goes on without it
    c.train(mode="async" if hung else "sync", steps=10**6, train_size=3000, test_size=1000,
            progress=False, run_id="driver-killed", faults=faults)
""")


@pytest.mark.parametrize("how", ["driver-sigkilled", "hung-worker-driver-sigkilled", "link-down"])
def test_nothing_is_left_on_any_host(hosts, shared_data, tmp_path, how):
    """The driver SIGKILLed mid-run: its ssh clients go, each node reads the end of its stdin
    and ends; a worker stopped by the hang fault runs no thread, and its guard, which watches
    the same stdin, ends it. A host cut off the network mid-run: the driver names it within
    10 s, and its nodes, which no longer hear the driver's pings, end themselves."""
    hung = "hung" if how.startswith("hung") else "-"
    args = [json.dumps(hosts.addresses), str(hosts.ssh_config), hung]
    parent = hosts_.driver_mid_run(LAUNCHER, args, tmp_path, "driver-killed")
    try:
        deadline = time.monotonic() + 120
        while hung == "hung" and not any(_stopped(p) for p in hosts.pids_in(1)):
            assert time.monotonic() < deadline, f"worker 0 never hung: {hosts.wait_empty(0)}"
            time.sleep(0.2)
        if how.endswith("driver-sigkilled"):
            parent.send_signal(signal.SIGKILL)
            parent.wait(10)
        else:
            hosts.link(1, up=False)  # worker 0 runs there
            cut = time.monotonic()
            try:
                parent.wait(30)
            except subprocess.TimeoutExpired:
                pytest.fail("the driver did not notice a host off the network in 30 s")
            err = parent.stderr.read()
            assert f"on host {hosts.addresses[1]}" in err, err
            assert time.monotonic() - cut < 10 + 2  # named within 10 s (+ the exit)
        left = hosts.wait_empty(15)
        assert left == {}, f"left running: {left}"
    finally:
        if how == "link-down":
            hosts.link(1, up=True)
        end_parent_and_pids(parent, [p for i in range(3) for p in hosts.pids_in(i)])


def _stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def test_every_host_is_checked_first_one_line_each(hosts, tmp_path, monkeypatch):
    """An unreachable address, a busy port, a public address, code elsewhere: each host's
    problem on a line of its own, before anything starts."""
    monkeypatch.setenv("LABS_RUNS_DIR", str(tmp_path))
    busy = (
        "import socket, time; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 2222)); "
        "s.listen(); print('up', flush=True); time.sleep(60)"
    )
    listener = subprocess.Popen(  # port 2222 busy on host 1
        ["ip", "netns", "exec", hosts.names[1], sys.executable, "-c", busy],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout.readline().strip() == "up"
        subprocess.run(
            ["ip", "-n", hosts.names[2], "addr", "add", "8.8.4.4/32", "dev", "lo"], check=True
        )
        unreachable = f"10.78.{hosts.subnet}.250"
        pl = SSH(
            hosts.addresses + [unreachable], ssh_config=str(hosts.ssh_config), connect_timeout=2
        )
        with pytest.raises(ClusterError) as err:
            LocalCluster(workers=2, ps=2, placement=pl).start()
        lines = str(err.value).splitlines()
        assert lines[0] == "3 of 4 host(s) cannot take part:"
        assert lines[1].strip().startswith(f"{hosts.addresses[1]}: port(s) [2222] in use")
        assert (
            lines[2].strip().startswith(f"{hosts.addresses[2]}: has the public address(es) 8.8.4.4")
        )
        assert "allow_public=True" in lines[2]
        assert lines[3].strip().startswith(f"{unreachable}: unreachable by ssh")
        # nothing was started: the hosts run only the test's listener
        assert [hosts.pids_in(i) for i in range(3)] == [[], [listener.pid], []]
        # allowed, the public host passes; another repository path is named
        pl = SSH(
            hosts.addresses[2:],
            ssh_config=str(hosts.ssh_config),
            allow_public=True,
            repo="/nonexistent",
        )
        with pytest.raises(ClusterError, match=r"cannot run this project's Python in /nonexistent"):
            LocalCluster(workers=1, placement=pl).start()
    finally:
        subprocess.run(
            ["ip", "-n", hosts.names[2], "addr", "del", "8.8.4.4/32", "dev", "lo"],
            capture_output=True,
        )
        listener.kill()
        listener.wait()


def test_bad_placements_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="hosts must be a non-empty list of host names, got 'a'"):
        SSH("a")
    with pytest.raises(ValueError, match="port_base must be a port number in 1024-65000"):
        SSH(["a"], port_base=80)
    with pytest.raises(ValueError, match="placement must be None"):
        LocalCluster(placement="ssh")
    with pytest.raises(ValueError, match="isolate=True keeps a cluster inside this machine"):
        LocalCluster(placement=SSH(["a"]), isolate=True)
    assert placement.SSH(["a", "b"]).assign(["ps:0", "worker:0", "worker:1"]) == {
        "ps:0": ("a", 2222),
        "worker:0": ("b", 2222),
        "worker:1": ("a", 2223),
    }
