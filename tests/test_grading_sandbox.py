"""The grading sandbox on its own: what a command inside it can see, write and reach, and the
memory guard (graded notebooks in it: tests/test_course.py)."""

import os
import socket
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from helpers.system import resources
from tools.course import sandbox

REASON = sandbox.unavailable_reason()
needs_bwrap = pytest.mark.skipif(REASON is not None, reason=f"no sandbox here: {REASON}")


@needs_bwrap
def test_inside_hidden_folders_are_empty_and_only_the_writable_ones_take_writes(tmp_path):
    secret, keep, out, other = (tmp_path / n for n in ("secret", "secret/keep", "out", "other"))
    for folder in (keep, out, other):
        folder.mkdir(parents=True)
    (secret / "gradebook.db").write_text("grades")
    (keep / "data.txt").write_text("readable")
    (other / "theirs.txt").write_text("another student's")
    script = (
        "import os, socket\n"
        f"print(sorted(os.listdir({str(secret)!r})))\n"
        f"print(open({str(keep / 'data.txt')!r}).read())\n"
        f"open({str(out / 'mine.txt')!r}, 'w').write('ok')\n"
        "for path in [%r, %r]:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print('WROTE', path)\n"
        "    except OSError as exc:\n"
        "        print(type(exc).__name__)\n"
        "print(sorted(name for _, name in socket.if_nameindex()))\n"
        "print(os.listdir('/run'))\n"
    ) % (str(other / "theirs.txt"), str(secret / "new.txt"))
    cmd = sandbox.bwrap_command(writable=[out], hidden=[secret], workdir=out, readable=[keep])
    run = subprocess.run(
        cmd + [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "['keep']"  # the hidden folder is empty, but for what was put back
    assert lines[1] == "readable"
    # another folder under /tmp is not even there (the sandbox's /tmp is its own); the hidden
    # folder is read-only
    assert lines[2:4] == ["FileNotFoundError", "OSError"]
    assert lines[4] == "['lo']"  # its own network namespace: a loopback only
    assert lines[5] == "[]"  # no host Unix socket (they live in /run)
    assert (out / "mine.txt").read_text() == "ok"
    assert (other / "theirs.txt").read_text() == "another student's"
    assert not (secret / "new.txt").exists()


@needs_bwrap
def test_inside_a_port_open_on_this_machine_cannot_be_reached():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    script = (
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 5)\n"
        "    print('CONNECTED')\nexcept OSError as exc:\n    print(type(exc).__name__)\n"
    )
    cmd = sandbox.bwrap_command(writable=[], hidden=[], workdir="/")
    try:
        run = subprocess.run(
            cmd + [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
        assert run.stdout.strip() == "ConnectionRefusedError", run.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


def test_without_bwrap_the_reason_names_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "bwrap (bubblewrap) is not on PATH" in sandbox.unavailable_reason()


def test_the_memory_guard_ends_the_processes_of_its_token_past_the_limit():
    token = uuid.uuid4().hex
    hog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nhog = [b'x' * (50 * 2**20) for _ in range(8)]\ntime.sleep(60)",
        ],
        env=dict(os.environ, LABS_GRADING_TOKEN=token),
    )
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    guard = sandbox.MemoryGuard(limit_mb=200, every_s=0.1)
    try:
        guard.watch(token)
        assert hog.wait(timeout=30) == -9  # SIGKILL, once past 200 MB
        assert bystander.poll() is None  # a process without the token is left alone
    finally:
        guard.stop()
        for p in (hog, bystander):
            if p.poll() is None:
                p.kill()
            p.wait()
    assert guard.tripped and guard.peak_mb > 200


SHARERS = """
import os, sys, time
block = bytearray(os.urandom(2**20)) * 120  # 120 MB, written once, then only read
for _ in range(3):
    if os.fork() == 0:  # each child maps the parent's pages: RSS counts them again, PSS not
        time.sleep(60)
        os._exit(0)
print("forked", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PSS is read on Linux only")
def test_the_memory_guard_decides_on_pss_not_on_rss_of_shared_pages(monkeypatch):
    token = uuid.uuid4().hex
    parent = subprocess.Popen(
        [sys.executable, "-c", SHARERS],
        env=dict(os.environ, LABS_GRADING_TOKEN=token),
        stdout=subprocess.PIPE,
        text=True,
    )
    reads = []
    real = resources.read_memory
    monkeypatch.setattr(
        resources, "read_memory", lambda p, full=False: (reads.append(full), real(p, full))[1]
    )
    guard = sandbox.MemoryGuard(limit_mb=300, every_s=0.1)
    try:
        assert parent.stdout.readline() == "forked\n"
        family = [psutil.Process(parent.pid), *psutil.Process(parent.pid).children()]
        assert len(family) == 4
        assert sum(p.memory_info().rss for p in family) > 400 * 2**20  # past the limit by RSS
        guard.watch(token)
        time.sleep(1.5)
        guard.stop()
        assert all(p.is_running() for p in family)  # by PSS, under it
        assert 100 < guard.peak_mb < 300 and True in reads
        # far under the limit, RSS settles it and no PSS is read
        reads.clear()
        guard = sandbox.MemoryGuard(limit_mb=10_000, every_s=0.1)
        guard.watch(token)
        time.sleep(1)
        guard.stop()
        assert reads and True not in reads and guard.peak_mb == 0 and not guard.tripped
    finally:
        guard.stop()
        children = psutil.Process(parent.pid).children()
        for p in children:
            p.kill()
        parent.kill()  # its killed children, zombies until it goes, are then reaped by init
        parent.wait()
        assert psutil.wait_procs(children, timeout=10)[1] == []


def test_a_worktrees_history_is_found_from_its_git_file(tmp_path):
    own = tmp_path / "main" / ".git" / "worktrees" / "wt"
    own.mkdir(parents=True)
    (own / "commondir").write_text("../..\n")
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text(f"gitdir: {own}\n")
    found = sandbox._worktree_git_dirs(tmp_path / "wt" / ".git")
    assert found == [own.resolve(), (tmp_path / "main" / ".git").resolve()]
    assert sandbox._worktree_git_dirs(tmp_path / "main" / ".git") == []  # a clone's own folder
