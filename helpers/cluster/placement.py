"""Where a cluster's processes run: on this machine (the default), on the nodes of a Slurm
allocation, or on hosts reached by SSH.

    LocalCluster(workers=4, ps=2, placement=Slurm())                 # inside salloc / sbatch
    LocalCluster(workers=4, ps=2, placement=SSH(["node1", "node2", "node3"]))

A placement gives each process ("ps:0", "worker:1", ...) a host, round robin with the PS tasks
first (so that they land on different hosts), and a port on it; checks every host before
anything starts; and starts the processes there: one ssh client each, or the tasks of one srun
step. The launcher watches them through the same control channel as on one machine (nodes.py).

What a placement needs of the hosts, and checks first (one line per host that fails):
reachable (by `ssh <host>` without a password, or as a node of the allocation); this
repository at the same path with the same code (`repo`, the same version of helpers/); the data
(LABS_DATA_MIRROR or the data cache); the ports free; and the runs folder shared (NFS home, a
cluster's scratch), since every node writes its event log into the run's folder. A host with a
public address is refused unless `allow_public=True`: TensorFlow's servers listen on every
interface of their host and ask nobody for a password.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from helpers import config, files
from helpers.system import remote, slurm
from helpers.system.processes import ChildProcess

EXPOSURE = (
    "TensorFlow's gRPC servers listen on every network interface of their host and accept "
    "anyone who connects: no password, no encryption"
)
_WARNED = False


class HostError(RuntimeError):
    """A host of a placement cannot take part: each line says which host, and why."""


class Local:
    """Every process on this machine (the default placement)."""

    remote = False

    def __repr__(self) -> str:
        return "Local()"


class Hosts:
    """What SSH and Slurm placements share: the options, the assignment of processes to hosts,
    and the check of every host before anything starts."""

    remote = True
    hosts: list[str]
    what = "host"

    def __init__(self, repo, python, port_base, allow_public):
        if not isinstance(port_base, int) or not 1024 <= port_base <= 65000:
            raise ValueError(f"port_base must be a port number in 1024-65000, got {port_base!r}")
        self.repo = str(repo or config.REPO_ROOT)
        self.python = python or sys.executable
        self.port_base, self.allow_public = port_base, bool(allow_public)
        self.address: dict[str, str] = {}  # host -> the address the others reach it at

    def assign(self, names: list[str]) -> dict[str, tuple[str, int]]:
        """(host, port) of each process, round robin over the hosts in the order given."""
        placed, used = {}, {}
        for i, name in enumerate(names):
            host = self.hosts[i % len(self.hosts)]
            placed[name] = (host, self.port_base + used.get(host, 0))
            used[host] = used.get(host, 0) + 1
        return placed

    def check(self, placed: dict[str, tuple[str, int]], folder: Path) -> None:
        """Probe every host at once; raise HostError with one line per host that cannot take
        part. Sets `address` (each host as the others reach it)."""
        global _WARNED
        token, token_file = secrets.token_hex(8), Path(folder) / "hosts-token"
        token_file.write_text(token)
        ports = {h: [p for _, (host, p) in placed.items() if host == h] for h in self.hosts}
        try:
            found = self._probe_all(ports, token_file, token)
        finally:
            token_file.unlink(missing_ok=True)
        here = remote.code_version(config.REPO_ROOT)
        problems = []
        for host in self.hosts:
            got = found.get(host, "did not answer the check")
            why = got if isinstance(got, str) else self._problems(got, here)
            if why:
                problems.append(f"{host}: {why}")
            elif host not in self.address:
                self.address[host] = got["reached_at"] or host
        if problems:
            raise HostError(
                f"{len(problems)} of {len(self.hosts)} {self.what}(s) cannot take part:\n  "
                + "\n  ".join(problems)
            )
        if not _WARNED:
            warnings.warn(
                f"A cluster on {len(self.hosts)} {self.what}s: {EXPOSURE}. Keep its ports "
                f"({self.port_base}+) private to them (a firewall or a private network: "
                "docs/cluster.md, 'Keep the ports private').",
                RuntimeWarning,
                stacklevel=5,
            )
            _WARNED = True

    def _probe_all(self, ports: dict, token_file: Path, token: str) -> dict:
        raise NotImplementedError

    def _probe_argv(self, ports: list[int], token_file: Path, token: str) -> list[str]:
        argv = ["-m", "helpers.system.remote", "probe", "--ports", ",".join(map(str, ports))]
        return argv + ["--token-file", str(token_file), "--token", token]

    def _problems(self, got: dict, here: str) -> str:
        """What keeps a probed host out, in one line ("" when nothing does)."""
        why = []
        public = [a for a in got["addresses"] if remote.is_public(a)]
        if public and not self.allow_public:
            why.append(
                f"has the public address(es) {', '.join(public)}: {EXPOSURE}, so anyone on the "
                "internet could reach them; use hosts on a private network, or pass "
                "allow_public=True if a firewall keeps the ports closed"
            )
        if got["code"] != here:
            why.append(
                f"runs other code (helpers/ {got['code']}, here {here}): update its copy of "
                f"{self.repo}"
            )
        if got["data"]:
            why.append(got["data"])
        if got["busy_ports"]:
            why.append(f"port(s) {got['busy_ports']} in use: choose another port_base")
        if not got["shared_runs"]:
            why.append(
                f"does not see the runs folder {config.runs_dir(create=False)}: put it on a "
                "folder every host mounts at the same path (LABS_RUNS_DIR)"
            )
        return "; ".join(why)


class SSH(Hosts):
    """Processes on other hosts, started through the system's `ssh`.

    Args:
        hosts: host names or addresses as `ssh` takes them ("node1", "me@10.0.0.2"); a
            process's host is the next one round robin, the PS tasks first.
        repo: this repository's folder on the hosts (default: its folder here).
        python: the Python on the hosts (default: this one's path).
        ssh_config: an ssh_config file to use instead of ~/.ssh/config (`ssh -F`).
        port_base: the first port a host's processes listen on (then +1, +2, ...).
        allow_public: place processes on a host with a public address, whose TF ports
            anyone on the internet could reach (see the module's docstring).
        connect_timeout: seconds `ssh` may take to connect.
    Raises:
        ValueError: for a bad argument.
    """

    def __init__(
        self,
        hosts,
        *,
        repo: str | None = None,
        python: str | None = None,
        ssh_config: str | None = None,
        port_base: int = 2222,
        allow_public: bool = False,
        connect_timeout: float = 10.0,
    ):
        if isinstance(hosts, str) or not hosts or not all(isinstance(h, str) and h for h in hosts):
            raise ValueError(f"hosts must be a non-empty list of host names, got {hosts!r}")
        super().__init__(repo, python, port_base, allow_public)
        self.hosts = list(hosts)
        self.ssh_config = ssh_config
        self.connect_timeout = connect_timeout

    def __repr__(self) -> str:
        return f"SSH({self.hosts!r})"

    def command(self, host: str, argv: list[str], env: dict) -> list[str]:
        """The command that runs `argv` (a Python module's arguments) on `host`."""
        return remote.ssh_command(
            host,
            [self.python, *argv],
            cwd=self.repo,
            env=remote.forwarded_env(env),
            ssh_config=self.ssh_config,
            connect_timeout=self.connect_timeout,
        )

    def start(self, names, argv, envs, logs, inbox, hosts) -> dict:
        """One ssh client per process, each a ChildProcess of this one."""
        cmds = {n: self.command(hosts[n], argv[n][1:], envs[n]) for n in names}
        return {n: ChildProcess(n, cmds[n], envs[n], logs[n], inbox) for n in names}

    def _probe_all(self, ports: dict, token_file: Path, token: str) -> dict:
        with ThreadPoolExecutor(len(self.hosts)) as pool:
            answers = pool.map(lambda h: self._probe(h, ports[h], token_file, token), self.hosts)
            return dict(zip(self.hosts, answers))

    def _probe(self, host: str, ports: list[int], token_file: Path, token: str) -> dict | str:
        cmd = self.command(host, self._probe_argv(ports, token_file, token), {})
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=self.connect_timeout + 30,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return f"no answer in {self.connect_timeout + 30:.0f} s (`{' '.join(cmd[:-1])} ...`)"
        if done.returncode == 255:
            last = (done.stderr.strip().splitlines() or ["ssh failed"])[-1]
            return f"unreachable by ssh ({last}); check `ssh {host} true` works without a password"
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return (
                f"cannot run this project's Python in {self.repo} with {self.python} ({last}); "
                "set repo= and python= to where they are on the hosts"
            )
        return json.loads(done.stdout.strip().splitlines()[-1])


class Slurm(Hosts):
    """Processes on the nodes of a Slurm allocation, the tasks of one `srun` step.

    Run inside the allocation (`salloc`, `sbatch`, or a Jupyter kernel on an allocated node):
    its nodes, and their addresses (NodeAddr), come from Slurm (helpers.system.slurm).

    Args:
        job: the allocation's job id (default: SLURM_JOB_ID, which Slurm sets inside it).
        srun_args: more arguments for srun; the default, --overlap, lets the step share CPUs
            with the batch script or the kernel that starts it. Add "--overcommit" where the
            step has more tasks than the allocation has CPUs.
        repo, python, port_base, allow_public: as for SSH.
    Raises:
        ValueError: for a bad argument; slurm.SlurmError outside an allocation.
    """

    what = "node"

    def __init__(
        self,
        job: str | None = None,
        *,
        srun_args=("--overlap",),
        repo: str | None = None,
        python: str | None = None,
        port_base: int = 2222,
        allow_public: bool = False,
    ):
        super().__init__(repo, python, port_base, allow_public)
        self.job = str(job or os.environ.get("SLURM_JOB_ID", ""))
        if not self.job:
            raise slurm.SlurmError(
                "no Slurm allocation: run inside salloc or sbatch (SLURM_JOB_ID is unset), or "
                "pass Slurm(job=<job id>)"
            )
        self.srun_args = list(srun_args)
        self.hosts = slurm.job_nodes(self.job)
        self.address = slurm.node_addresses(self.hosts)

    def __repr__(self) -> str:
        return f"Slurm(job={self.job!r}, nodes={self.hosts!r})"

    def srun(self, n: int, extra: list[str], argv: list[str]) -> list[str]:
        """The srun command of a step of `n` tasks in the allocation, running this Python."""
        return [
            "srun", f"--jobid={self.job}", f"--ntasks={n}", "--label", "--unbuffered",
            "--kill-on-bad-exit=0", "--no-kill", f"--chdir={self.repo}", *extra,
            *self.srun_args, self.python, *argv,
        ]  # fmt: skip

    def start(self, names, argv, envs, logs, inbox, hosts) -> dict:
        """One srun step: task i on the node of names[i] (SLURM_HOSTFILE), running argv[names[i]]
        with its own variables and log (slurm.TASK), each a StepTask."""
        folder = Path(logs[names[0]]).parent
        hostfile, tasks = folder / "slurm-hosts", folder / "slurm-tasks.json"
        hostfile.write_text("".join(f"{hosts[n]}\n" for n in names))
        first = envs[names[0]]
        # TMPDIR in each task's own variables, which the task sets last: a site's task
        # prolog may set its own in the step's environment
        common = {
            k: v
            for k, v in first.items()
            if k != "TMPDIR" and all(envs[n].get(k) == v for n in names)
        }
        files.write_json(
            tasks,
            [
                {
                    "argv": [self.python, *argv[n][1:]],
                    "env": {k: v for k, v in envs[n].items() if k not in common},
                    "log": str(logs[n]),
                }
                for n in names
            ],
        )
        cmd = self.srun(len(names), ["--distribution=arbitrary"], [*slurm.TASK, str(tasks)])
        step_env = dict(common, SLURM_HOSTFILE=str(hostfile))
        step = slurm.SrunStep(cmd, step_env, names, folder / "srun.log", inbox)
        return step.tasks(logs)

    def _probe_all(self, ports: dict, token_file: Path, token: str) -> dict:
        every = sorted({p for ps in ports.values() for p in ps})
        cmd = self.srun(len(self.hosts), ["--ntasks-per-node=1"], [])
        cmd += self._probe_argv(every, token_file, token)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return {}
        found = {}
        for line in done.stdout.splitlines():
            _, _, body = line.partition(": ")
            try:
                got = json.loads(body)
            except ValueError:
                continue
            got["busy_ports"] = [p for p in got["busy_ports"] if p in ports.get(got["node"], [])]
            got["reached_at"] = self.address.get(got["node"])
            found[got["node"]] = got
        if not found:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return {h: f"the check's srun step failed ({last})" for h in self.hosts}
        return found


HOSTS_ENV = "LABS_HOSTS"  # "host1,host2,...": the hosts detect() places a cluster on over SSH


def detect():
    """The placement this session offers: Slurm() inside an allocation (SLURM_JOB_ID set and
    srun on PATH), SSH over the hosts in LABS_HOSTS ("host1,host2"), else None (this machine).
    """
    import shutil

    if os.environ.get("SLURM_JOB_ID") and shutil.which("srun"):
        return Slurm()
    hosts = [h.strip() for h in os.environ.get(HOSTS_ENV, "").split(",") if h.strip()]
    return SSH(hosts) if hosts else None
