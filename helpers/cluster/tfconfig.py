"""Start a TF_CONFIG cluster for TF's own strategies: one OS process per task, always cleaned up.

Each task runs `python -m helpers.cluster.strategies job.json` with its own TF_CONFIG environment
variable, which tells it the cluster and its role. The process plumbing (free ports,
dying with the parent, one process group each, log tails) is helpers/system/processes.py.

Every launch leaves `launch.json` next to its task logs: when each task started, was ready,
began its job and reported, when its process exited and how it ended (`Launch.phases()`
turns it into start-up, training, evaluation and teardown). The tasks are ended together:
MultiWorkerMirroredStrategy catches SIGTERM, so each still-running one costs a grace period.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers import config, files
from helpers.cluster.nodes import Nodes
from helpers.cluster.placement import HostError
from helpers.system import netns, resources
from helpers.system.processes import (
    ChildProcess,
    NoResult,
    end_all,
    free_ports,
    log_section,
    unique_name,
    wait_for_results,
)

ROLES = ("chief", "worker", "ps")


class TFConfigError(RuntimeError):
    """A task of a TF_CONFIG cluster failed, died or timed out."""


def cluster_spec(roles: dict, host: str = "localhost") -> dict:
    """A cluster dict {"worker": ["localhost:PORT", ...], ...} with fresh ports."""
    for role, count in roles.items():
        if role not in ROLES:
            raise ValueError(f"unknown task type {role!r}: use {', '.join(ROLES)}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"the number of {role} tasks must be an integer >= 1, got {count!r}")
    if roles.get("chief", 0) > 1:
        raise ValueError(f"a cluster has at most one chief, got {roles['chief']}")
    if "worker" not in roles:
        raise ValueError(f"a cluster needs at least one worker, got roles {roles}")
    ports = iter(free_ports(sum(roles.values())))
    return {role: [f"{host}:{next(ports)}" for _ in range(count)] for role, count in roles.items()}


def tf_config(cluster: dict, task_type: str, index: int) -> str:
    """The TF_CONFIG value for one task: the whole cluster plus this task's role."""
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


class TFConfigCluster:
    """The processes of one TF_CONFIG cluster, running one job; use as a context manager.

    Args:
        roles: tasks per type, e.g. {"worker": 2} (MultiWorkerMirroredStrategy) or
            {"chief": 1, "worker": 2, "ps": 1} (ParameterServerStrategy).
        job: the job dict every task reads (see helpers.cluster.strategies). Task types listed in
            `servers` get {"kind": "server"} instead.
        servers: task types that only serve (never finish on their own); they are ended
            once every other task is done.
        timeout: seconds to wait for the job before ending every process.
        isolate: "auto" runs every task in a private network namespace when the OS allows it
            (warning once when not), True insists, False never isolates (see
            helpers/system/netns.py).
        placement: None (this machine), or other hosts: placement.Slurm() inside an
            allocation, placement.SSH([...]) (helpers/cluster/placement.py).
    Raises:
        ValueError: for bad roles or timeout, before any process starts.
    """

    def __init__(
        self,
        roles: dict,
        job: dict,
        servers=(),
        timeout: float = 600.0,
        name: str | None = None,
        module: str = "helpers.cluster.strategies",
        isolate="auto",
        placement=None,
    ):
        self.nodes = Nodes(placement, isolate)  # validates `placement`
        self.cluster = cluster_spec(roles)
        if module == "helpers.cluster.strategies":
            from helpers.cluster.strategies import validate

            validate(job, workers=roles.get("worker", 1))
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if set(servers) >= set(roles):
            raise ValueError(f"servers={list(servers)} leaves no task to run the job {roles}")
        self.job, self.servers, self.timeout, self.module = job, tuple(servers), timeout, module
        self.name = name or unique_name("tfconfig")
        self.dir: Path | None = None
        self.procs: dict[str, ChildProcess] = {}
        self.inbox: queue.Queue = queue.Queue()
        remote = self.nodes.placement.remote
        self.network = netns.PrivateNetwork(False if remote else isolate, "TF_CONFIG cluster")
        self.t0: float | None = None
        self.results: dict = {}
        self.ended: dict = {}  # task name -> how it ended and when (see stop)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    @property
    def pids(self) -> dict[str, int]:
        """PID of each task, by name ("worker:0", "ps:0", ...)."""
        return {name: p.pid for name, p in self.procs.items()}

    def start(self) -> "TFConfigCluster":
        """Start one process per task (returns at once; the tasks find each other)."""
        self.t0 = time.time()
        tasks = sum(len(addresses) for addresses in self.cluster.values())
        try:
            resources.check_memory(
                tasks,
                f"A TF_CONFIG cluster of {tasks} tasks",
                lambda fit: f"Use fewer tasks ({fit} would fit)",
            )
        except resources.NotEnoughMemory as exc:
            raise TFConfigError(str(exc)) from None
        try:
            prefix = self.network.start().prefix  # only loopback inside, when possible
        except netns.IsolationError as exc:
            raise TFConfigError(str(exc)) from None
        self.dir = config.runs_dir("tfconfig", self.name)
        job_files = {}
        for kind, job in (("job", self.job), ("server", {"kind": "server"})):
            job_files[kind] = self.dir / f"{kind}.json"
            job_files[kind].write_text(json.dumps(job))
        # The task logs are files, for diagnosis: they keep TF's C++ warnings (level 1 drops
        # only INFO), which helpers/__init__.py hides from the notebooks.
        env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="1")
        try:
            names = [f"{r}:{i}" for r, addrs in self.cluster.items() for i in range(len(addrs))]
            if self.nodes.placement.remote:
                self._place(names)
            argv, envs = {}, {}
            for name in names:
                role, index = name.split(":")
                job_file = job_files["server" if role in self.servers else "job"]
                argv[name] = prefix + [sys.executable, "-m", self.module, str(job_file)]
                envs[name] = {"TF_CONFIG": tf_config(self.cluster, role, int(index))}
            self.procs.update(
                self.nodes.start(argv, env, self.dir, self.inbox, envs, self.network.pid)
            )
            self.nodes.start_pinging(self.procs)
        except BaseException:
            self.stop()
            raise
        return self

    def _place(self, names: list[str]) -> None:
        """Every task's address on its host, the hosts checked first."""
        try:
            self.cluster = self.nodes.place(names, self.dir)
        except HostError as exc:
            raise TFConfigError(str(exc)) from None

    def wait(self) -> dict:
        """Wait until every non-server task reports its result; return them by task name.

        Raises:
            TFConfigError: a task exited without a result, or the timeout passed (every
                process is ended first, and the error shows the failing task's log tail).
        """
        tasks = [n for n in self.procs if n.split(":")[0] not in self.servers]
        try:
            self.results = wait_for_results(self.procs, self.inbox, tasks, self.timeout)
            return self.results
        except NoResult as exc:
            failed = exc
        if failed.how.startswith("timed out"):
            self._fail(f"{failed.how} waiting for {failed.waiting}", failed.name)
        where = self.nodes.where(failed.name, self.procs[failed.name].pid)
        self._fail(f"{where} {failed.how} before reporting a result", failed.name)

    def _fail(self, what: str, name: str):
        log = self.procs[name].log_path
        self.stop()
        raise TFConfigError(what + log_section(log))

    def stop(self) -> None:
        """End every task's process group at once (idempotent); write the launch timeline."""
        if self.procs:
            self.ended = end_all(self.procs.values())
            self.procs.clear()
            files.write_json(self.dir / "launch.json", self.timeline())
        self.nodes.stop()  # after end_all: it removes the processes' temporary files
        self.network.stop()

    def timeline(self) -> dict:
        """Seconds from the launch to each task's milestones: from the task itself (process
        started, strategy ready, first training step, result) and from the launcher (stdout
        closed, i.e. exiting; gone), plus how it ended; for MWMS, each run's start, set-up end,
        epochs end, return and end (after its resource monitor). Written to launch.json at stop."""
        out = {}
        for name, end in self.ended.items():
            result = self.results.get(name) or {}
            row = {key: t - self.t0 for key, t in result.get("times", {}).items()}
            for i, run in enumerate(result.get("runs", [])):  # MWMS: each run's parts
                row.update({f"run{i}:{key}": t - self.t0 for key, t in run["times"].items()})
            for key in ("eof_at", "gone_at"):
                if end[key] is not None:
                    row[key.replace("_at", "")] = end[key] - self.t0
            out[name] = dict(row, ended=end["how"])
        return out


@dataclass
class Launch:
    """What one cluster launch gave: each task's result, resources and timeline, and its wall time.

    `results` maps task name -> its result; `resources` task name -> {"cpu_percent",
    "peak_rss_mb", "peak_pss_mb", "peak_uss_mb"} sampled with psutil (ResourceMonitor); `timeline`
    is `TFConfigCluster.timeline()`;
    `log_dir` holds each task's log and launch.json.
    """

    results: dict
    resources: dict
    wall_s: float
    timeline: dict
    log_dir: Path
    isolated: bool = False  # in a private network namespace: its loopback is the cluster's own

    def phases(self) -> dict:
        """Where the wall time went, in seconds; the parts add up to `wall_s`.

        - startup: launch until the last task starts its job (every process started,
          imported TF, joined the cluster and loaded its data; the first step needs them all);
        - train, eval: the lead task's (chief:0, else worker:0) training steps and evaluation;
        - other: the rest of the job (building each run's model and dataset, waiting);
        - teardown: the last result until every process is gone;
        - overhead: wall time minus training and evaluation (startup + other + teardown).
        """
        done = {n: row for n, row in self.timeline.items() if "result" in row}
        lead = min(done, key=lambda n: (n.split(":")[0] != "chief", n))
        startup = max(row["job_start"] for row in done.values())
        last_result = max(row["result"] for row in done.values())
        teardown = max(row["gone"] for row in self.timeline.values()) - last_result
        train = self.results[lead]["train_s"]
        evaluate = self.results[lead].get("eval_s", 0.0)
        overhead = self.wall_s - train - evaluate
        return {
            "wall_s": self.wall_s,
            "startup_s": startup,
            "train_s": train,
            "eval_s": evaluate,
            "other_s": overhead - startup - teardown,
            "teardown_s": teardown,
            "overhead_s": overhead,
        }


def run(
    roles: dict,
    job: dict,
    servers=(),
    timeout: float = 600.0,
    name: str | None = None,
    isolate="auto",
    placement=None,
) -> Launch:
    """Start a cluster, run `job`, end every process; return the Launch.

    Raises:
        TFConfigError: a task failed or `timeout` seconds passed; every process is ended first,
            and the message has the task's log tail.
    """
    from helpers.system.resources import ResourceMonitor

    t0 = time.perf_counter()
    with TFConfigCluster(
        roles, job, servers, timeout, name, isolate=isolate, placement=placement
    ) as cluster:
        names = {pid: n for n, pid in cluster.pids.items()}
        isolated = cluster.network.isolated  # (stopping the cluster ends the namespace)
        with ResourceMonitor(list(names), interval=0.5, pss_every=2.0) as monitor:
            results = cluster.wait()
    resources = {names[pid]: v for pid, v in monitor.summary().items()}
    return Launch(
        results, resources, time.perf_counter() - t0, cluster.timeline(), cluster.dir, isolated
    )
