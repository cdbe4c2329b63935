"""Sample CPU% and memory (RSS; optionally PSS and USS) of processes while something runs,
and the peak Python allocation of one call; how much memory is free here (a container's limit
included), and whether some TF processes fit in it.

`Sampler` (a thread that samples every so often) and `read_memory` (one process's memory) are
the one sampler of the project: `ResourceMonitor` here, the notebook runner's peak memory
(tools/run_notebooks.py) and the grading sandbox's memory limit (tools/course/sandbox.py) use it.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import psutil


class Sampler:
    """Call `sample()` every `interval` seconds in a daemon thread, from `start()` (or entering
    a `with` block) until `stop()`; it can be started again after it stopped."""

    def __init__(self, sample, interval: float):
        if not interval > 0:
            raise ValueError(f"a sampling interval must be > 0 seconds, got {interval!r}")
        self.sample, self.interval = sample, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Sampler":
        """Start sampling (first sample after one interval); a running sampler restarts."""
        self.stop()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and wait for a sample under way (idempotent)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    @property
    def running(self) -> bool:
        """Whether it has been started and not stopped."""
        return self._thread is not None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


@dataclass(frozen=True)
class Memory:
    """One process's memory in bytes. PSS splits shared pages between the processes that map
    them; USS counts the pages only it maps. None: not read, or not given here (macOS has no
    PSS; another user's process denies both)."""

    rss: int
    pss: int | None = None
    uss: int | None = None


def read_memory(proc: psutil.Process, full: bool = False) -> Memory:
    """The memory of `proc`: RSS, and with `full` also PSS and USS (psutil's memory_full_info
    walks /proc/PID/smaps, much slower than RSS: sample it less often).

    Raises:
        psutil.NoSuchProcess: the process has ended.
    """
    rss = proc.memory_info().rss
    if not full:
        return Memory(rss)
    try:
        info = proc.memory_full_info()
    except psutil.AccessDenied:
        return Memory(rss)
    return Memory(rss, getattr(info, "pss", None), getattr(info, "uss", None))


def total_memory(procs, full: bool = False) -> int:
    """The RSS of `procs` together, in bytes; with `full` their PSS (RSS where the system has
    no PSS, as macOS, or denies it). A process's RSS is at least its PSS and far cheaper to
    read, so a caller can sum RSS first and read PSS only when that sum matters. Processes
    that ended or deny access count 0."""
    used = 0
    for p in procs:
        try:
            mem = read_memory(p, full=full)
        except psutil.Error:
            continue
        used += mem.rss if mem.pss is None else mem.pss
    return used


class ResourceMonitor:
    """Sample CPU% and RSS of some processes in a background thread.

    Use as a context manager; afterwards `.summary()` gives per-PID average CPU% and
    peak RSS. PIDs that exit while sampled are kept with what was seen of them.

    RSS counts every page a process maps, so N processes sharing TensorFlow's libraries
    count them N times. With `pss_every` (seconds) it also samples, that often and once at
    the end, PSS (shared pages split between the processes that map them: the processes'
    PSS add up to what they cost together) and USS (the pages only this process maps: what
    ending it would free). Those come from psutil's memory_full_info, which reads
    /proc/PID/smaps: it walks every mapping of a TF process, too slow to sample as often as RSS.
    """

    def __init__(
        self,
        pids=None,
        interval: float = 0.25,
        children: bool = False,
        pss_every: float | None = None,
    ):
        self.pids = list(pids) if pids is not None else [os.getpid()]
        self.interval = interval
        self.children = children  # also follow the children of the given PIDs
        self.pss_every = pss_every
        self._last_full = float("-inf")
        self.samples: dict[int, list[tuple[float, float, int]]] = {}
        self.full: dict[int, list[tuple[int, int]]] = {}  # pid -> [(pss, uss)]
        # pid -> [(wall-clock time, CPU seconds used so far)]: CPU time between two moments
        self.cpu_times: dict[int, list[tuple[float, float]]] = {}
        self._sampler = Sampler(self._sample, interval)
        self._procs: dict[int, psutil.Process] = {}

    def _targets(self):
        for pid in self.pids:
            try:
                proc = self._procs.setdefault(pid, psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
            yield proc
            if self.children:
                try:
                    for child in proc.children(recursive=True):
                        yield self._procs.setdefault(child.pid, child)
                except psutil.NoSuchProcess:
                    pass

    def _sample(self, final: bool = False):
        now = time.perf_counter()
        full = self.pss_every is not None and (final or now - self._last_full >= self.pss_every)
        if full:
            self._last_full = now
        for proc in list(self._targets()):
            try:
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)  # since the previous call on this object
                    mem = read_memory(proc, full)
                    times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if mem.pss is not None and mem.uss is not None:
                self.full.setdefault(proc.pid, []).append((mem.pss, mem.uss))
            self.samples.setdefault(proc.pid, []).append((now, cpu, mem.rss))
            self.cpu_times.setdefault(proc.pid, []).append((time.time(), times.user + times.system))

    def __enter__(self):
        self.t0 = time.perf_counter()
        self._sample()  # primes cpu_percent
        self._sampler.start()
        return self

    def __exit__(self, *exc):
        self._sampler.stop()
        self._sample(final=True)
        self.elapsed = time.perf_counter() - self.t0
        return False

    def summary(self) -> dict[int, dict[str, float]]:
        """Per PID: mean CPU% (100 = one full core) and peak RSS in MB; with `pss_every`,
        also peak PSS and USS in MB (of the sparser samples)."""
        out = {}
        for pid, rows in self.samples.items():
            cpus = [c for _, c, _ in rows[1:]] or [0.0]
            out[pid] = {
                "cpu_percent": sum(cpus) / len(cpus),
                "peak_rss_mb": max(r for _, _, r in rows) / 2**20,
            }
            if pid in self.full:
                out[pid]["peak_pss_mb"] = max(p for p, _ in self.full[pid]) / 2**20
                out[pid]["peak_uss_mb"] = max(u for _, u in self.full[pid]) / 2**20
        return out


def cpu_seconds_between(samples, start: float, end: float) -> float:
    """CPU seconds a process used between two wall-clock times, from ResourceMonitor's
    `cpu_times` samples of it (linear between samples; NaN outside what was sampled)."""
    import numpy as np

    if len(samples) < 2:
        return float("nan")
    t, cpu = np.array(samples).T
    if start < t[0] or end > t[-1]:
        return float("nan")
    return float(np.interp(end, t, cpu) - np.interp(start, t, cpu))


def peak_memory_mb(fn) -> tuple[object, float]:
    """Run fn() under tracemalloc; return (its result, peak Python allocation in MB)."""
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak / 2**20


MEMORY_ENV = "LABS_MEMORY_MB"  # the memory the lessons may use, when less than the OS reports
# One TF process of a cluster, measured as PSS (shared libraries split between processes):
# `python -m helpers.doctor` prints today's figure per notebook, from `make run`.
TF_PROCESS_MB = 480


def _cgroup_free_mb(
    root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")
) -> int | None:
    """MB this process's control group may still allocate (a container's or JupyterHub
    pod's limit less its usage, the tightest over its ancestors); None where there is no limit
    or no cgroup file system (macOS)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    free = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: limits on this group and every ancestor
            folder = root / path.lstrip("/")
            while True:
                try:
                    limit = (folder / "memory.max").read_text().strip()
                    used = int((folder / "memory.current").read_text())
                    if limit != "max":
                        free.append(int(limit) - used)
                except (OSError, ValueError):
                    pass
                if folder == root or root not in folder.parents:
                    break
                folder = folder.parent
        elif "memory" in controllers.split(","):  # cgroup v1
            folder = root / "memory" / path.lstrip("/")
            try:
                limit = int((folder / "memory.limit_in_bytes").read_text())
                used = int((folder / "memory.usage_in_bytes").read_text())
                if limit < 2**60:  # v1 writes a huge number for "no limit"
                    free.append(limit - used)
            except (OSError, ValueError):
                pass
    return max(0, min(free)) // 2**20 if free else None


def available_memory_mb() -> tuple[int, str]:
    """(MB the lessons can still use, where that figure comes from): the least of what the OS
    calls available, the container's limit less its usage, and LABS_MEMORY_MB."""
    found = [(psutil.virtual_memory().available // 2**20, "available memory")]
    cgroup = _cgroup_free_mb()
    if cgroup is not None:
        found.append((cgroup, "the container's memory limit less what it uses"))
    raw = os.environ.get(MEMORY_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) == 0:
            raise ValueError(
                f"{MEMORY_ENV} must be a whole number of MB above 0, got {raw!r}: "
                f"fix or unset {MEMORY_ENV}"
            )
        found.append((int(raw), MEMORY_ENV))
    return min(found)


class NotEnoughMemory(RuntimeError):
    """Starting these processes would run the machine out of memory."""


def check_memory(processes: int, what: str, lower, per_process_mb: int = TF_PROCESS_MB) -> int:
    """Raise NotEnoughMemory unless `processes` TF processes fit in the memory free here;
    return the MB free.

    The message says what `what` needs, what is free, and `lower(fit)`: which setting to lower,
    given how many processes would fit.
    """
    free, source = available_memory_mb()
    need = processes * per_process_mb
    if need > free:
        raise NotEnoughMemory(
            f"{what} needs about {need:,} MB ({processes} TensorFlow processes of about "
            f"{per_process_mb} MB each), but only {free:,} MB is free here ({source}). "
            f"{lower(free // per_process_mb)}, close other notebooks or programs, or run on a "
            "machine with more memory."
        )
    return free
