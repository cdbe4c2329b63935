"""Where a student's code runs while it is graded: a bubblewrap sandbox around the kernel,
and a memory limit over everything the submission started.

The kernel of each graded notebook is started through `bwrap` (bubblewrap, the sandbox
Flatpak uses; Debian's `bubblewrap` package), which needs no root: it uses an unprivileged
user namespace. Inside it:

- the file system is read-only, and the course folder, the submissions folder, the lessons
  with their solutions (notebooks/, tests/, build/, .git), the grader's home and /run (the
  host's Unix sockets) are replaced by empty read-only folders; the Python installation,
  the helper package and the datasets stay readable;
- it can write only the notebook's runs/ folder, its kernel's socket folder and a private
  /tmp; the folder the notebook runs in is read-only, so that nothing there (a symbolic link
  put in place of the notebook, say) can redirect what nbgrader writes after the kernel ends;
- it has its own network namespace with only a loopback interface (the kernel talks to
  nbgrader over Unix sockets), its own process IDs, and no capabilities;
- it dies with nbgrader (bwrap's --die-with-parent).

Where bubblewrap is missing or user namespaces are forbidden (macOS, some distributions),
grading refuses to run students' code unless the instructor turns the sandbox off
(`make grade ... SANDBOX=0`), and the report says it ran unsandboxed.

Bubblewrap has no memory limit, so `MemoryGuard` (ours) watches the proportional memory (PSS;
RSS where the system has no PSS) of every process of one graded notebook and ends the
kernel's processes when they pass the limit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

from helpers import config
from helpers.system.resources import Sampler, total_memory
from tools.course.nbgrader_course import token_processes

KERNEL_NAME = "labs-sandbox"
# Folders of the repository whose content a graded notebook must not see: the lessons with
# their solutions and hidden tests, the second answers, the history, the builds.
SECRET_PARTS = ("notebooks", "tests", ".git", "build")


def unavailable_reason() -> str | None:
    """None when the sandbox works on this machine, else why not (one short probe)."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap runs on Linux only (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return "bwrap (bubblewrap) is not on PATH: install it (apt-get install bubblewrap)"
    probe = subprocess.run(
        ["bwrap", *_isolation(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode:
        return f"bwrap cannot make a sandbox here ({probe.stderr.strip()[:200]})"
    return None


def _isolation() -> list[str]:
    """Namespaces, capabilities and lifetime: the part of the bwrap command every sandbox has."""
    # As root, bwrap would keep every capability (and with them the power to unmount what
    # hides the course): a user namespace with an unprivileged user inside takes them away.
    uid = os.getuid() or 65534  # nobody
    return [
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(uid),
        "--gid",
        str(uid),
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
    ]


def _mounts(
    writable: list[Path], hidden: list[Path], readable: list[Path]
) -> list[tuple[Path, str]]:
    """(folder or file, "hide" | "ro" | "rw") of bwrap_command, parents first."""
    home = Path.home()
    repo = config.REPO_ROOT
    # /run holds the host's Unix sockets (D-Bus, a container engine's): reachable through the
    # file system whatever the network namespace
    hide = [Path(p) for p in hidden] + [repo / part for part in SECRET_PARTS] + [Path("/run")]
    hide += _worktree_git_dirs(repo / ".git")
    if home != Path("/"):
        hide.append(home)
    readable = [
        *readable,
        repo,
        Path(sys.prefix),
        Path(sys.base_prefix),
        config.data_dir(),
        *[
            Path(v)
            for k, v in os.environ.items()
            if k in ("LABS_DATA_MIRROR", "LABS_DBPEDIA_DIR") and v
        ],
    ]
    mounts: list[tuple[Path, str]] = [(Path(p).resolve(), "hide") for p in hide]
    mounts += [(Path(p).resolve(), "ro") for p in readable]
    mounts += [(Path(p).resolve(), "rw") for p in writable]
    # a readable folder under a hidden one comes back; one that holds a hidden one stays
    # visible around it: mounting by depth (parents first) gives both
    return sorted(
        {m for m in mounts if m[0].exists()}, key=lambda m: (len(m[0].parts), m[1], str(m[0]))
    )


def _worktree_git_dirs(git: Path) -> list[Path]:
    """Where a git worktree's history is, when `git` is its `.git` file (gitdir: ...): that
    folder and the repository's common one; nothing for a plain clone."""
    if not git.is_file():
        return []
    text = git.read_text().strip()
    if not text.startswith("gitdir:"):
        return []
    own = (git.parent / text.removeprefix("gitdir:").strip()).resolve()
    common = own / "commondir"
    found = [own] + ([(own / common.read_text().strip()).resolve()] if common.is_file() else [])
    return found


def bwrap_command(
    writable: list[Path], hidden: list[Path], workdir: Path, readable: list[Path] = ()
) -> list[str]:
    """The bwrap prefix of a sandboxed command: `writable` folders are the only ones it can
    write (besides a private /tmp), `hidden` ones look empty, everything else is read-only.

    What it needs to read (this Python, the helper package, the datasets, `readable`) is put
    back when a hidden folder holds it; folders are mounted parents first.
    """
    mounts = _mounts(writable, hidden, readable)
    cmd = [
        "bwrap",
        *_isolation(),
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
    ]
    for path, kind in mounts:
        if kind == "hide" and not path.is_dir():  # a file (a worktree's .git): empty
            cmd += ["--ro-bind", "/dev/null", str(path)]
        elif kind == "hide":
            cmd += ["--tmpfs", str(path)]
        elif kind == "ro":
            cmd += ["--ro-bind", str(path), str(path)]
        else:
            cmd += ["--bind", str(path), str(path)]
    # the empty folders are made read-only last: the mounts above may need mount points there
    for path, kind in mounts:
        if kind == "hide" and path.is_dir():
            cmd += ["--remount-ro", str(path)]
    cmd += [
        "--chdir",
        str(workdir),
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "MPLCONFIGDIR",
        "/tmp/matplotlib",
        "--setenv",
        "IPYTHONDIR",
        "/tmp/ipython",
        "--setenv",
        "TMPDIR",
        "/tmp",
        # ipykernel would take bwrap's init (PID 1 in its namespace) for a dead parent;
        # bwrap's --die-with-parent does that watch instead
        "--unsetenv",
        "JPY_PARENT_PID",
    ]
    return cmd + ["--"]


def write_kernel(jupyter_dir: Path, prefix: list[str]) -> None:
    """A kernelspec KERNEL_NAME in `jupyter_dir`/kernels whose kernel starts inside `prefix`.

    Interrupts go as messages: a signal would reach bwrap, not the kernel inside it."""
    spec = {
        "argv": [*prefix, sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (grading sandbox)",
        "language": "python",
        "interrupt_mode": "message",
    }
    folder = jupyter_dir / "kernels" / KERNEL_NAME
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))


def default_memory_mb(jobs: int) -> int:
    """Memory per graded notebook: 80% of this machine's memory, shared by `jobs`."""
    return int(psutil.virtual_memory().total * 0.8 / max(1, jobs) / 2**20)


class MemoryGuard:
    """Watch every process whose environment holds LABS_GRADING_TOKEN=token, except `spare`
    (nbgrader itself), and SIGKILL them when their memory together passes `limit_mb`.

    A process's RSS is at least its PSS, and costs a read of a few numbers where PSS walks
    its page tables (about 15 ms for a TF process, four times a second, per graded notebook).
    So each sample sums RSS, and reads PSS only when that sum passes the limit: PSS decides.

    One guard can watch several nbgrader runs in turn (`watch`, then `stop`); `tripped` tells
    afterwards whether it ended any, `peak_mb` is the largest PSS total it read (0 if RSS
    never passed the limit)."""

    def __init__(self, limit_mb: float, every_s: float = 0.25):
        self.limit_mb, self.every_s = limit_mb, every_s
        self.tripped, self.peak_mb = False, 0.0
        self._sampler: Sampler | None = None

    def watch(self, token: str, spare: set[int] = frozenset()) -> None:
        """Start watching the processes of `token` (in a thread) until `stop`."""
        self.stop()
        spare = set(spare)
        self._sampler = Sampler(lambda: self._sample(token, spare), self.every_s).start()

    def stop(self) -> None:
        """Stop watching (idempotent)."""
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None

    def _sample(self, token: str, spare: set[int]) -> None:
        members = token_processes({token}, spare)
        if total_memory(members) / 2**20 <= self.limit_mb:
            return  # under the limit by RSS, so by PSS
        used = total_memory(members, full=True) / 2**20
        self.peak_mb = max(self.peak_mb, used)
        if used > self.limit_mb:
            self.tripped = True
            for p in members:
                try:
                    p.kill()
                except psutil.Error:
                    pass
