"""Where a cluster's processes run: on this machine (the default), or on hosts reached by SSH.

    LocalCluster(workers=4, ps=2, placement=SSH(["node1", "node2", "node3"]))

A placement gives each process ("ps:0", "worker:1", ...) a host, round robin with the PS tasks
first (so that they land on different hosts), and a port on it; checks every host before
anything starts; and wraps the command that starts a node so that it runs there. The launcher
(launcher.py) watches the nodes through the same control channel as on one machine.

What an SSH placement needs of the hosts, and checks first (one line per host that fails):
reachable by `ssh <host>` without a password; this repository at the same path with the same
code (`repo`, the same version of helpers/); the data (LABS_DATA_MIRROR or the data cache);
the ports free; and the runs folder shared (NFS home, a cluster's scratch), since every node
writes its event log into the run's folder. A host with a public address is refused unless
`allow_public=True`: TensorFlow's servers listen on every interface of their host and ask
nobody for a password.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from helpers import config
from helpers.system import clock, remote
from helpers.system.control import Cmd, command

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


class SSH:
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

    remote = True

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
        if not isinstance(port_base, int) or not 1024 <= port_base <= 65000:
            raise ValueError(f"port_base must be a port number in 1024-65000, got {port_base!r}")
        self.hosts = list(hosts)
        self.repo = str(repo or config.REPO_ROOT)
        self.python = python or sys.executable
        self.ssh_config = ssh_config
        self.port_base, self.allow_public = port_base, bool(allow_public)
        self.connect_timeout = connect_timeout
        self.address: dict[str, str] = {}  # host -> the address it was reached at (check())

    def __repr__(self) -> str:
        return f"SSH({self.hosts!r})"

    def assign(self, names: list[str]) -> dict[str, tuple[str, int]]:
        """(host, port) of each process, round robin over the hosts in the order given."""
        placed, used = {}, {}
        for i, name in enumerate(names):
            host = self.hosts[i % len(self.hosts)]
            placed[name] = (host, self.port_base + used.get(host, 0))
            used[host] = used.get(host, 0) + 1
        return placed

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

    def check(self, placed: dict[str, tuple[str, int]], folder: Path) -> None:
        """Probe every host at once; raise HostError with one line per host that cannot take
        part. Sets `address` (each host as the others reach it)."""
        global _WARNED
        token, token_file = secrets.token_hex(8), Path(folder) / "hosts-token"
        token_file.write_text(token)
        ports = {h: [p for _, (host, p) in placed.items() if host == h] for h in self.hosts}
        with ThreadPoolExecutor(len(self.hosts)) as pool:
            answers = pool.map(lambda h: self._probe(h, ports[h], token_file, token), self.hosts)
            found = dict(zip(self.hosts, answers))
        token_file.unlink(missing_ok=True)
        here = remote.code_version(config.REPO_ROOT)
        problems = []
        for host, got in found.items():
            why = got if isinstance(got, str) else self._problems(host, got, here)
            if why:
                problems.append(f"{host}: {why}")
            else:
                self.address[host] = got["reached_at"] or host
        if problems:
            raise HostError(
                f"{len(problems)} of {len(self.hosts)} host(s) cannot take part:\n  "
                + "\n  ".join(problems)
            )
        if not _WARNED:
            warnings.warn(
                f"A cluster on {len(self.hosts)} hosts: {EXPOSURE}. Keep its ports "
                f"({self.port_base}+) private to the hosts (a firewall or a private network; "
                "the README's 'Run it on your cluster' says how).",
                RuntimeWarning,
                stacklevel=4,
            )
            _WARNED = True

    def _probe(self, host: str, ports: list[int], token_file: Path, token: str) -> dict | str:
        argv = ["-m", "helpers.system.remote", "probe", "--ports", ",".join(map(str, ports))]
        argv += ["--token-file", str(token_file), "--token", token]
        cmd = self.command(host, argv, {})
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

    def _problems(self, host: str, got: dict, here: str) -> str:
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


class Nodes:
    """A cluster's processes on their hosts, as the launcher knows them: where each runs, its
    PID there, and for those on other hosts their answers to its pings (lifeline, liveness,
    clock offset).

    Args:
        placement: None (this machine) or a placement (SSH(...)).
        isolate: the cluster's `isolate`; True cannot be had on other hosts.
        silent_s: a node on another host that has answered before and is silent this long
            is lost (its host is down, or cut off).
    """

    def __init__(self, placement, isolate, silent_s: float = 5.0):
        self.placement = Local() if placement is None else placement
        if not isinstance(self.placement, (Local, SSH)):
            raise ValueError(
                "placement must be None (this machine) or a placement such as "
                f"placement.SSH([...]), got {placement!r}"
            )
        if self.placement.remote and isolate is True:
            raise ValueError(
                "isolate=True keeps a cluster inside this machine; a cluster placed on other "
                "hosts cannot be: use isolate='auto' or False"
            )
        self.silent_s = silent_s
        self.hosts: dict[str, str] = {}  # process -> its host ("localhost" on this machine)
        self.node_pids: dict[str, int] = {}  # process -> its PID on its own host
        self.clocks: dict[str, clock.OffsetEstimate] = {}  # remote process -> its clock
        self.heard: dict[str, float] = {}  # remote process -> when it last answered
        self._stop = threading.Event()

    def spec(self, jobs, folder: Path, local_ps_ports) -> dict[str, list[str]]:
        """The cluster file's addresses: the PS tasks' on this machine (`local_ps_ports()`);
        every process's when placed on other hosts (checked first: HostError), where each must
        be reachable by the others."""
        order = {"ps": 0, "worker": 1, "evaluator": 2}  # PS tasks first: on different hosts
        names = [f"{job}:{task}" for job, task in sorted(jobs, key=lambda j: (order[j[0]], j[1]))]
        if not self.placement.remote:
            self.hosts = {name: "localhost" for name in names}
            return {"ps": [f"localhost:{port}" for port in local_ps_ports()]}
        placed = self.placement.assign(names)
        self.placement.check(placed, folder)
        self.hosts = {name: host for name, (host, _) in placed.items()}
        spec: dict[str, list[str]] = {}
        for name, (host, port) in placed.items():  # in order: task 0, 1, ... of each job
            spec.setdefault(name.split(":")[0], []).append(f"{self.placement.address[host]}:{port}")
        return spec

    def command(self, name: str, argv: list[str], env: dict) -> list[str]:
        """The command that starts process `name` (`argv`: this Python and a node's arguments)
        where it is placed, with its lifeline: the parent's PID here, stdin on another host."""
        if not self.placement.remote:
            return argv + ["--parent-pid", str(os.getpid())]
        self.clocks[name] = clock.OffsetEstimate()
        return self.placement.command(self.hosts[name], argv[1:] + ["--remote"], env)

    def start_pinging(self, procs: dict) -> None:
        """Ping every node on another host each second, in a thread, until stop()."""
        if self.placement.remote:
            threading.Thread(target=self._ping, args=(procs,), daemon=True).start()

    def _ping(self, procs: dict) -> None:
        while not self._stop.wait(1.0):
            for proc in list(procs.values()):
                try:
                    proc.send(command(Cmd.PING, t=time.time()))
                except (BrokenPipeError, OSError, ValueError):
                    pass

    def stop(self) -> None:
        """Stop pinging."""
        self._stop.set()

    def pong(self, name: str, msg: dict) -> None:
        """A node answered a ping: it is there, and its clock read msg["node_t"]."""
        self.heard[name] = time.monotonic()
        self.clocks[name].add(msg["t"], msg["node_t"], time.time())

    def silent(self, procs: dict) -> tuple[str, float] | None:
        """The running node silent longest past silent_s, and for how long (s), or None."""
        now = time.monotonic()
        silent = {
            n: now - t
            for n, t in self.heard.items()
            if now - t > self.silent_s and n in procs and procs[n].died() is None
        }
        return max(silent.items(), key=lambda kv: kv[1]) if silent else None

    def tell_ps_lost(self, procs: dict, worker: int) -> None:
        """On other hosts the PS cannot see a worker's PID: tell it the worker is gone."""
        ps0 = procs.get("ps:0")
        if self.placement.remote and ps0 is not None and ps0.died() is None:
            try:
                ps0.send(command(Cmd.DEAD, worker=worker))
            except (BrokenPipeError, OSError, ValueError):
                pass

    def clock_offsets(self) -> dict[str, float]:
        """Each node's clock offset (s, ahead of this machine's) by its log's name ("worker-1");
        {} on this machine."""
        return {
            name.replace(":", "-"): est.offset
            for name, est in self.clocks.items()
            if est.offset is not None
        }

    def where(self, name: str, local_pid: int | None) -> str:
        """A process as errors name it: "worker:1 (pid 123)", or with its host when remote."""
        if not self.placement.remote:
            return f"{name} (pid {local_pid or '?'})"
        pid = self.node_pids.get(name, "?")
        return f"{name} on host {self.hosts.get(name, '?')} (pid {pid} there)"
