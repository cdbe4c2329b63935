"""Processes on other machines, over SSH: the command that starts one, and a check of a host.

The system's OpenSSH client, not a Python SSH library: it reads the user's ~/.ssh/config, agent
and keys as their other tools do, it is on every Linux and macOS machine, and a process
started through it talks to its parent over the client's stdin and stdout exactly as a local
child does (`processes.ChildProcess`). `-T` (no terminal) and `BatchMode=yes` (never ask for a
password: fail at once instead); `ServerAliveInterval` makes the client exit within seconds of
the link going dead, which the parent sees as the child ending.

On the host, the process's lifeline is its stdin (`lifeline_on_stdin`, `remote_lifeline`): no
pipe or parent-death signal crosses machines.

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
import queue
import select
import shlex
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from helpers.system import clock
from helpers.system.control import Event
from helpers.system.processes import end_self, guard_with

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
# and TMPDIR, which the caller sets to a folder every host sees (nodes.py: the cluster's)
FORWARDED = ("PYTHONUNBUFFERED", "MALLOC_ARENA_MAX", "TMPDIR")
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


def lifeline_on_stdin(handle_now, silence_s: float = 10.0, fd: int = 0) -> queue.Queue:
    """A child on another host (started through ssh or srun): its lifeline is its stdin,
    since no pipe or parent-death signal crosses machines. A thread reads the parent's lines:
    `handle_now(message)` may act on one at once and return True (a ping's answer while the
    main thread trains); every other message goes on the returned queue.
    The thread ends this process and its group with SIGKILL when stdin closes (the parent, or
    its ssh client, is gone) or when no line has come for `silence_s` seconds (the link is
    down; the parent pings every second). It reads the file descriptor itself (os.read), not
    sys.stdin: a daemon thread blocked inside a buffered reader aborts the interpreter's exit."""
    guard_with(os.dup(fd))  # hang()'s guard watches the same pipe for its end
    inbox: queue.Queue = queue.Queue()
    last = [time.monotonic()]

    def read():
        pending = b""
        while chunk := os.read(fd, 65536):
            last[0] = time.monotonic()
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if not handle_now(msg):
                    inbox.put(msg)
        end_self(signal.SIGKILL)

    def watch():
        # lines waiting in the pipe are not silence: the reader was held up (a library
        # loading holds the interpreter) and has yet to read them
        while time.monotonic() - last[0] <= silence_s or select.select([fd], [], [], 0)[0]:
            time.sleep(0.5)
        print(f"no word from the launcher for {silence_s:.0f} s: ending", file=sys.stderr)
        end_self(signal.SIGKILL)

    threading.Thread(target=read, name="lifeline-stdin", daemon=True).start()
    threading.Thread(target=watch, name="lifeline-silence", daemon=True).start()
    return inbox


def remote_lifeline(me: str, say, handlers: dict | None = None) -> queue.Queue:
    """lifeline_on_stdin for process `me` ("worker:0") on another host than its parent: it
    drops what is sent to another task of a shared stdin (a message's `to`), answers each ping
    at once with `say(Event.PONG, t=..., node_t=<its clock>)`, hands a command listed in
    `handlers` to its function, and queues the rest."""

    def handle_now(msg) -> bool:
        if msg.get("to", me) != me:
            return True
        if msg.get("cmd") == "ping":
            say(Event.PONG, t=msg["t"], node_t=clock.now())
            return True
        if msg.get("cmd") in (handlers or {}):
            handlers[msg["cmd"]](msg)
            return True
        return False

    return lifeline_on_stdin(handle_now)


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
