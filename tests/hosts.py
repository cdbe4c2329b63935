"""Test scaffolding: several "machines" on this one, each a network namespace with an address
of its own on a private bridge, and an sshd in each that takes a key the test made.

    with NamespacedHosts(3, tmp_path) as hosts:
        SSH(hosts.addresses, ssh_config=hosts.ssh_config)
        hosts.pids_in(0)          # every process in host 0's namespace, sshd excepted
        hosts.link(0, up=False)   # cut host 0 off the network

Needs root, iproute2 and OpenSSH's server (CI installs and runs as root). The namespaces
share this machine's file system, PID space and clock: a test that needs a host's clock off
shifts a process's readings instead (helpers.system.clock). Everything it starts it ends by PID,
and it deletes its namespaces, veth pairs and bridge.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def unavailable_reason() -> str | None:
    """Why namespaced hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "namespaced hosts need root (CI runs as root)"
    missing = [t for t in ("ip", "ssh", "ssh-keygen") if shutil.which(t) is None]
    missing += [SSHD] * (not Path(SSHD).exists())
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install iproute2 openssh-server)"
    return None


def slurm_unavailable_reason() -> str | None:
    """Why SlurmOnHosts cannot run here, or None."""
    missing = [t for t in ("slurmctld", "slurmd", "srun", "munged", "nsenter", "setpriv")
               if shutil.which(t) is None]  # fmt: skip
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge)"
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def _free_subnet() -> int:
    """A third octet X with 10.78.X.0/24 unused on this machine."""
    used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    for x in list(range(os.getpid() % 200, 250)) + list(range(0, 250)):
        if f"10.78.{x}." not in used:
            return x
    raise RuntimeError("no free 10.78.X.0/24 subnet for the test hosts")


def _describe(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        return f"{pid} {cmdline.decode()}"
    except OSError:
        return f"{pid} (gone)"


class _Started:
    """A context manager over _start() and close(): close() also when _start() fails half-way."""

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def updates_in(run_dir: Path) -> int:
    """PS updates logged so far in the run folder `run_dir` (0 before its log exists)."""
    try:
        return (Path(run_dir) / "ps-0.jsonl").read_text().count('"kind": "update"')
    except OSError:
        return 0


def tf_files_in_the_cluster_folder(cluster) -> Path:
    """Check that a trained cluster's node on another host wrote TF's file for each function
    it traced into the cluster's folder (which stop() removes), not its host's temp folder;
    return that folder."""
    import psutil

    tmp = cluster.dir / "tmp"
    pid = cluster.nodes.node_pids["worker:0"]
    assert psutil.Process(pid).environ()["TMPDIR"] == str(tmp)
    assert list(tmp.glob("__autograph_generated_file*.py")), list(tmp.iterdir())
    return tmp


def driver_mid_run(script: str, args: list[str], runs_dir: Path, run_id: str, updates=20):
    """Start a driver (`python -c script *args`) whose run `run_id` goes to `runs_dir`; return
    its Popen (stdin, stdout, stderr piped) once that run has made `updates` PS updates."""
    import sys

    parent = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, LABS_RUNS_DIR=str(runs_dir)),
    )
    deadline = time.monotonic() + 120
    while updates_in(Path(runs_dir) / run_id) < updates:
        if time.monotonic() > deadline or parent.poll() is not None:
            parent.kill()
            raise AssertionError(f"the driver's run never got going: {parent.communicate()[1]}")
        time.sleep(0.2)
    return parent


def kill_mid_run(cluster, host: str, run_id: str, **train) -> tuple[BaseException, float]:
    """SIGKILL every process of `cluster` on `host` once its run `run_id` has made 10 PS
    updates; return the error the run raised and when the processes were killed."""
    import threading

    from helpers import config

    mine = [p for n, p in cluster.nodes.node_pids.items() if cluster.nodes.hosts[n] == host]
    run_dir, killed = config.runs_dir(run_id, create=False), []

    def kill():
        deadline = time.monotonic() + 120
        while updates_in(run_dir) < 10:
            if time.monotonic() > deadline:
                return
            time.sleep(0.2)
        for pid in mine:
            os.kill(pid, signal.SIGKILL)
        killed.append(time.monotonic())

    threading.Thread(target=kill, daemon=True).start()
    try:
        cluster.train(run_id=run_id, **train)
    except BaseException as exc:  # the caller checks what it is
        assert killed, f"the run failed before the kill: {exc}"
        return exc, killed[0]
    raise AssertionError(f"run {run_id} went on after {host}'s processes were killed")


class NamespacedHosts(_Started):
    """`n` hosts: namespaces labs<tag>h<i>, addresses 10.78.X.(i+2), sshd on port 22 in each."""

    def __init__(self, n: int, folder: Path):
        self.n, self.folder = n, Path(folder)
        self.tag = f"{os.getpid() % 100000}"
        self.bridge = f"lb{self.tag}"
        self.names = [f"labs{self.tag}h{i}" for i in range(n)]
        self.subnet = None
        self.addresses: list[str] = []
        self.sshd: list[subprocess.Popen] = []
        self.daemon_pids: set[int] = set()  # the hosts' own daemons: sshd, slurmd
        self.ssh_config = self.folder / "ssh_config"

    def _start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        key, hostkey = self.folder / "id_test", self.folder / "hostkey"
        for k in (key, hostkey):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)],
                check=True,
                timeout=30,
            )
        self.subnet = _free_subnet()
        net = f"10.78.{self.subnet}"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{net}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        for i, ns in enumerate(self.names):
            address = f"{net}.{i + 2}"
            _ip("netns", "add", ns)
            _ip("link", "add", f"{ns}v", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", f"{ns}v", "master", self.bridge, "up")
            _ip("link", "set", "lo", "up", netns=ns)
            _ip("addr", "add", f"{address}/24", "dev", "eth0", netns=ns)
            _ip("link", "set", "eth0", "up", netns=ns)
            conf = self.folder / f"sshd-{i}.conf"
            conf.write_text(
                f"ListenAddress {address}\nHostKey {hostkey}\n"
                f"AuthorizedKeysFile {key}.pub\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                f"StrictModes no\nPidFile {self.folder}/sshd-{i}.pid\nLogLevel ERROR\n"
                "MaxStartups 100\nMaxSessions 100\nClientAliveInterval 2\nClientAliveCountMax 3\n"
            )
            self.sshd.append(
                subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        ns,
                        SSHD,
                        "-D",
                        "-f",
                        str(conf),
                        "-E",
                        str(self.folder / f"sshd-{i}.log"),
                    ],
                    start_new_session=True,
                )
            )
            self.daemon_pids.add(self.sshd[-1].pid)
            self.addresses.append(address)
        self.ssh_config.write_text(
            f"Host {net}.*\n  User root\n  IdentityFile {key}\n  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        )
        for address in self.addresses:  # every sshd answers before the test goes on
            deadline = time.monotonic() + 20
            while subprocess.run(
                ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", address, "true"],
                capture_output=True,
                timeout=30,
            ).returncode:
                assert time.monotonic() < deadline, f"sshd on {address} never answered"
                time.sleep(0.2)

    def pids_in(self, i: int) -> list[int]:
        """The processes in host i's namespace other than its sshd daemon."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.names[i]], capture_output=True, text=True
        ).stdout.split()
        return [int(p) for p in out if int(p) not in self.daemon_pids]

    def wait_empty(self, timeout: float) -> dict[int, list[str]]:
        """Wait up to `timeout` s for every host to run nothing but its sshd; return what is
        left (host -> "pid command line"), {} when nothing is."""
        deadline = time.monotonic() + timeout
        while True:
            left = {i: self.pids_in(i) for i in range(len(self.names))}
            left = {i: p for i, p in left.items() if p}
            if not left or time.monotonic() > deadline:
                return {i: [_describe(p) for p in pids] for i, pids in left.items()}
            time.sleep(0.2)

    def link(self, i: int, up: bool) -> None:
        """Connect host i to the network, or cut it off (its veth pair down)."""
        _ip("link", "set", f"{self.names[i]}v", "up" if up else "down")

    def close(self) -> None:
        """End every process in the namespaces (sshd last) by PID, and delete what was made."""
        for i in range(len(self.addresses)):
            for pid in self.pids_in(i):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for daemon in self.sshd:
            daemon.kill()
            daemon.wait()
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            subprocess.run(["ip", "link", "del", f"{ns}v"], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)


class SlurmOnHosts(_Started):
    """A real Slurm over NamespacedHosts: munged and slurmctld on this machine (the bridge's
    address), one slurmd per host in its namespace and UTS namespace (node names n0, n1, ...
    at the hosts' addresses), and an allocation of every node (`job`). SLURM_CONF points
    Slurm's commands at it; `env` is what a test adds to its environment.

    Debian's slurm-wlm and munge (CI installs them). As the facts note says, `ip netns exec`
    would remount /sys and slurmd would find no cgroups: nodes enter with `nsenter --net`.
    """

    def __init__(self, hosts: NamespacedHosts):
        self.hosts, self.folder = hosts, hosts.folder / "slurm"
        self.conf = self.folder / "slurm.conf"
        self.daemons: list[subprocess.Popen] = []
        self.nodes = [f"n{i}" for i in range(hosts.n)]
        self.job: str | None = None
        self.env = {"SLURM_CONF": str(self.conf)}

    def _daemon(self, name: str, cmd: list[str]) -> subprocess.Popen:
        with open(self.folder / f"{name}.out", "ab") as log:
            daemon = subprocess.Popen(
                cmd, stdout=log, stderr=log, start_new_session=True,
                env=dict(os.environ, **self.env),
            )  # fmt: skip
        self.daemons.append(daemon)
        return daemon

    def _start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, timeout=30)
            shutil.chown(key, "munge", "munge")
            key.chmod(0o400)
        Path("/run/munge").mkdir(exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        if subprocess.run(["sh", "-c", "munge -n | unmunge"], capture_output=True).returncode:
            self._daemon(
                "munged",
                ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups",
                 "/usr/sbin/munged", "--foreground"]
            )  # fmt: skip
            self._wait(["sh", "-c", "munge -n | unmunge"], "munged")
        host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
        bridge = f"10.78.{self.hosts.subnet}.1"
        lines = [
            "ClusterName=labs",
            f"SlurmctldHost={host}({bridge})",
            "AuthType=auth/munge",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SlurmUser=root",
            f"StateSaveLocation={self.folder}/state",
            f"SlurmdSpoolDir={self.folder}/spool-%n",
            f"SlurmdPidFile={self.folder}/slurmd-%n.pid",
            f"SlurmctldPidFile={self.folder}/slurmctld.pid",
            f"SlurmctldLogFile={self.folder}/ctld.log",
            f"SlurmdLogFile={self.folder}/d-%n.log",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "SlurmctldPort=16817",
            "SlurmdPort=16818",
        ]
        cpus = os.cpu_count()
        for node, address in zip(self.nodes, self.hosts.addresses):
            lines.append(
                f"NodeName={node} NodeAddr={address} NodeHostname={node} CPUs={cpus} "
                "RealMemory=1000 State=UNKNOWN"
            )
            (self.folder / f"spool-{node}").mkdir(exist_ok=True)
        lines.append(
            f"PartitionName=labs Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=FORCE:8"
        )
        (self.folder / "state").mkdir(exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for i, node in enumerate(self.nodes):
            slurmd = self._daemon(
                f"slurmd-{node}",
                ["nsenter", f"--net=/run/netns/{self.hosts.names[i]}", "unshare", "--uts",
                 "sh", "-c", f"hostname {node} && exec slurmd -D -N {node} -f {self.conf}"],
            )  # fmt: skip
            self.hosts.daemon_pids.add(slurmd.pid)  # not a leftover: it serves the host
        self._wait(
            [
                "sh",
                "-c",
                "sinfo -h -o '%T %D' | grep -q '^idle 3$'".replace("3", str(len(self.nodes))),
            ],
            "the nodes idle in sinfo",
            timeout=60,
        )
        out = subprocess.run(
            ["salloc", f"-N{len(self.nodes)}", "--no-shell", "--immediate=30"],
            capture_output=True, text=True, timeout=60, env=dict(os.environ, **self.env),
        )  # fmt: skip
        found = [w for w in out.stderr.split() if w.isdigit()]
        assert out.returncode == 0 and found, f"salloc failed: {out.stderr}"
        self.job = found[0]

    def _wait(self, cmd, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        env = dict(os.environ, **self.env)
        while subprocess.run(cmd, capture_output=True, env=env).returncode:
            assert time.monotonic() < deadline, f"{what}: not up in {timeout:.0f} s"
            time.sleep(0.3)

    def close(self) -> None:
        """Cancel the allocation, end the daemons by PID (slurmd's step daemons with their
        hosts' processes: NamespacedHosts.close)."""
        if self.job:
            subprocess.run(
                ["scancel", self.job], capture_output=True, timeout=30,
                env=dict(os.environ, **self.env),
            )  # fmt: skip
        for daemon in reversed(self.daemons):
            try:
                os.killpg(daemon.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for daemon in reversed(self.daemons):
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
