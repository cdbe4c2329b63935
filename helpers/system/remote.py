"""Processes on other machines, over SSH: the command that starts one, and a check of a host.

The system's OpenSSH client, not a Python SSH library: it reads the user's ~/.ssh/config, agent
and keys as their other tools do, it is on every Linux and macOS machine, and a process
started through it talks to its parent over the client's stdin and stdout exactly as a local
child does (`processes.ChildProcess`). `-T` (no terminal) and `BatchMode=yes` (never ask for a
password: fail at once instead); `ServerAliveInterval` makes the client exit within seconds of
the link going dead, which the parent sees as the child ending.

`probe()` runs on the host (`python -m helpers.system.remote probe ...`, standard library and
psutil only, no TensorFlow) and says what the driver needs to know before it starts anything
there: the code version, the data, the ports, whether the run folder is shared, the host's
addresses and its clock.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

SSH_OPTIONS = [
    "-T",
    "-o",
    "BatchMode=yes",
    "-o",
    "ServerAliveInterval=2",
    "-o",
    "ServerAliveCountMax=3",
]
# what a node on another host needs of the driver's environment: the course's settings, TF's
FORWARDED_PREFIXES = ("LABS_", "TF_")
FORWARDED = ("PYTHONUNBUFFERED", "MALLOC_ARENA_MAX")
NOT_FORWARDED = ("LABS_LIFELINE",)  # a file descriptor of this machine's


def forwarded_env(env: dict) -> dict:
    """The variables of `env` a process on another host gets: LABS_*, TF_* and a few more."""
    return {
        k: v
        for k, v in env.items()
        if (k.startswith(FORWARDED_PREFIXES) or k in FORWARDED) and k not in NOT_FORWARDED
    }


def ssh_command(
    host: str,
    argv: list[str],
    *,
    cwd: str,
    env: dict | None = None,
    ssh_config: str | None = None,
    connect_timeout: float = 10.0,
) -> list[str]:
    """The command that runs `argv` on `host` in folder `cwd` with `env` set, through ssh."""
    remote = f"cd {shlex.quote(cwd)} && exec env " + " ".join(
        shlex.quote(f"{k}={v}") for k, v in sorted((env or {}).items())
    )
    remote += " " + " ".join(shlex.quote(a) for a in argv)
    config = ["-F", str(ssh_config)] if ssh_config else []
    timeout = ["-o", f"ConnectTimeout={max(1, round(connect_timeout))}"]
    return ["ssh", *config, *SSH_OPTIONS, *timeout, host, remote]


def code_version(root: Path) -> str:
    """A digest of the package's Python files under `root` (what the nodes run)."""
    digest = hashlib.sha256()
    for path in sorted((Path(root) / "helpers").rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def is_public(address: str) -> bool:
    """True for an address reachable from the internet (not private, loopback or link-local)."""
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_global
    except ValueError:
        return False


def _own_addresses() -> list[str]:
    import psutil

    return sorted(
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family in (socket.AF_INET, socket.AF_INET6)
    )


def _busy(ports: list[int]) -> list[int]:
    busy = []
    for port in ports:
        with socket.socket() as s:
            # as gRPC binds: a port whose last connections linger in TIME_WAIT is free
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                busy.append(port)
    return busy


def _data_problem() -> str | None:
    """Why the lessons' MNIST cannot be had on this host, or None."""
    from helpers import config

    if (config.data_dir() / "mnist.npz").exists():
        return None
    raw = os.environ.get("LABS_DATA_MIRROR", "").strip()
    if raw and not raw.startswith(("http://", "https://")):
        if not (Path(raw) / "mnist.npz").exists():
            return f"LABS_DATA_MIRROR={raw} has no mnist.npz on this host"
    return None


def probe(ports: list[int], token_file: str, token: str) -> dict:
    """What this host offers a cluster (run on the host itself)."""
    root = Path(__file__).resolve().parents[2]
    try:
        sees_token = Path(token_file).read_text() == token
    except OSError:
        sees_token = False
    connection = os.environ.get("SSH_CONNECTION", "").split()
    return {
        "code": code_version(root),
        "python": sys.version.split()[0],
        "data": _data_problem(),
        "busy_ports": _busy(ports),
        "shared_runs": sees_token,
        "addresses": _own_addresses(),
        "reached_at": connection[2] if len(connection) == 4 else None,
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "time": time.time(),
    }


def main(argv=None) -> int:
    """`python -m helpers.system.remote probe --ports 2222,2223 --token-file F --token T`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["probe"])
    p.add_argument("--ports", default="")
    p.add_argument("--token-file", required=True)
    p.add_argument("--token", required=True)
    args = p.parse_args(argv)
    ports = [int(x) for x in args.ports.split(",") if x]
    print(json.dumps(probe(ports, args.token_file, args.token)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
