"""A private network namespace for the processes of a cluster on one machine.

TensorFlow's gRPC servers bind to all network interfaces and accept anyone: no
authentication, no encryption. On one machine there is no need to be reachable at all, so
cluster processes can run inside a network namespace of their own, where only a loopback
interface exists. An unprivileged user creates one with `unshare --user --map-root-user
--net`; a small holder process keeps it alive and every process joins it with `nsenter`.

    with PrivateNetwork(isolate="auto") as net:
        subprocess.Popen(net.prefix + [sys.executable, "-m", "my.server"])
        net.isolated, net.loopback_bytes()

Linux only. Where it is not possible (macOS, Windows, distributions that forbid
unprivileged user namespaces) `isolate="auto"` warns once and runs exposed, `isolate=True`
raises IsolationError, `isolate=False` never tries.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings
from pathlib import Path

from helpers.system.processes import child_setup, kill_group

_WARNED = False  # warn about exposed ports once per Python process


class IsolationError(RuntimeError):
    """isolate=True, but this machine cannot make a private network namespace."""


def _tools_missing() -> str | None:
    """Why namespaces cannot even be tried here (platform, tools), else None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces exist on Linux only"
    missing = [t for t in ("unshare", "nsenter", "ip") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found on PATH"
    return None


def unavailable_reason() -> str | None:
    """None when private network namespaces work here, else why not (one short probe)."""
    reason = _tools_missing()
    if reason:
        return reason
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "ip", "link", "set", "lo", "up"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode:
        return f"unprivileged user namespaces are not permitted here ({probe.stderr.strip()})"
    return None


def loopback_tx_bytes(pid: int | str = "self") -> int | None:
    """Bytes sent over loopback so far in the network namespace of process `pid` (None on a
    system without /proc, e.g. macOS). Inside a private namespace, that is the cluster's own
    traffic: every byte gRPC sent, with its framing and TCP/IP headers."""
    try:
        for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[8])  # transmitted bytes
    except OSError:
        return None
    return None


class PrivateNetwork:
    """Hold a network namespace with only `lo` in it; `prefix` runs a command inside it."""

    def __init__(self, isolate="auto", what: str = "Cluster"):
        if isolate not in ("auto", True, False):
            raise ValueError(f"isolate must be 'auto', True or False, got {isolate!r}")
        self.isolate, self.what = isolate, what
        self.holder: subprocess.Popen | None = None

    @property
    def isolated(self) -> bool:
        """True while the namespace exists (processes started with `prefix` are inside it)."""
        return self.holder is not None

    @property
    def pid(self) -> int | None:
        """PID of the holder process, whose namespace the others join (None if not isolated)."""
        return self.holder.pid if self.holder else None

    @property
    def prefix(self) -> list[str]:
        """Command prefix that runs a program inside the namespace ([] when not isolated)."""
        if self.holder is None:
            return []
        return [
            "nsenter",
            f"--target={self.holder.pid}",
            "--user",
            "--net",
            "--preserve-credentials",
        ]

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self) -> "PrivateNetwork":
        """Create the namespace; or warn once / raise IsolationError when that is impossible."""
        global _WARNED
        if self.isolate is False or self.holder is not None:
            return self
        reason = _tools_missing()  # the holder itself is the probe: no second namespace
        if reason is None:
            self.holder = subprocess.Popen(
                [
                    "unshare",
                    "--user",
                    "--map-root-user",
                    "--net",
                    "sh",
                    "-c",
                    "ip link set lo up && echo ready && exec cat",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=child_setup,
            )
            if self.holder.stdout.readline().strip() != b"ready":
                err = self.holder.stderr.read().decode(errors="replace").strip()
                self.stop()
                reason = f"unprivileged user namespaces are not permitted here ({err})"
        if reason is None:
            return self
        if self.isolate is True:
            raise IsolationError(f"isolate=True but {reason}")
        if not _WARNED:
            warnings.warn(
                f"{self.what} not isolated: {reason}. TensorFlow's gRPC servers "
                "listen on ALL network interfaces without authentication, so other "
                "machines on your network can reach these ports while it runs.",
                RuntimeWarning,
                stacklevel=3,
            )
            _WARNED = True
        return self

    def loopback_bytes(self) -> int | None:
        """Bytes sent over the namespace's loopback so far (None when not isolated)."""
        if self.holder is None:
            return None
        return loopback_tx_bytes(self.holder.pid)

    def listening_ports(self) -> set[int]:
        """TCP ports listening inside the namespace (empty when not isolated).

        /proc/<pid>/net/tcp shows the sockets of that process's network namespace, so no
        nsenter is needed: state 0A is LISTEN, the port is the hex after the colon.
        """
        if self.holder is None:
            return set()
        ports = set()
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{self.holder.pid}/net/{table}").read_text().splitlines()
            except OSError:
                continue
            for line in lines[1:]:
                fields = line.split()
                if len(fields) > 3 and fields[3] == "0A":
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        return ports

    def stop(self) -> None:
        """End the holder (idempotent); the namespace goes when its last process does."""
        if self.holder is None:
            return
        kill_group(self.holder.pid)
        self.holder.wait()
        for f in (self.holder.stdin, self.holder.stdout, self.holder.stderr):
            f.close()
        self.holder = None
