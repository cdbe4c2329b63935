"""The TF_CONFIG launcher: real processes, real MultiWorkerMirroredStrategy, nothing left behind."""

import json
import os
import signal
import socket
import time

import psutil
import pytest

from helpers.cluster import strategies, tfconfig
from helpers.system import netns

# starts TF_CONFIG clusters for TF's own strategies: `make unit` leaves it out
pytestmark = pytest.mark.slow


def _alive(pids):
    return [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


@pytest.mark.parametrize(
    "roles, match",
    [
        ({"worker": 0}, "worker tasks must be an integer >= 1"),
        ({"gpu": 1, "worker": 1}, "unknown task type 'gpu'"),
        ({"chief": 2, "worker": 1}, "at most one chief"),
        ({"ps": 1}, "at least one worker"),
    ],
)
def test_bad_roles_raise_before_any_process(roles, match):
    before = psutil.Process().children(recursive=True)
    with pytest.raises(ValueError, match=match):
        tfconfig.TFConfigCluster(roles, {"kind": "server"})
    assert psutil.Process().children(recursive=True) == before


def test_bad_job_and_servers_raise():
    job = {
        "kind": "mwms",
        "model": "lenet",
        "train_size": 100,
        "test_size": 10,
        "lr": 0.1,
        "runs": [{"batch_size": 0}],
    }
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        tfconfig.TFConfigCluster({"worker": 1}, job)
    with pytest.raises(ValueError, match="leaves no task"):
        tfconfig.TFConfigCluster({"worker": 1}, {"kind": "server"}, servers=("worker",))


def test_tf_config_is_what_tensorflow_reads(monkeypatch):
    tf = pytest.importorskip("tensorflow")
    cluster = tfconfig.cluster_spec({"chief": 1, "worker": 2, "ps": 1})
    monkeypatch.setenv("TF_CONFIG", tfconfig.tf_config(cluster, "worker", 1))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.cluster_spec().as_dict() == cluster
    ports = [a.split(":")[1] for addrs in cluster.values() for a in addrs]
    assert len(set(ports)) == 4


def test_failing_task_raises_with_its_log_and_leaves_no_process():
    cluster = tfconfig.TFConfigCluster(
        {"worker": 2}, {"kind": "server"}, module="helpers.no_such_module", timeout=60
    )
    with cluster:
        pids = list(cluster.pids.values())
        with pytest.raises(tfconfig.TFConfigError, match="exited with code 1") as err:
            cluster.wait()
    assert "No module named helpers.no_such_module" in str(err.value)
    assert not _alive(pids)


def test_timeout_ends_every_process():
    cluster = tfconfig.TFConfigCluster(
        {"worker": 1, "ps": 1}, {"kind": "server"}, servers=("ps",), timeout=3
    )
    with cluster:
        pids = list(cluster.pids.values())
        with pytest.raises(tfconfig.TFConfigError, match=r"timed out after 3 s .*worker:0"):
            cluster.wait()  # the worker only serves: it never reports a result
    assert not _alive(pids)


MWMS_JOB = {  # two replicas of softmax regression, 32 SGD steps (tests/test_slurm.py too)
    "kind": "mwms",
    "model": "logreg",
    "optimizer": "sgd",
    "lr": 0.5,
    "train_size": 2048,
    "test_size": 1000,
    "runs": [{"batch_size": 128, "epochs": 2}],
}


def test_two_mwms_workers_stay_identical_and_learn(shared_data, monkeypatch):
    monkeypatch.setenv("LABS_DATA_MIRROR", str(shared_data))
    job = MWMS_JOB
    launch = tfconfig.run({"worker": 2}, job, timeout=240)
    results, resources = launch.results, launch.resources
    runs = [results[f"worker:{i}"]["runs"][0] for i in range(2)]
    # every step all-reduces the gradients, so both replicas hold the same weights
    assert runs[0]["weights_checksum"] == pytest.approx(runs[1]["weights_checksum"], rel=1e-6)
    # each scored half of the test set; the all-reduced hits give both the same accuracy
    assert [h["test_accuracy"] for h in runs[0]["history"]] == [
        h["test_accuracy"] for h in runs[1]["history"]
    ]
    assert runs[0]["history"][-1]["loss"] < runs[0]["history"][0]["loss"]
    assert runs[0]["test_accuracy"] > 0.8  # softmax regression, 32 SGD steps
    assert runs[0]["bytes_sent"] == strategies.ring_bytes(7850 * 4, 2) * 16 * 2
    if launch.isolated:  # measured on the private loopback: both workers' all-reduce sends,
        # with gRPC framing and TCP/IP headers on top, over 32 steps
        assert 2 * runs[0]["bytes_sent"] <= runs[0]["loopback_bytes"] < 8 * runs[0]["bytes_sent"]
    assert set(resources) == {"worker:0", "worker:1"}
    assert json.dumps(results)  # plain JSON all the way
    # the timeline: every milestone of every task, in order, also written next to the logs
    for row in launch.timeline.values():
        assert row["started"] < row["ready"] <= row["job_start"] < row["result"] <= row["gone"]
        assert row["ended"].startswith("exited with code 0"), row  # done, so it left cleanly
    assert json.loads((launch.log_dir / "launch.json").read_text()) == launch.timeline
    phases = launch.phases()
    parts = ("startup_s", "train_s", "eval_s", "other_s", "teardown_s")
    assert sum(phases[k] for k in parts) == pytest.approx(phases["wall_s"])
    assert phases["train_s"] == results["worker:0"]["train_s"] and phases["other_s"] >= 0


def test_parameter_server_strategy_shards_variables_over_two_ps(shared_data, monkeypatch, tmp_path):
    """TF's ParameterServerStrategy with 2 PS tasks and a FixedShardsPartitioner: every
    variable in two shards, one per PS, trained by the coordinator's scheduled steps."""
    monkeypatch.setenv("LABS_DATA_MIRROR", str(shared_data))
    rows = strategies.write_mnist_rows(tmp_path / "rows.u8", 3000, seed=0)
    job = {
        "kind": "ps",
        "model": "logreg",
        "batch_size": 64,
        "lr": 0.2,
        "steps": 150,
        "train_size": 3000,
        "test_size": 500,
        "seed": 0,
        "data_file": str(rows),
    }
    launch = tfconfig.run(
        {"chief": 1, "worker": 2, "ps": 2}, job, servers=("worker", "ps"), timeout=300
    )
    result = launch.results["chief:0"]
    assert result["ps"] == 2 and result["shards"] == [2, 2]  # weights and bias, halved
    assert result["loss_last"] < result["loss_first"] and result["test_accuracy"] > 0.75
    assert set(launch.resources) >= {"ps:0", "ps:1", "worker:0", "worker:1"}
    assert set(launch.timeline) >= {"ps:0", "ps:1"}
    assert all(row["gone"] for row in launch.timeline.values())  # every task ended


def test_batch_must_split_evenly_over_the_workers():
    job = {
        "kind": "mwms",
        "model": "lenet",
        "train_size": 100,
        "test_size": 10,
        "lr": 0.1,
        "runs": [{"batch_size": 128}],
    }
    with pytest.raises(ValueError, match="batch_size 128 must be divisible by the 3 workers"):
        tfconfig.TFConfigCluster({"worker": 3}, job)


def test_isolated_tf_config_cluster_listens_on_no_host_port():
    """TF's servers bind to every interface: inside the private namespace that is only lo."""
    if netns.unavailable_reason():
        pytest.skip(f"no private network namespace here: {netns.unavailable_reason()}")
    cluster = tfconfig.TFConfigCluster(
        {"worker": 1, "ps": 1}, {"kind": "server"}, servers=("ps",), timeout=60, isolate=True
    )
    with cluster:
        ports = {int(a.rsplit(":", 1)[1]) for addrs in cluster.cluster.values() for a in addrs}
        deadline = time.monotonic() + 60
        while not ports <= cluster.network.listening_ports():  # the servers are starting
            assert time.monotonic() < deadline, "the TF servers never listened"
            time.sleep(0.5)
        pids = set(cluster.pids.values())
        host = [
            c
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.pid in pids
        ]
        assert host == []
        for port in ports:
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) != 0
        holder = cluster.network.pid
    assert not _alive(list(pids) + [holder])


def test_a_worker_killed_mid_training_fails_the_launch_at_once(shared_data, monkeypatch):
    """The survivors wait in an all-reduce for a peer that is gone; the launcher must not wait
    for its timeout: it names the dead task, shows its log and ends the others."""
    monkeypatch.setenv("LABS_DATA_MIRROR", str(shared_data))
    job = {
        "kind": "mwms",
        "model": "logreg",
        "optimizer": "sgd",
        "lr": 0.5,
        "train_size": 2048,
        "test_size": 100,
        "runs": [{"batch_size": 16, "epochs": 1000}],
    }
    cluster = tfconfig.TFConfigCluster({"worker": 2}, job, timeout=600)
    with cluster:
        pids = list(cluster.pids.values())
        training = set()
        while training != {"worker:0", "worker:1"}:
            name, msg = cluster.inbox.get(timeout=120)
            assert msg.get("event") != "eof", f"{name} ended before training"
            if msg.get("event") == "training":
                training.add(name)
        time.sleep(1.0)  # a few steps in
        os.kill(cluster.pids["worker:1"], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(
            tfconfig.TFConfigError, match=r"worker:1 \(pid \d+\) killed by SIGKILL before reporting"
        ):
            cluster.wait()
        assert time.monotonic() - t0 < 30  # one grace period, nowhere near the 600 s timeout
    assert not _alive(pids)
    print(cluster.ended)  # how the survivor ended, for the record


PARENT = """
import json, sys, time
from helpers.cluster import tfconfig
job = {"kind": "mwms", "model": "logreg", "optimizer": "sgd", "lr": 0.5, "train_size": 2048,
       "test_size": 100, "runs": [{"batch_size": 16, "epochs": 1000}]}
cluster = tfconfig.TFConfigCluster({"worker": 2}, job, timeout=600).start()
training = set()
while training != {"worker:0", "worker:1"}:
    name, msg = cluster.inbox.get(timeout=120)
    if msg.get("event") == "training":
        training.add(name)
print(json.dumps(cluster.pids), flush=True)
time.sleep(600)
"""


def test_mwms_tasks_die_with_their_launcher(shared_data, monkeypatch, tmp_path):
    """A launcher killed mid-training (a kernel that dies) leaves no task behind, although
    MultiWorkerMirroredStrategy catches SIGTERM: its tasks ask for SIGKILL on parent death."""
    import subprocess
    import sys

    monkeypatch.setenv("LABS_DATA_MIRROR", str(shared_data))
    monkeypatch.setenv("LABS_RUNS_DIR", str(tmp_path))
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        pids = list(json.loads(parent.stdout.readline()).values())
        family = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
        assert set(pids) <= set(family) and _alive(pids) == pids
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(family) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(family), [psutil.Process(p).cmdline() for p in _alive(family)]
    finally:
        for pid in _alive([parent.pid] + locals().get("family", [])):
            os.kill(pid, signal.SIGKILL)
