"""Sample CPU% and resident memory of processes while something runs."""
from __future__ import annotations

import os
import threading
import time

import psutil


class ResourceMonitor:
    """Sample CPU% and RSS of some processes in a background thread.

    Use as a context manager; afterwards `.summary()` gives per-PID average CPU% and
    peak RSS. PIDs that exit while sampled are kept with what was seen of them.
    """

    def __init__(self, pids=None, interval: float = 0.25, children: bool = False):
        self.pids = list(pids) if pids is not None else [os.getpid()]
        self.interval = interval
        self.children = children  # also follow the children of the given PIDs
        self.samples: dict[int, list[tuple[float, float, int]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
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

    def _sample(self):
        now = time.perf_counter()
        for proc in list(self._targets()):
            try:
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)  # since the previous call on this object
                    rss = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self.samples.setdefault(proc.pid, []).append((now, cpu, rss))

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self.t0 = time.perf_counter()
        self._sample()  # primes cpu_percent
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        self.elapsed = time.perf_counter() - self.t0
        return False

    def summary(self) -> dict[int, dict[str, float]]:
        """Per PID: mean CPU% (100 = one full core) and peak RSS in MB."""
        out = {}
        for pid, rows in self.samples.items():
            cpus = [c for _, c, _ in rows[1:]] or [0.0]
            out[pid] = {
                "cpu_percent": sum(cpus) / len(cpus),
                "peak_rss_mb": max(r for _, _, r in rows) / 2**20,
            }
        return out
