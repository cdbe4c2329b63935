"""A cluster placed through a real Slurm: Debian's slurmctld and munge on this machine, a slurmd
in each of three network namespaces with addresses of their own (tests/hosts.py), and an
allocation of all three nodes, as `salloc` gives. The cluster's processes are the tasks of one
srun step; their nodes and addresses come from Slurm.

What is checked: the engine trains in sync and async with 2 PS tasks, every task on the node
chosen for it, and the gathered event logs hold the invariants; a node whose processes are
killed is named within 10 s, and nothing is left on any node.
"""

import json
import os
import signal
import textwrap
import time

import pytest

from helpers.cluster import ClusterError, LocalCluster, placement, tfconfig
from helpers.cluster.placement import Slurm
from tests import hosts as hosts_
from tests.process_cleanup import end_parent_and_pids
from tests.test_cluster_integration import check_views, steps_of, updates
from tests.test_placement import SMALL
from tests.test_tfconfig import MWMS_JOB

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = hosts_.unavailable_reason() or hosts_.slurm_unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Slurm tests: {reason}")
        pytest.skip(reason)
    before = os.environ.get("SLURM_CONF")
    with hosts_.NamespacedHosts(3, tmp_path_factory.mktemp("slurmhosts")) as hosts:
        with hosts_.SlurmOnHosts(hosts) as s:
            os.environ.update(s.env)
            try:
                yield s
            finally:
                os.environ.pop("SLURM_CONF")
                if before is not None:
                    os.environ["SLURM_CONF"] = before
        left = hosts.wait_empty(10)
    assert left == {}, f"left running on the nodes: {left}"


def test_a_step_slurm_refuses_is_named_with_srun_s_own_words(slurm, shared_data):
    """4 tasks on an allocation of 3 CPUs without --overcommit: srun cannot create the step, and
    the error says why (srun's line), not only that the step ended. Before the cluster below."""
    placement = Slurm(slurm.job, srun_args=["--overlap"], port_base=2500)
    with pytest.raises(ClusterError, match="srun: error: .*More processors requested"):
        LocalCluster(workers=3, ps=1, placement=placement).start()
    assert slurm.hosts.wait_empty(10) == {}


@pytest.fixture(scope="module")
def cluster(slurm, shared_data):
    placement = Slurm(slurm.job, srun_args=["--overlap", "--overcommit"])
    with LocalCluster(workers=2, ps=2, placement=placement) as c:
        yield c
    assert not (c.dir / "tmp").exists()  # TF's files for traced functions went with it


def test_slurm_gives_the_nodes_and_their_addresses(slurm, cluster, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", slurm.job)  # as inside the allocation
    found = placement.detect()
    assert isinstance(found, Slurm) and found.hosts == slurm.nodes
    assert cluster.nodes.placement.hosts == slurm.nodes
    assert cluster.nodes.placement.address == dict(zip(slurm.nodes, slurm.hosts.addresses))
    assert cluster.nodes.hosts == {"ps:0": "n0", "ps:1": "n1", "worker:0": "n2", "worker:1": "n0"}
    for i, node in enumerate(slurm.nodes):  # each task runs in its node's namespace
        mine = {p for n, p in cluster.nodes.node_pids.items() if cluster.nodes.hosts[n] == node}
        assert mine <= set(slurm.hosts.pids_in(i)), (node, mine)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_engine_trains_across_slurm_nodes(cluster, tmp_path, mode):
    run = cluster.train(mode=mode, steps=60, **SMALL)
    assert len(updates(run)) == 60
    assert set(steps_of(run).worker) == {0, 1}
    if mode == "sync":
        assert all(sorted(w) == [0, 1] for w in updates(run).workers)
    check_views(run, tmp_path)
    hosts_.tf_files_in_the_cluster_folder(cluster)


def test_a_node_whose_processes_die_is_named_within_10_s(slurm, cluster):
    """Every task on node n2 (worker 0) SIGKILLed mid-run; the last test of the cluster."""
    err, killed = hosts_.kill_mid_run(
        cluster, "n2", f"slurmkill-{os.getpid()}", mode="sync", steps=10**6, **SMALL
    )
    assert isinstance(err, ClusterError) and time.monotonic() - killed < 10
    assert "worker:0 on host n2" in str(err), str(err)
    # a lost sync worker fails the run, not the cluster: the others serve on until stop()
    cluster.stop()
    assert slurm.hosts.wait_empty(15) == {}


def test_notebook_08s_multi_worker_mirrored_strategy_on_two_nodes(slurm, shared_data):
    """TF's own MultiWorkerMirroredStrategy, each worker a task of one srun step on a node of
    its own: the all-reduce crosses nodes, and both replicas end with the same weights."""
    job = MWMS_JOB
    placement = Slurm(slurm.job, srun_args=["--overlap", "--overcommit"], port_base=2400)
    launch = tfconfig.run({"worker": 2}, job, timeout=240, placement=placement)
    runs = [launch.results[f"worker:{i}"]["runs"][0] for i in range(2)]
    assert runs[0]["weights_checksum"] == pytest.approx(runs[1]["weights_checksum"], rel=1e-6)
    assert runs[0]["test_accuracy"] == runs[1]["test_accuracy"] > 0.8
    spec = [json.loads(e)["cluster"]["worker"] for e in _tf_configs(launch.log_dir)]
    assert spec[0] == [f"{a}:2400" for a in slurm.hosts.addresses[:2]]  # n0 and n1
    ended = {name: row["ended"] for name, row in launch.timeline.items()}
    assert all(how.startswith("exited with code 0") for how in ended.values()), launch.timeline
    assert slurm.hosts.wait_empty(10) == {}


def _tf_configs(folder) -> list[str]:
    tasks = json.loads((folder / "slurm-tasks.json").read_text())
    return [task["env"]["TF_CONFIG"] for task in tasks]  # each task's own, in rank order


DRIVER = textwrap.dedent("""
    import sys
    from helpers.cluster import LocalCluster
    from helpers.cluster.placement import Slurm
    placement = Slurm(sys.argv[1], srun_args=["--overlap", "--overcommit"], port_base=2300)
    c = LocalCluster(workers=2, ps=1, placement=placement).start()
    c.train(mode="sync", steps=10**6, train_size=3000, test_size=1000, progress=False,
            run_id="slurm-driver-killed")
""")


def test_nothing_is_left_on_any_node_after_the_driver_is_sigkilled(slurm, shared_data, tmp_path):
    """srun goes with the driver; each task reads the end of its stdin and ends, and Slurm
    ends the step."""
    parent = hosts_.driver_mid_run(DRIVER, [slurm.job], tmp_path, "slurm-driver-killed")
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        left = slurm.hosts.wait_empty(15)
        assert left == {}, f"left running: {left}"
    finally:
        end_parent_and_pids(parent, [p for i in range(3) for p in slurm.hosts.pids_in(i)])
