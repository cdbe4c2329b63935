"""The PS's watch over its workers: who is alive, who has been heard from, who has finished.

`WorkerWatch` is an object ps.PSLoop owns, kept apart because it is its own concern: a thread
that notices a worker process's death (by PID) and tells the PS loop through the loop's own
queues, the worker_timeout of standalone runs, and waiting for every live worker to report in
(join, done). The loop talks to it through `start`, `stop`, `heard`, `alive`, `running`,
`wait_joined`, `wait_finished` and `timeout_error`; the state below is the watch's own.
"""

from __future__ import annotations

import threading
import time

import tensorflow as tf

from helpers.cluster.events import Kind
from helpers.cluster.wire import DEAD, Header


class WorkerWatch:
    """Liveness of a run's workers, for the PS loop (see the module's docstring)."""

    def __init__(self, cfg, res, log, worker_pids: dict):
        self.cfg, self.res, self.log = cfg, res, log
        self.worker_pids = {int(k): v for k, v in (worker_pids or {}).items()}
        self._alive = set(cfg.worker_ids)  # not seen dead
        self._finished: set[int] = set()  # reported done
        self._last_heard = {w: time.monotonic() for w in cfg.worker_ids}
        self._lock = threading.Lock()  # the watcher thread changes `_alive`
        self._stopped = threading.Event()
        self._timed_out = False

    # ----------------------------------------------------------- what the PS loop calls
    def start(self) -> None:
        """Start watching the worker processes, in a daemon thread."""
        threading.Thread(target=self._watch_workers, daemon=True).start()

    def stop(self) -> None:
        """Stop watching (the run is over, or failed)."""
        self._stopped.set()

    def heard(self, worker: int) -> None:
        """Note a message from `worker` now (worker_timeout counts from the last one)."""
        self._last_heard[worker] = time.monotonic()

    def alive(self) -> list[int]:
        """The workers not seen dead, in order."""
        with self._lock:
            return sorted(self._alive)

    def running(self) -> list[int]:
        """The workers alive and not yet done, in order."""
        with self._lock:
            return sorted(self._alive - self._finished)

    def wait_joined(self) -> None:
        """Block until every live worker has joined (warmed up)."""
        self._wait_all(self.res.join, set())

    def wait_finished(self) -> None:
        """Block until every live worker has reported done."""
        self._wait_all(self.res.done, self._finished)

    def timeout_error(self) -> RuntimeError | None:
        """The error to raise if worker_timeout closed the queues, else None."""
        if not self._timed_out:
            return None
        now = time.monotonic()
        heard = ", ".join(
            f"worker {w} {now - self._last_heard[w]:.0f} s ago" for w in self.running()
        )
        return RuntimeError(
            f"no message from any worker for worker_timeout={self.cfg.worker_timeout} s "
            f"(last heard: {heard}): a worker host may be down or unreachable, or was never "
            f"started; check the workers' logs, then restart the run (resume=True continues "
            f"from the last checkpoint)"
        )

    # ----------------------------------------------------------- the watcher thread
    def _watch_workers(self):
        """Tell the PS loop (through its own queues) when a worker process dies."""
        import psutil

        while not self._stopped.wait(0.2):
            if self._silent_too_long():
                return
            for w, pid in self.worker_pids.items():
                with self._lock:
                    if w not in self._alive or w in self._finished:
                        continue
                try:
                    gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    gone = True
                if gone:
                    self._dead(w, pid)

    def lost(self, w: int, pid: int | None = None) -> None:
        """The launcher says worker w's process is gone (on another host, where this PS cannot
        see its PID): mark it dead, once, unless it has finished."""
        with self._lock:
            if w not in self._alive or w in self._finished:
                return
        self._dead(w, pid)

    def _dead(self, w: int, pid: int | None) -> None:
        """Mark worker w dead and wake whatever of the PS loop waits for it."""
        with self._lock:
            self._alive.discard(w)
        self.log.write(Kind.DEAD, worker=w, pid=pid)
        header = Header(worker=w, step=-1, version=-1, kind=DEAD)
        comps = [tf.constant(header, tf.int64)] + [
            tf.zeros(shape, dtype) for dtype, shape in self.res.push_spec
        ]
        notices = [
            (self.res.done, [tf.constant(w, tf.int64)]),
            (self.res.join, [tf.constant(w, tf.int64)]),
        ]
        if self.cfg.mode != "async":  # async: no PS loop reads `grads`, none waits
            notices.append((self.res.grads, comps))
        for handle, c in notices:
            try:
                tf.raw_ops.QueueEnqueueV2(handle=handle, components=c)
            except tf.errors.OpError:
                pass  # queue already closed at the end of the run

    def _silent_too_long(self) -> bool:
        """worker_timeout: with no word from any live worker for that long, close the queues
        so the blocked main loop wakes up, and report it (standalone runs have no launcher)."""
        timeout = self.cfg.worker_timeout
        live = self.running()
        if not timeout or not live or time.monotonic() - max(self._last_heard.values()) < timeout:
            return False
        self._timed_out = True
        self.log.write(Kind.TIMEOUT, silent_s=timeout, workers=live)
        for handle in (self.res.grads, self.res.applied, self.res.join, self.res.done):
            tf.raw_ops.QueueCloseV2(handle=handle, cancel_pending_enqueues=True)
        return True

    def _wait_all(self, queue, seen: set) -> None:
        """Dequeue worker ids from a queue until every live worker is in `seen`."""
        while True:  # the watcher enqueues the id of a worker that dies, so this ends
            with self._lock:
                if not (self._alive - seen):
                    return
            w = int(tf.raw_ops.QueueDequeueV2(handle=queue, component_types=[tf.int64])[0])
            self.heard(w)
            with self._lock:
                seen.add(w)
