"""The PS's watch over its workers: who is alive, who has been heard from, who has finished.

`WorkerWatch` is a part of ps.PSLoop, kept apart because it is its own concern: a thread that
notices a worker process's death (by PID) and tells the PS loop through the loop's own
queues, the worker_timeout of standalone runs, and waiting for every live worker to report
in. It uses the PSLoop's attributes: cfg, res, log, worker_pids, alive, finished, last_heard,
lock, stop_event and timed_out.
"""

from __future__ import annotations

import time

import tensorflow as tf

from helpers.cluster.events import Kind
from helpers.cluster.wire import DEAD, Header


class WorkerWatch:
    """Liveness of the workers, for PSLoop (see the module's docstring)."""

    def _watch_workers(self):
        """Tell the PS loop (through its own queue) when a worker process dies."""
        import psutil

        raw = tf.raw_ops
        while not self.stop_event.wait(0.2):
            if self._silent_too_long():
                return
            for w, pid in self.worker_pids.items():
                with self.lock:
                    if w not in self.alive or w in self.finished:
                        continue
                try:
                    gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    gone = True
                if not gone:
                    continue
                with self.lock:
                    self.alive.discard(w)
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
                        raw.QueueEnqueueV2(handle=handle, components=c)
                    except tf.errors.OpError:
                        pass  # queue already closed at the end of the run

    def _heard(self, worker: int) -> None:
        self.last_heard[worker] = time.monotonic()

    def _silent_too_long(self) -> bool:
        """worker_timeout: with no word from any live worker for that long, close the queues
        so the blocked main loop wakes up, and report it (standalone runs have no launcher)."""
        timeout = self.cfg.worker_timeout
        with self.lock:
            live = self.alive - self.finished
        if not timeout or not live or time.monotonic() - max(self.last_heard.values()) < timeout:
            return False
        self.timed_out = True
        self.log.write(Kind.TIMEOUT, silent_s=timeout, workers=sorted(live))
        for handle in (self.res.grads, self.res.applied, self.res.join, self.res.done):
            tf.raw_ops.QueueCloseV2(handle=handle, cancel_pending_enqueues=True)
        return True

    def _timeout_error(self) -> RuntimeError:
        now = time.monotonic()
        with self.lock:
            live = sorted(self.alive - self.finished)
        heard = ", ".join(f"worker {w} {now - self.last_heard[w]:.0f} s ago" for w in live)
        return RuntimeError(
            f"no message from any worker for worker_timeout={self.cfg.worker_timeout} s "
            f"(last heard: {heard}): a worker host may be down or unreachable, or was never "
            f"started; check the workers' logs, then restart the run (resume=True continues "
            f"from the last checkpoint)"
        )

    def _wait_all(self, queue, seen: set) -> None:
        """Dequeue worker ids from a queue until every live worker is in `seen`."""
        raw = tf.raw_ops
        while True:  # the watcher enqueues the id of a worker that dies, so this ends
            with self.lock:
                if not (self.alive - seen):
                    return
            w = int(raw.QueueDequeueV2(handle=queue, component_types=[tf.int64])[0])
            self._heard(w)
            with self.lock:
                seen.add(w)
