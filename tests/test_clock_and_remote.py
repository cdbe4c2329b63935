"""The pure parts of running on several hosts: clock offsets and their use on a run's stamps,
the command that reaches a host, what is forwarded to it, and what counts as public."""

import json
import shlex

import pytest

from helpers.cluster import placement
from helpers.cluster.events import StepStamps
from helpers.cluster.rundir import RunDir
from helpers.system import clock, remote, slurm


def test_the_least_delayed_round_trip_gives_the_offset_within_half_its_delay():
    est = clock.OffsetEstimate()
    assert est.offset is None and est.significant == 0.0
    est.add(sent=100.0, remote=100.30, received=100.04)  # rtt 40 ms: offset 0.28 +- 0.02
    est.add(sent=101.0, remote=101.251, received=101.002)  # rtt 2 ms: offset 0.25 +- 0.001
    est.add(sent=102.0, remote=102.9, received=101.9)  # a clock stepped back: ignored
    assert est.offset == pytest.approx(0.25, abs=1e-9)
    assert est.error == pytest.approx(0.001)
    assert est.significant == est.offset
    same = clock.OffsetEstimate()
    same.add(sent=5.0, remote=5.0015, received=5.002)  # 0.5 ms within +-1 ms: the same clock
    assert same.offset == pytest.approx(0.0005) and same.significant == 0.0


def test_a_process_takes_its_own_clock_shift(monkeypatch):
    monkeypatch.setattr(clock, "SHIFT", 0.0)
    monkeypatch.setenv(clock.SHIFT_ENV, "ps:0=-0.1, worker:1=0.25")
    assert clock.use_shift_of("worker:0") == 0.0
    assert clock.use_shift_of("worker:1") == 0.25
    monkeypatch.setenv(clock.SHIFT_ENV, "worker:1=soon")
    with pytest.raises(ValueError, match="'worker:1=soon' is not name=seconds"):
        clock.use_shift_of("worker:1")


def _step(stamps, fetched=True):
    return {"t": stamps[-1], "kind": "step", "worker": 1, "fetched": fetched, "stamps": stamps}


def test_a_steps_stamps_are_put_on_the_drivers_clock_each_by_its_own_clock(tmp_path):
    run = RunDir(tmp_path)
    # worker 1 is 10 s ahead, PS task 0 on time; the token's stamps were read on the PS
    w = [10.0, 10.1, 0.15, 0.2, 10.3, 10.4, 10.5, 10.6]
    (tmp_path / "worker-1.jsonl").write_text(json.dumps(_step(w)) + "\n")
    run.write_clock_offsets({"worker-1": 10.0, "ps-0": 0.0})
    got = StepStamps(*run.events().stamps[0])
    assert got == pytest.approx(StepStamps(0.0, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6))
    assert run.events().t[0] == pytest.approx(0.6)
    # an offset known to a millisecond: the PS's stamps stay between the worker's own
    w = [10.0, 10.1, 0.0995, 0.0998, 10.3, 10.4, 10.5, 10.6]  # read 0.5 ms before `called`
    (tmp_path / "worker-1.jsonl").write_text(json.dumps(_step(w)) + "\n")
    got = StepStamps(*run.events().stamps[0])
    assert got.called <= got.reached <= got.granted <= got.arrived
    assert got.reached == pytest.approx(0.1) and got.granted == pytest.approx(0.1)
    # a step that did not fetch read every stamp on the worker
    w = [10.0, 10.1, 10.1, 10.1, 10.1, 10.4, 10.5, 10.6]
    (tmp_path / "worker-1.jsonl").write_text(json.dumps(_step(w, fetched=False)) + "\n")
    assert StepStamps(*run.events().stamps[0]).reached == pytest.approx(0.1)


def test_the_ssh_command_quotes_what_it_forwards():
    env = {
        "LABS_QUICK": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "HOME": "/root",
        "LABS_LIFELINE": "3:9",
        "TMPDIR": "/runs/cluster-1/tmp",  # the cluster's (nodes.py): TF's files go there
    }
    forwarded = remote.forwarded_env(env)
    assert forwarded == {
        "LABS_QUICK": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TMPDIR": "/runs/cluster-1/tmp",
    }
    cmd = remote.ssh_command(
        "me@lab 1", ["python", "-c", "print('a b')"], cwd="/my repo", env={"LABS_X": "a b"}
    )
    assert cmd[:2] == ["ssh", "-T"] and "BatchMode=yes" in cmd and cmd[-2] == "me@lab 1"
    assert shlex.split(cmd[-1]) == [
        "cd", "/my repo", "&&", "exec", "env", "LABS_X=a b", "python", "-c", "print('a b')",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "address, public",
    [
        ("10.0.0.2", False),
        ("192.168.1.5", False),
        ("172.16.4.1", False),
        ("127.0.0.1", False),
        ("fe80::1%eth0", False),
        ("fd00::5", False),
        ("8.8.4.4", True),
        ("2001:4860::8888", True),
        ("not an address", False),
    ],
)
def test_public_addresses(address, public):
    assert remote.is_public(address) is public


def test_the_placement_a_session_offers(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv(placement.HOSTS_ENV, raising=False)
    assert placement.detect() is None  # this machine
    monkeypatch.setenv(placement.HOSTS_ENV, " lab1, lab2 ,")
    found = placement.detect()
    assert isinstance(found, placement.SSH) and found.hosts == ["lab1", "lab2"]
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("PATH", "/nonexistent")  # no srun: not inside a usable allocation
    assert isinstance(placement.detect(), placement.SSH)
    with pytest.raises(slurm.SlurmError, match="no Slurm allocation: run inside salloc or sbatch"):
        monkeypatch.delenv("SLURM_JOB_ID")
        placement.Slurm()


def test_a_process_start_is_read_before_its_first_line_and_not_a_second_early():
    """A child stamps time.time() on its first line, then reads process_started(): the start
    comes before the stamp, by no more than an interpreter's start (psutil's create_time on
    Linux could read up to a second early, before the parent even launched it)."""
    import subprocess
    import sys
    import time

    code = (
        "import time; first = time.time()\n"
        "from helpers.system.clock import process_started\n"
        "print(first, process_started())"
    )
    launched = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first, started = map(float, out.stdout.split())
    assert launched - 0.05 <= started <= first, (launched, started, first)
    assert first - started < 2.0, (started, first)  # an interpreter's start, even when loaded


def test_without_proc_uptime_the_process_start_is_psutils(monkeypatch):
    import builtins

    import psutil

    real_open = builtins.open

    def no_uptime(path, *args, **kwargs):
        if str(path) == "/proc/uptime":
            raise FileNotFoundError(path)  # as on macOS, which has no /proc
        return real_open(path, *args, **kwargs)  # psutil reads /proc/<pid>/stat itself

    monkeypatch.setattr(builtins, "open", no_uptime)
    assert clock.process_started() == psutil.Process().create_time()
