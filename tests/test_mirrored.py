"""helpers.training.mirrored: each configuration in a child process; crashes are reported and
retried."""

from __future__ import annotations

import os

import keras
import psutil
import pytest

from helpers.system import forkserver
from helpers.training import mirrored

# trains under MirroredStrategy in child processes: `make unit` leaves it out
pytestmark = pytest.mark.slow


def tiny_job(**fault):
    spec = mirrored.job(2, keras.optimizers.Adam(1e-3), [64], n=256, test_size=200, warmup=False)
    if fault:
        spec["fault"] = fault
    return spec


@pytest.fixture(autouse=True, scope="module")
def _end_the_fork_server():
    """The fork server lives as long as the process that started it (a kernel): here, the
    tests' process; it is ended after them."""
    yield
    mirrored.end_fork_server()


def no_children_left():
    """This process's children and theirs, but its fork servers (which outlive a run)."""
    servers = forkserver.shared_pids()
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.status() != psutil.STATUS_ZOMBIE and p.pid not in servers
    ]


@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked", "spawned"])
def test_a_configuration_trains_in_its_own_process(shared_data, monkeypatch, fork):
    monkeypatch.setenv("LABS_DATA_MIRROR", str(shared_data))
    monkeypatch.setenv("LABS_FORK", fork)
    mirrored.end_fork_server()  # an earlier test's
    res = mirrored.run(tiny_job(), name="test")
    assert res["replicas"] == 2 and len(res["devices"]) == 2
    assert res["pid"] != os.getpid() and not psutil.pid_exists(res["pid"])
    # forked from this process's fork server (Linux), or spawned by this process
    assert bool(forkserver.shared_pids()) == (fork == "1")
    assert res["attempts"] == 1 and res["batch"] == [64] and res["examples"] == [256]
    assert res["epoch_s"][0] > 0 and 0.0 <= res["test_acc"][0] <= 1.0
    # the epoch (Keras' epoch callbacks) is part of its fit call, which also builds and tears
    # down the distributed input pipeline
    assert len(res["fit_s"]) == 1 and res["fit_s"][0] > res["epoch_s"][0]
    assert res["cpu_percent"] > 0 and res["peak_rss_mb"] > 100  # TF alone is hundreds of MB
    assert not no_children_left()


def test_the_untimed_warm_up_leaves_no_step_behind(shared_data, monkeypatch):
    """Two untimed batches per batch size trace the step; the run then starts from the initial
    weights and optimizer state: its step counter counts the timed epochs' steps alone."""
    monkeypatch.setenv("LABS_DATA_MIRROR", str(shared_data))
    spec = mirrored.job(
        2, keras.optimizers.SGD(0.01, momentum=0.9), [64, 128], n=256, test_size=200
    )
    res = mirrored.run(spec, name="test-warmup")
    assert res["examples"] == [256, 256] and res["steps"] == 256 // 64 + 256 // 128, res


def test_a_crash_is_reported_and_the_configuration_runs_once_more(shared_data, monkeypatch, capsys):
    monkeypatch.setenv("LABS_DATA_MIRROR", str(shared_data))
    res = mirrored.run(tiny_job(signal="SIGSEGV", attempts=[1]), name="test")
    assert res["attempts"] == 2 and res["test_acc"]
    assert (
        "test: the child process killed by SIGSEGV; running it once more" in capsys.readouterr().out
    )


def test_a_crash_on_every_attempt_fails_naming_the_signal_and_the_log():
    with pytest.raises(
        mirrored.MirroredRunError,
        match=r"killed by SIGABRT \(attempt 2 of 2\)"
        r"[\s\S]*--- last lines of .*test-\d+-2\.log ---",
    ):
        mirrored.run(tiny_job(signal="SIGABRT", attempts=[1, 2]), name="test")
    assert not no_children_left()


def test_a_run_past_its_timeout_is_ended_and_not_retried():
    with pytest.raises(mirrored.MirroredRunError, match=r"timed out after 1 s \(attempt 1 of 2\)"):
        mirrored.run(tiny_job(signal="SIGSTOP", attempts=[1]), name="test", timeout=1)  # hangs
    assert not no_children_left()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"replicas": 0}, "replicas must be an integer >= 1, got 0"),
        (
            {"batches": []},
            r"batches must list one batch size per epoch, each from 1 to n=256, got \[\]",
        ),
        ({"batches": [512]}, r"each from 1 to n=256, got \[512\]"),
        ({"evaluate": "never"}, r"evaluate must be one of \('epoch', 'end'\), got 'never'"),
        ({"optimizer": "adam"}, "optimizer must be a Keras optimizer, got 'adam'"),
    ],
)
def test_bad_values_are_refused_naming_them(kwargs, message):
    args = {"replicas": 2, "optimizer": keras.optimizers.Adam(1e-3), "batches": [64], "n": 256}
    with pytest.raises(ValueError, match=message):
        mirrored.job(**{**args, **kwargs})


def test_global_batches_are_rounded_up_to_a_multiple_of_the_replicas():
    spec = mirrored.job(4, keras.optimizers.SGD(0.1), [30, 64, 130], n=1000)
    assert spec["batches"] == [32, 64, 132]
